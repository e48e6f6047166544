package remote

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"

	"github.com/hagroup/hagroup/internal/mechparam"
	"github.com/miekg/pkcs11"
)

// Bounds of the protocol, checked by whoever reads: the server on
// requests, the client on responses. Each is a limit on what one frame
// can make its reader hold, so a hostile or broken peer cannot make the
// other side grow.
const (
	// MaxFrame is the largest frame (one request or response) either
	// side reads or writes: the header of a larger one ends the
	// connection before its body is read; a request the client cannot
	// fit in it fails with CKR_ARGUMENTS_BAD before it is sent.
	MaxFrame = 16 << 20
	// MaxAttributes bounds the attributes of one template or one
	// attribute array, and MaxNested the attribute arrays (CKA_WRAP_
	// TEMPLATE, …) of one template; an attribute array holds no arrays.
	MaxAttributes = 1024
	MaxNested     = 8
	// MaxHandles bounds a list of handles or mechanisms, and so
	// C_FindObjects' count.
	MaxHandles = 1 << 16
	// MaxRandom bounds C_GenerateRandom's length.
	MaxRandom = 1 << 20
)

// frameHeader is the size of a frame's big-endian length.
const frameHeader = 4

// errArgumentsBad answers a request that breaks a bound.
var errArgumentsBad = pkcs11.Error(pkcs11.CKR_ARGUMENTS_BAD)

// readFrame reads one frame of at most MaxFrame bytes; a larger header
// is an error and nothing more is read.
func readFrame(r io.Reader) ([]byte, error) {
	n, err := readHeader(r)
	if err != nil {
		return nil, err
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("read a frame of %d bytes: %w", n, err)
	}
	return b, nil
}

// readHeader reads a frame header and checks it against MaxFrame.
func readHeader(r io.Reader) (int, error) {
	var h [frameHeader]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, err
	}
	n := binary.BigEndian.Uint32(h[:])
	if n > MaxFrame {
		return 0, fmt.Errorf("frame of %d bytes exceeds the %d-byte bound", n, MaxFrame)
	}
	return int(n), nil
}

// newFrame returns an encoder whose buffer starts with room for the
// frame header.
func newFrame() *encoder { return &encoder{b: make([]byte, frameHeader, 256)} }

// frame returns the frame, header set, or an error when it exceeds
// MaxFrame.
func (e *encoder) frame() ([]byte, error) {
	n := len(e.b) - frameHeader
	if n > MaxFrame {
		return nil, fmt.Errorf("frame of %d bytes exceeds the %d-byte bound", n, MaxFrame)
	}
	binary.BigEndian.PutUint32(e.b, uint32(n))
	return e.b, nil
}

// encoder appends values: unsigned integers as uvarints, strings as a
// length and the bytes, byte strings as 0 for nil or 1 + length and the
// bytes, so that an empty output (a C_EncryptFinal of CBC_PAD with nothing
// left) arrives empty, not as no output. Its first failure sticks: the
// frame is not sent.
type encoder struct {
	b   []byte
	err error
}

func (e *encoder) fail(err error) {
	if e.err == nil {
		e.err = err
	}
}

func (e *encoder) uint(v uint)     { e.b = binary.AppendUvarint(e.b, uint64(v)) }
func (e *encoder) string(s string) { e.uint(uint(len(s))); e.b = append(e.b, s...) }

func (e *encoder) bytes(p []byte) {
	if p == nil {
		e.uint(0)
		return
	}
	e.uint(uint(len(p)) + 1)
	e.b = append(e.b, p...)
}

func (e *encoder) bool(v bool) {
	if v {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}

func (e *encoder) attrs(as []*pkcs11.Attribute) {
	e.uint(uint(len(as)))
	for _, a := range as {
		if a == nil {
			e.fail(fmt.Errorf("a nil attribute cannot be sent: %w", errArgumentsBad))
			return
		}
		e.uint(a.Type)
		e.bytes(a.Value)
	}
}

// decoder reads what encoder wrote from one frame. The first error
// sticks and every later read returns zero; byte strings alias the
// frame.
type decoder struct {
	b   []byte
	err error
}

var errShort = errors.New("frame ends inside a value")

func (d *decoder) fail(err error) {
	if d.err == nil {
		d.err = err
	}
	d.b = nil
}

func (d *decoder) uint() uint {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail(errShort)
		return 0
	}
	d.b = d.b[n:]
	return uint(v)
}

func (d *decoder) bool() bool {
	if len(d.b) == 0 {
		d.fail(errShort)
		return false
	}
	v := d.b[0]
	d.b = d.b[1:]
	if v > 1 {
		d.fail(fmt.Errorf("boolean byte %d", v))
	}
	return v == 1
}

