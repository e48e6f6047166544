package remote

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/miekg/pkcs11"
)

// Every type an argument or a result of a served call has survives the
// wire: a request of C_UnwrapKey's arguments and the nested template of
// hagroup's own call, and a response of every result type.
func TestCodecRoundTrip(t *testing.T) {
	tmpl := []*pkcs11.Attribute{{Type: pkcs11.CKA_LABEL, Value: []byte("k")}, {Type: pkcs11.CKA_VALUE}}
	for _, c := range []struct {
		o  op
		vs []any
	}{
		{opUnwrapKey, []any{pkcs11.SessionHandle(7), []*mech{keyWrapMech(t)}, pkcs11.ObjectHandle(1 << 40), []byte("data"), tmpl}},
		{opCreateObjectNested, []any{pkcs11.SessionHandle(7), tmpl, []nestedAttr{{Type: pkcs11.CKA_UNWRAP_TEMPLATE,
			Attrs: []*pkcs11.Attribute{{Type: pkcs11.CKA_SIGN, Value: []byte{1}}}}}}},
		{opLogin, []any{pkcs11.SessionHandle(7), uint(1<<63 + 5), "1234"}},
		{opGetSlotList, []any{true}},
		{opFindObjects, []any{pkcs11.SessionHandle(7), 99}},
	} {
		e := newFrame()
		e.uint(1)
		e.uint(uint(c.o))
		for _, v := range c.vs {
			e.value(reflect.ValueOf(v))
		}
		d := &decoder{b: frameBody(t, e)}
		if id, o := d.uint(), op(d.uint()); id != 1 || o != c.o {
			t.Fatalf("head %d %v, want 1 %v", id, o, c.o)
		}
		for _, v := range c.vs {
			got := reflect.New(reflect.TypeOf(v)).Elem()
			d.value(got)
			if !reflect.DeepEqual(got.Interface(), v) {
				t.Errorf("%v: %T changed on the wire: got %+v, want %+v", c.o, v, got, v)
			}
		}
		if err := d.end(); err != nil {
			t.Errorf("%v: %v", c.o, err)
		}
	}

	results := []any{
		&response{ID: 9, RV: pkcs11.CKR_ATTRIBUTE_SENSITIVE, Err: "why"},
		pkcs11.ObjectHandle(1), pkcs11.SessionHandle(2), []uint{3, 1 << 33}, []pkcs11.ObjectHandle{4, 5}, true, []byte("out"),
		[]*pkcs11.Attribute{{Type: pkcs11.CKA_CLASS, Value: []byte{3, 0, 0, 0, 0, 0, 0, 0}}},
		[]*pkcs11.Mechanism{{Mechanism: pkcs11.CKM_ECDSA}, {Mechanism: pkcs11.CKM_AES_KEY_WRAP_PAD}},
		pkcs11.Info{CryptokiVersion: pkcs11.Version{Major: 2, Minor: 40}, ManufacturerID: "m", Flags: 1, LibraryDescription: "d", LibraryVersion: pkcs11.Version{Major: 2, Minor: 6}},
		pkcs11.SlotInfo{SlotDescription: "s", ManufacturerID: "m", Flags: 7, HardwareVersion: pkcs11.Version{Major: 1}, FirmwareVersion: pkcs11.Version{Minor: 1}},
		pkcs11.TokenInfo{Label: "l", ManufacturerID: "m", Model: "o", SerialNumber: "n", Flags: 1, MaxSessionCount: 2, SessionCount: 3, MaxRwSessionCount: 4, RwSessionCount: 5, MaxPinLen: 6, MinPinLen: 7, TotalPublicMemory: 8, FreePublicMemory: 9, TotalPrivateMemory: 10, FreePrivateMemory: 11, HardwareVersion: pkcs11.Version{Major: 12}, FirmwareVersion: pkcs11.Version{Minor: 13}, UTCTime: "t"},
		pkcs11.MechanismInfo{MinKeySize: 1, MaxKeySize: 2, Flags: 3},
		pkcs11.SessionInfo{SlotID: 1, State: 2, Flags: 3, DeviceError: 4},
	}
	e := newFrame()
	for _, v := range results {
		e.value(reflect.Indirect(reflect.ValueOf(v)))
	}
	d := &decoder{b: frameBody(t, e)}
	for _, v := range results {
		got := reflect.New(reflect.Indirect(reflect.ValueOf(v)).Type()).Elem()
		d.value(got)
		if want := reflect.Indirect(reflect.ValueOf(v)).Interface(); !reflect.DeepEqual(got.Interface(), want) {
			t.Errorf("%T changed on the wire: got %+v, want %+v", want, got, want)
		}
	}
	if err := d.end(); err != nil {
		t.Fatalf("decode response: %v", err)
	}
}

