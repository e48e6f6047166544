package remote_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"net"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/remote"
	"github.com/miekg/pkcs11"
)

// rawConn speaks the protocol by hand to a served token, as an attacker
// (a process of the server's own user) could.
type rawConn struct {
	t  *testing.T
	nc net.Conn
	r  *bufio.Reader
	id uint64
}

func dialRaw(t *testing.T, srv *testhsm.Served) *rawConn {
	t.Helper()
	sock, err := remote.ParseModulePath(srv.Token().Module)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := net.DialTimeout("unix", sock, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &rawConn{t: t, nc: nc, r: bufio.NewReader(nc)}
	c.send(remote.Hello())
	if _, err := remote.ReadFrame(c.r); err != nil {
		t.Fatalf("welcome: %v", err)
	}
	return c
}

func (c *rawConn) send(body []byte) {
	c.t.Helper()
	_ = c.nc.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.nc.Write(frame(body)); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

// call sends a request and returns its reply; the connection must answer.
func (c *rawConn) call(o string, slot, session, object, n uint, mechWire []byte, attrs []*pkcs11.Attribute) *remote.Reply {
	c.t.Helper()
	c.id++
	c.send(remote.Request(c.id, remote.Ops[o], slot, session, object, n, mechWire, attrs))
	r, err := remote.ReadReply(c.r, remote.Ops[o])
	if err != nil {
		c.t.Fatalf("%s: no reply: %v (the server's process for this connection died?)", o, err)
	}
	return r
}

// A client that lies in a mechanism's parameter (a length field that
// says more or less than the bytes that came, a structure of another
// size, a length form over the frame, a structure for a mechanism that
// takes none, raw bytes where pointers would be, the encoding cut at each
// byte, each word of the structure a lie) gets a clean error or the
// answer of the bytes it sent, never a read behind them, and its
// connection goes on serving.
func TestParamLies(t *testing.T) {
	c, sh := rawSession(t, "lies")
	paramLies(t, c, sh)
}

// A PKCS#11 function a member never needs answers
// CKR_FUNCTION_NOT_SUPPORTED, a number past every op a clean error
// naming it, and a call without its mechanism CKR_ARGUMENTS_BAD; the
// connection goes on.
func TestUnservedOps(t *testing.T) {
	c, sh := rawSession(t, "unserved")
	if r := c.call("SetOperationState", 0, sh, 0, 0, nil, nil); r.RV != pkcs11.CKR_FUNCTION_NOT_SUPPORTED || r.Err != "C_SetOperationState is not served" {
		t.Errorf("C_SetOperationState: %+v, want CKR_FUNCTION_NOT_SUPPORTED naming it", r)
	}
	if r := c.call("past the last", 0, sh, 0, 0, nil, nil); r.RV != pkcs11.CKR_GENERAL_ERROR || !strings.Contains(r.Err, "unknown operation") {
		t.Errorf("an op past the last: %+v, want CKR_GENERAL_ERROR naming an unknown operation", r)
	}
	// A call that takes a mechanism gets exactly one: miekg would panic
	// on none, and take the process serving the connection with it.
	if r := c.call("DeriveKey", 0, sh, 0, 0, nil, nil); r.RV != pkcs11.CKR_ARGUMENTS_BAD || !strings.Contains(r.Err, "0 mechanisms, not one") {
		t.Errorf("C_DeriveKey without a mechanism: %+v, want CKR_ARGUMENTS_BAD saying so", r)
	}
	if r := c.call("GenerateRandom", 0, sh, 0, 8, nil, nil); r.RV != 0 {
		t.Errorf("the connection after them: GenerateRandom rv 0x%x", r.RV)
	}
}

// rawSession connects by hand to a new served token and opens a session
// logged in as the user.
func rawSession(t *testing.T, name string) (*rawConn, uint) {
	t.Helper()
	srv := testhsm.ServeRemote(t, name)
	c := dialRaw(t, srv)
	slots := c.call("GetSlotList", 0, 0, 0, 1, nil, nil)
	if slots.RV != 0 || len(slots.Handles) != 1 {
		t.Fatalf("GetSlotList: %+v", slots)
	}
	sess := c.call("OpenSession", slots.Handles[0], 0, 0, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION, nil, nil)
	if sess.RV != 0 {
		t.Fatalf("OpenSession: %+v", sess)
	}
	sh := sess.Handle
	c.id++
	c.send(remote.Login(c.id, sh, srv.Token().UserPIN))
	if r, err := remote.ReadReply(c.r, remote.Ops["Login"]); err != nil || r.RV != 0 {
		t.Fatalf("Login: %+v, %v", r, err)
	}
	return c, sh
}

// paramLies is TestParamLies past its session.
func paramLies(t *testing.T, c *rawConn, sh uint) {
	base := c.call("CreateObject", 0, sh, 0, 0, nil, []*pkcs11.Attribute{
		attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
		attr(pkcs11.CKA_TOKEN, false), attr(pkcs11.CKA_DERIVE, true), attr(pkcs11.CKA_VALUE, bytes.Repeat([]byte{7}, 16))})
	if base.RV != 0 {
		t.Fatalf("CreateObject: %+v", base)
	}
	tmpl := []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
		attr(pkcs11.CKA_VALUE_LEN, 16), attr(pkcs11.CKA_TOKEN, false), attr(pkcs11.CKA_SENSITIVE, false), attr(pkcs11.CKA_EXTRACTABLE, true)}
	// derive answers the derivation's code and the derived key's value.
	derive := func(mechWire []byte) (uint, []byte) {
		t.Helper()
		r := c.call("DeriveKey", 0, sh, base.Handle, 0, mechWire, tmpl)
		if r.RV != 0 {
			return r.RV, nil
		}
		v := c.call("GetAttributeValue", 0, sh, r.Handle, 0, nil, []*pkcs11.Attribute{{Type: pkcs11.CKA_VALUE}})
		if v.RV != 0 || len(v.Attrs) != 1 {
			t.Fatalf("GetAttributeValue of the derived key: %+v", v)
		}
		return 0, v.Attrs[0].Value
	}
	data := derivationData
	honest, err := remote.MechWire(ecbData(data, uint64(len(data))))
	if err != nil {
		t.Fatal(err)
	}
	rv, want := derive(honest)
	if rv != 0 || len(want) != 16 {
		t.Fatalf("honest derivation by data: rv 0x%x, value %x", rv, want)
	}
	// The structure's words lie, its length field above all: the 16
	// bytes that came are used, and the pointer is the server's own.
	lenAt := bytes.Index(honest, binary.NativeEndian.AppendUint64(nil, 16))
	if lenAt < 8 {
		t.Fatal("the length field is not in the encoding")
	}
	for _, word := range []int{lenAt, lenAt - 8} {
		for _, lie := range []uint64{0, 1, 15, 17, 1 << 20, 1<<64 - 1} {
			w := bytes.Clone(honest)
			binary.NativeEndian.PutUint64(w[word:], lie)
			if rv, got := derive(w); rv != 0 || !bytes.Equal(got, want) {
				t.Errorf("word at %d says %d over 16 bytes: rv 0x%x, value %x; want the honest %x", word, lie, rv, got, want)
			}
		}
	}

	ecb := binary.AppendUvarint(nil, pkcs11.CKM_AES_ECB_ENCRYPT_DATA)
	sha := binary.AppendUvarint(nil, pkcs11.CKM_SHA256)
	for _, bad := range []struct {
		name string
		wire []byte
		rv   uint
	}{
		{"a structure of 15 bytes", cat(ecb, uv(1, 16), make([]byte, 15), uv(17), data), pkcs11.CKR_ARGUMENTS_BAD},
		{"a structure of 17 bytes", cat(ecb, uv(1, 18), make([]byte, 17), uv(17), data), pkcs11.CKR_ARGUMENTS_BAD},
		{"bytes that end before the length field says", cat(ecb, uv(1, 17), make([]byte, 16), uv(1<<30)), pkcs11.CKR_ARGUMENTS_BAD},
		{"a length form over its bound", cat(ecb, uv(2, 1<<16+1)), pkcs11.CKR_ARGUMENTS_BAD},
		{"a length form of 2^40", cat(ecb, uv(2, 1<<40)), pkcs11.CKR_ARGUMENTS_BAD},
		{"a length form of the structure's own size", cat(ecb, uv(2, 16)), pkcs11.CKR_ARGUMENTS_BAD},
		{"a length form for a flat parameter", cat(sha, uv(2, 3)), pkcs11.CKR_ARGUMENTS_BAD},
		{"a structure for a mechanism that takes none", cat(sha, uv(1, 17), make([]byte, 16), uv(17), data), pkcs11.CKR_ARGUMENTS_BAD},
		{"a structure for a refused layout", cat(binary.AppendUvarint(nil, pkcs11.CKM_TLS_PRF), uv(1, 49), make([]byte, 48)), pkcs11.CKR_ARGUMENTS_BAD},
		{"raw bytes where pointers would be", cat(ecb, uv(0, 17), honest[len(honest)-16:]), pkcs11.CKR_MECHANISM_PARAM_INVALID},
		{"an unknown form", cat(ecb, uv(9)), pkcs11.CKR_ARGUMENTS_BAD},
	} {
		if rv, _ := derive(bad.wire); rv != bad.rv {
			t.Errorf("%s: rv 0x%x, want 0x%x", bad.name, rv, bad.rv)
		}
	}

	// The honest encoding cut at each byte: the request ends inside a
	// value, or what follows is misread; either way a clean refusal.
	for cut := 0; cut < len(honest); cut++ {
		c.id++
		body := remote.Request(c.id, remote.Ops["DeriveKey"], 0, sh, base.Handle, 0, honest, tmpl)
		mechAt := bytes.Index(body, honest)
		c.send(body[:mechAt+cut])
		r, err := remote.ReadReply(c.r, remote.Ops["DeriveKey"])
		if err != nil {
			t.Fatalf("cut at byte %d: no reply: %v", cut, err)
		}
		if r.RV != pkcs11.CKR_ARGUMENTS_BAD {
			t.Errorf("cut at byte %d: rv 0x%x, want CKR_ARGUMENTS_BAD", cut, r.RV)
		}
	}
	if r := c.call("GenerateRandom", 0, sh, 0, 8, nil, nil); r.RV != 0 {
		t.Errorf("the connection after the lies: GenerateRandom rv 0x%x", r.RV)
	}
}

// ecbData is CKM_AES_ECB_ENCRYPT_DATA over data, its length field n, as a
// C application hands it (pointers valid in this process).
func ecbData(data []byte, n uint64) *pkcs11.Mechanism {
	raw := binary.NativeEndian.AppendUint64(nil, uint64(addressOf(data)))
	raw = binary.NativeEndian.AppendUint64(raw, n)
	return &pkcs11.Mechanism{Mechanism: pkcs11.CKM_AES_ECB_ENCRYPT_DATA, Parameter: raw}
}

// derivationData is a global: a C-style structure points at it, and a
// global does not move.
var derivationData = []byte("derivation data!")

func addressOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