// bytes returns a byte string: nil, or empty, as it was encoded.
func (d *decoder) bytes() []byte {
	n := d.uint()
	if n == 0 {
		return nil
	}
	n--
	if n > uint(len(d.b)) {
		d.fail(errShort)
		return nil
	}
	if n == 0 {
		return []byte{}
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

func (d *decoder) string() string {
	n := d.uint()
	if n > uint(len(d.b)) {
		d.fail(errShort)
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// count reads the length of a list of at most max elements, each at
// least one byte long.
func (d *decoder) count(max int, what string) int {
	n := d.uint()
	switch {
	case d.err != nil:
		return 0
	case n > uint(max):
		d.fail(fmt.Errorf("%d %s exceed the bound of %d", n, what, max))
		return 0
	case n > uint(len(d.b)):
		d.fail(errShort)
		return 0
	}
	return int(n)
}

func (d *decoder) attrs() []*pkcs11.Attribute {
	n := d.count(MaxAttributes, "attributes")
	if n == 0 {
		return nil
	}
	as := make([]*pkcs11.Attribute, n)
	for i := range as {
		as[i] = &pkcs11.Attribute{Type: d.uint(), Value: d.bytes()}
	}
	if d.err != nil {
		return nil
	}
	return as
}

// end reports the first error, or bytes left over after the value.
func (d *decoder) end() error {
	if d.err == nil && len(d.b) > 0 {
		d.err = fmt.Errorf("%d bytes after the value", len(d.b))
	}
	return d.err
}

// present writes whether a pointer field is set.
func present[T any](e *encoder, p *T) bool {
	e.bool(p != nil)
	return p != nil
}

// value writes v by its type: a number as a uvarint (a byte as itself), a
// string, a byte string, a boolean, a list of numbers, a template, a list
// of attribute arrays, mechanisms (mech.encode), a structure field by
// field. A value the wire cannot carry (a nil attribute, a negative
// count, a mechanism whose parameter cannot cross) fails the encoder.
func (e *encoder) value(v reflect.Value) {
	switch x := v.Interface().(type) {
	case []byte:
		e.bytes(x)
	case []*pkcs11.Attribute:
		e.attrs(x)
	case []nestedAttr:
		e.uint(uint(len(x)))
		for _, n := range x {
			e.value(reflect.ValueOf(n))
		}
	case []*pkcs11.Mechanism:
		ws := make([]*mech, len(x))
		for i, m := range x {
			if m == nil {
				e.fail(fmt.Errorf("a nil mechanism cannot be sent: %w", errArgumentsBad))
				return
			}
			ws[i] = mechOut(m)
		}
		e.value(reflect.ValueOf(ws))
	case []*mech:
		e.uint(uint(len(x)))
		for _, m := range x {
			e.fail(m.refused)
			m.encode(e)
		}
	case byte:
		e.b = append(e.b, x)
	case string:
		e.string(x)
	case bool:
		e.bool(x)
	case int:
		if x < 0 {
			e.fail(fmt.Errorf("a negative count: %w", errArgumentsBad))
		}
		e.uint(uint(x))
	default:
		switch v.Kind() {
		case reflect.Slice: // of numbers
			e.uint(uint(v.Len()))
			for i := range v.Len() {
				e.uint(uint(v.Index(i).Uint()))
			}
		case reflect.Struct:
			for i := range v.NumField() {
				e.value(v.Field(i))
			}
		default:
			e.uint(uint(v.Uint()))
		}
	}
}

// value reads into v, addressable, what encoder.value wrote, checking
// every count against its bound. Mechanisms read as []*mech are the wire's
// (the server rebuilds them, mechIn); as []*pkcs11.Mechanism, their types
// (C_GetMechanismList's).
func (d *decoder) value(v reflect.Value) {
	switch p := v.Addr().Interface().(type) {
	case *[]byte:
		*p = d.bytes()
	case *[]*pkcs11.Attribute:
		*p = d.attrs()
	case *[]nestedAttr:
		if n := d.count(MaxNested, "attribute arrays"); n > 0 {
			*p = make([]nestedAttr, n)
			for i := range *p {
				d.value(reflect.ValueOf(&(*p)[i]).Elem())
			}
		}
	case *[]*mech:
		if n := d.count(MaxHandles, "mechanisms"); n > 0 {
			*p = make([]*mech, n)
			for i := range *p {
				(*p)[i] = new(mech)
				(*p)[i].decode(d)
			}
		}
	case *[]*pkcs11.Mechanism:
		var ws []*mech
		d.value(reflect.ValueOf(&ws).Elem())
		for _, w := range ws {
			*p = append(*p, &pkcs11.Mechanism{Mechanism: w.Type, Parameter: w.Param})
		}
	case *byte:
		if len(d.b) == 0 {
			d.fail(errShort)
			return
		}
		*p, d.b = d.b[0], d.b[1:]
	case *string:
		*p = d.string()
	case *bool:
		*p = d.bool()
	case *int:
		if n := d.uint(); n > math.MaxInt {
			d.fail(fmt.Errorf("a count of %d", n))
		} else {
			*p = int(n)
		}
	default:
		switch v.Kind() {
		case reflect.Slice: // of numbers
			if n := d.count(MaxHandles, "handles"); n > 0 {
				v.Set(reflect.MakeSlice(v.Type(), n, n))
				for i := range n {
					v.Index(i).SetUint(uint64(d.uint()))
				}
			}
		case reflect.Struct:
			for i := range v.NumField() {
				d.value(v.Field(i))
			}
		default:
			v.SetUint(uint64(d.uint()))
		}
	}
}

// The messages, field by field in their order (value). A reader checks
// every count and length against the bounds and the bytes left in the
// frame before it allocates.

func (h *hello) encode(e *encoder)    { e.value(reflect.ValueOf(h).Elem()) }
func (h *hello) decode(d *decoder)    { d.value(reflect.ValueOf(h).Elem()) }
func (w *welcome) encode(e *encoder)  { e.value(reflect.ValueOf(w).Elem()) }
func (w *welcome) decode(d *decoder)  { d.value(reflect.ValueOf(w).Elem()) }
func (r *response) encode(e *encoder) { e.value(reflect.ValueOf(r).Elem()) }
func (r *response) decode(d *decoder) { d.value(reflect.ValueOf(r).Elem()) }

// signature returns the types of f's arguments (after its receiver) and
// of its results (before the error).
func (f function) signature() (args, results []reflect.Type) {
	t := reflect.TypeOf(f.run)
	for i := 1; i < t.NumIn(); i++ {
		args = append(args, t.In(i))
	}
	for i := range t.NumOut() - 1 {
		results = append(results, t.Out(i))
	}
	return args, results
}

func (m *mech) encode(e *encoder) {
	e.uint(m.Type)
	e.uint(uint(m.Form))
	switch m.Form {
	case paramBytes:
		e.bytes(m.Param)
	case paramLength:
		e.uint(m.Length)
	case paramStruct:
		encodeValue(e, m.Value)
	}
}

// encodeValue writes a parameter structure and then, in the order of its
// layout, what each pointer points at.
func encodeValue(e *encoder, v *mechparam.Value) {
	e.bytes(v.Struct)
	for i, p := range v.Layout.Ptrs {
		t := v.Targets[i]
		if p.To != nil {
			if present(e, t.Sub) {
				encodeValue(e, t.Sub)
			}
			continue
		}
		e.bytes(t.Bytes)
		if t.Bytes == nil {
			e.uint(t.NullLen)
		}
	}
}

func (m *mech) decode(d *decoder) {
	m.Type = d.uint()
	m.Form = paramForm(d.uint())
	switch m.Form {
	case paramBytes:
		m.Param = d.bytes()
	case paramLength:
		if m.Length = d.uint(); m.Length > maxParamLength {
			d.fail(fmt.Errorf("a parameter length of %d exceeds the bound of %d", m.Length, maxParamLength))
		}
	case paramStruct:
		// Read by the layout the mechanism takes, never one the peer names.
		l := mechparam.For(m.Type)
		if l == nil || l.Refused != "" {
			d.fail(fmt.Errorf("mechanism 0x%x takes no parameter structure that crosses", m.Type))
			return
		}
		m.Value = decodeValue(d, l, 0)
	default:
		d.fail(fmt.Errorf("parameter form %d", m.Form))
	}
}

// decodeValue reads a structure of layout l: its bytes must be l's size,
// and each pointer's target is what arrived for it.
func decodeValue(d *decoder, l *mechparam.Layout, depth int) *mechparam.Value {
	if depth > maxParamDepth {
		d.fail(fmt.Errorf("%s nested deeper than %d", l.Name, maxParamDepth))
		return nil
	}
	v := &mechparam.Value{Layout: l, Struct: d.bytes(), Targets: make([]mechparam.Target, len(l.Ptrs))}
	if d.err == nil && len(v.Struct) != l.Size {
		d.fail(fmt.Errorf("%s of %d bytes, not %d", l.Name, len(v.Struct), l.Size))
	}
	for i, p := range l.Ptrs {
		if d.err != nil {
			return nil
		}
		t := &v.Targets[i]
		if p.To != nil {
			if d.bool() {
				t.Sub = decodeValue(d, p.To, depth+1)
			}
			continue
		}
		if t.Bytes = d.bytes(); t.Bytes == nil {
			t.NullLen = d.uint()
		}
	}
	if d.err != nil {
		return nil
	}
	return v
}