// keyWrapMech is RSA-AES key wrap with its OAEP parameters, one level of
// structure down, as the client lays it out.
func keyWrapMech(t testing.TB) *mech {
	t.Helper()
	g := &pkcs11.RSAAESKeyWrapParams{AESKeyBits: 256, OAEPParams: pkcs11.OAEPParams{HashAlg: 5, MGF: 2, SourceType: 1, SourceData: []byte("x")}}
	m := mechOut(pkcs11.NewMechanism(pkcs11.CKM_RSA_AES_KEY_WRAP, g))
	if m.refused != nil || m.Form != paramStruct || m.Value.Targets[0].Sub == nil {
		t.Fatalf("RSA-AES key wrap parameters laid out as %+v", m)
	}
	return m
}

// Each form of a mechanism's parameter survives the wire.
func TestCodecParamForms(t *testing.T) {
	for _, m := range []*mech{
		{Type: pkcs11.CKM_AES_CBC, Param: bytes.Repeat([]byte{7}, 16)},
		{Type: pkcs11.CKM_AES_GCM, Form: paramLength, Length: 40},
		keyWrapMech(t),
		mechOut(pkcs11.NewMechanism(pkcs11.CKM_AES_GCM, pkcs11.NewGCMParams([]byte("iv"), nil, 96))),
	} {
		e := newFrame()
		m.encode(e)
		got := new(mech)
		d := &decoder{b: frameBody(t, e)}
		got.decode(d)
		if err := d.end(); err != nil {
			t.Fatalf("decode mechanism 0x%x: %v", m.Type, err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Errorf("mechanism changed on the wire:\n got %+v\nwant %+v", got, m)
		}
	}
}

// An empty output (C_EncryptFinal of CBC_PAD after whole blocks) arrives
// empty and no output arrives nil: the module delivers the one and asks
// again for the other.
func TestCodecEmptyIsNotNil(t *testing.T) {
	for _, c := range []struct {
		name string
		data []byte
	}{{"nil", nil}, {"empty", []byte{}}, {"one byte", []byte{0}}} {
		t.Run(c.name, func(t *testing.T) {
			e := newFrame()
			e.value(reflect.ValueOf(c.data))
			e.value(reflect.ValueOf([]*pkcs11.Attribute{{Type: pkcs11.CKA_LABEL, Value: c.data}}))
			var data []byte
			var attrs []*pkcs11.Attribute
			d := &decoder{b: frameBody(t, e)}
			d.value(reflect.ValueOf(&data).Elem())
			d.value(reflect.ValueOf(&attrs).Elem())
			if err := d.end(); err != nil {
				t.Fatalf("decode: %v", err)
			}
			if (data == nil) != (c.data == nil) || !bytes.Equal(data, c.data) {
				t.Errorf("Data %#v arrived as %#v", c.data, data)
			}
			if v := attrs[0].Value; (v == nil) != (c.data == nil) || !bytes.Equal(v, c.data) {
				t.Errorf("attribute value %#v arrived as %#v", c.data, v)
			}
		})
	}
}

// frameBody returns e's frame without its header, checking the header.
func frameBody(t *testing.T, e *encoder) []byte {
	t.Helper()
	b, err := e.frame()
	if err != nil {
		t.Fatal(err)
	}
	if n := binary.BigEndian.Uint32(b); int(n) != len(b)-frameHeader {
		t.Fatalf("header says %d bytes, frame holds %d", n, len(b)-frameHeader)
	}
	return b[frameHeader:]
}

// countingReader counts what is read from it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// A frame header over MaxFrame is refused before its body is read (the
// reader holds nothing of it); one at MaxFrame is read.
func TestFrameBound(t *testing.T) {
	for _, c := range []struct {
		name string
		n    uint32
		err  string
	}{
		{"one byte over", MaxFrame + 1, "frame of 16777217 bytes exceeds the 16777216-byte bound"},
		{"4 GiB", 1<<32 - 1, "exceeds the 16777216-byte bound"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cr := &countingReader{r: io.MultiReader(bytes.NewReader(binary.BigEndian.AppendUint32(nil, c.n)), zeros{})}
			_, err := readFrame(cr)
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Fatalf("readFrame: %v, want %q", err, c.err)
			}
			if cr.n != frameHeader {
				t.Errorf("read %d bytes, want only the %d of the header", cr.n, frameHeader)
			}
		})
	}
	b, err := readFrame(io.MultiReader(bytes.NewReader(binary.BigEndian.AppendUint32(nil, MaxFrame)), zeros{}))
	if err != nil || len(b) != MaxFrame {
		t.Fatalf("a frame of MaxFrame bytes: %d bytes, %v", len(b), err)
	}
	e := newFrame()
	e.bytes(make([]byte, MaxFrame))
	if _, err := e.frame(); err == nil || !strings.Contains(err.Error(), "exceeds the 16777216-byte bound") {
		t.Errorf("encoding a frame over MaxFrame: %v, want a refusal", err)
	}
}

// zeros reads as an endless stream of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// Counts over their bound, or longer than what is left of the frame, and
// trailing bytes are errors; nothing is allocated for them.
func TestDecoderBounds(t *testing.T) {
	uv := func(vs ...uint64) []byte {
		var b []byte
		for _, v := range vs {
			b = binary.AppendUvarint(b, v)
		}
		return b
	}
	// C_CreateObject's head, then its session; the template follows.
	head := uv(1, uint64(opCreateObject), 0)
	nested := uv(1, uint64(opCreateObjectNested), 0)
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	for _, c := range []struct {
		name string
		body []byte
		err  string
	}{
		{"attributes over the bound", cat(head, uv(MaxAttributes+1), make([]byte, 4096)), "1025 attributes exceed the bound of 1024"},
		{"attributes beyond the frame", cat(head, uv(1000), uv(1, 0)), errShort.Error()},
		{"attribute value beyond the frame", cat(head, uv(1, pkcs11.CKA_VALUE, 1<<30), []byte("abc")), errShort.Error()},
		{"a billion attributes", cat(head, uv(1<<30)), "1073741824 attributes exceed the bound of 1024"},
		{"attribute arrays over the bound", cat(nested, uv(0, MaxNested+1), make([]byte, 64)), "9 attribute arrays exceed the bound of 8"},
		{"nested attributes over the bound", cat(nested, uv(0, 1, pkcs11.CKA_UNWRAP_TEMPLATE, MaxAttributes+1), make([]byte, 4096)), "1025 attributes exceed the bound of 1024"},
		{"a billion mechanisms", cat(uv(1, uint64(opSignInit), 0, 1<<30), make([]byte, 64)), "1073741824 mechanisms exceed the bound of 65536"},
		{"truncated number", cat(head[:2], []byte{0x80}), errShort.Error()},
		{"trailing bytes", cat(head, uv(0), []byte{7}), "1 bytes after the value"},
		{"bad boolean", cat(uv(1, uint64(opGetSlotList)), []byte{2}), "boolean byte 2"},
		{"a count past the largest int", cat(uv(1, uint64(opGenerateRandom), 0, 1<<63)), "a count of 9223372036854775808"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := &decoder{b: c.body}
			d.uint()
			f, err := op(d.uint()).function()
			if err != nil {
				t.Fatal(err)
			}
			_, in := f.args(d)
			err = d.end()
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Fatalf("decode: %v, want %q", err, c.err)
			}
			for _, v := range in {
				if as, ok := v.Interface().([]*pkcs11.Attribute); ok && as != nil {
					t.Errorf("decoded %d attributes from a refused frame", len(as))
				}
			}
		})
	}
	var r response
	d := &decoder{b: cat(uv(1, 0), uv(0), uv(MaxHandles+1), make([]byte, 16))}
	r.decode(d)
	var ids []uint
	d.value(reflect.ValueOf(&ids).Elem())
	if err := d.end(); err == nil || !strings.Contains(err.Error(), "65537 handles exceed the bound of 65536") || ids != nil {
		t.Errorf("a response with too many handles: %v, %d decoded", err, len(ids))
	}
	if !errors.Is(errArgumentsBad, pkcs11.Error(pkcs11.CKR_ARGUMENTS_BAD)) {
		t.Errorf("errArgumentsBad is %v", errArgumentsBad)
	}
}

// FuzzRequest: whatever a peer sends, the server's decoder ends in a
// request or an error without reading past the frame, a request it
// accepts encodes back to the same request, and a mechanism parameter it
// accepts rebuilds in C memory without a read or write out of bounds.
func FuzzRequest(f *testing.F) {
	for _, m := range []*mech{
		{Type: pkcs11.CKM_AES_CBC, Param: bytes.Repeat([]byte{7}, 16)},
		{Type: pkcs11.CKM_AES_GCM, Form: paramLength, Length: 40},
		keyWrapMech(f),
		mechOut(pkcs11.NewMechanism(pkcs11.CKM_AES_GCM, pkcs11.NewGCMParams([]byte("iv"), []byte("aad"), 96))),
		mechOut(pkcs11.NewMechanism(pkcs11.CKM_ECDH1_DERIVE, pkcs11.NewECDH1DeriveParams(1, nil, []byte("pub")))),
	} {
		e := &encoder{}
		for _, v := range []any{uint(1), opDeriveKey, pkcs11.SessionHandle(2), []*mech{m}, pkcs11.ObjectHandle(3),
			[]*pkcs11.Attribute{{Type: pkcs11.CKA_LABEL, Value: []byte("k")}}} {
			e.value(reflect.ValueOf(v))
		}
		f.Add(e.b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		decode := func(b []byte) (op, []reflect.Value, error) {
			d := &decoder{b: b}
			d.uint()
			o := op(d.uint())
			fn, err := o.function()
			if d.err != nil || err != nil {
				return o, nil, errors.Join(d.err, err)
			}
			_, in := fn.args(d)
			return o, in, d.end()
		}
		o, in, err := decode(b)
		if err != nil {
			return
		}
		e := &encoder{}
		e.uint(1)
		e.uint(uint(o))
		for _, v := range in {
			e.value(v)
		}
		if _, back, err := decode(e.b); err != nil || !reflect.DeepEqual(values(back), values(in)) {
			t.Fatalf("an accepted request does not survive the wire again: %v\n got %+v\nwant %+v", err, values(back), values(in))
		}
		for _, v := range in {
			ws, ok := v.Interface().([]*mech)
			if !ok || len(ws) != 1 {
				continue
			}
			if ms, free, err := mechIn(ws[0]); err == nil {
				if ws[0].Form == paramStruct && len(ms[0].Parameter) != ws[0].Value.Layout.Size {
					t.Fatalf("a %s rebuilt in %d bytes", ws[0].Value.Layout.Name, len(ms[0].Parameter))
				}
				free()
			}
		}
	})
}

// values are vs as they hold.
func values(vs []reflect.Value) []any {
	out := make([]any, len(vs))
	for i, v := range vs {
		out[i] = v.Interface()
	}
	return out
}
