package remote_test

import (
	"encoding/binary"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/remote"
	"github.com/miekg/pkcs11"
)

// connect returns an initialised client of the served token and a fresh
// session on its one slot.
func connect(t *testing.T, srv *testhsm.Served) (*remote.Client, pkcs11.SessionHandle) {
	t.Helper()
	c, err := remote.NewClient(srv.Token().Module, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Finalize() })
	ids, err := c.GetSlotList(true)
	if err != nil || len(ids) != 1 {
		t.Fatalf("GetSlotList: %v, %v", ids, err)
	}
	sh, err := c.OpenSession(ids[0], pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		t.Fatal(err)
	}
	return c, sh
}

// Each bound fails its request alone with CKR_ARGUMENTS_BAD and a reason,
// and the connection serves the next call: a request over MaxFrame is not
// sent (the client refuses it), a template over MaxAttributes and a
// C_GenerateRandom over MaxRandom are refused by the server.
func TestBoundsFailOneRequest(t *testing.T) {
	srv := testhsm.ServeRemote(t, "bounds")
	c, sh := connect(t, srv)
	if err := c.DigestInit(sh, []*pkcs11.Mechanism{pkcs11.NewMechanism(pkcs11.CKM_SHA256, nil)}); err != nil {
		t.Fatal(err)
	}
	_, err := c.Digest(sh, make([]byte, remote.MaxFrame+1))
	wantBound(t, "Digest of MaxFrame+1 bytes", err, "exceeds the 16777216-byte bound")
	// Not sent: the digest begun is still there for the next part.
	if d, err := c.Digest(sh, []byte("abc")); err != nil || len(d) != 32 {
		t.Errorf("Digest after the refused one: %x, %v", d, err)
	}

	tmpl := make([]*pkcs11.Attribute, remote.MaxAttributes+1)
	for i := range tmpl {
		tmpl[i] = pkcs11.NewAttribute(pkcs11.CKA_LABEL, "x")
	}
	_, err = c.CreateObject(sh, tmpl)
	wantBound(t, "CreateObject with MaxAttributes+1 attributes", err, "1025 attributes exceed the bound of 1024")

	_, err = c.GenerateRandom(sh, remote.MaxRandom+1)
	wantBound(t, "GenerateRandom(MaxRandom+1)", err, "C_GenerateRandom of 1048577 bytes exceeds the bound of 1048576")
	if b, err := c.GenerateRandom(sh, remote.MaxRandom); err != nil || len(b) != remote.MaxRandom {
		t.Errorf("GenerateRandom(MaxRandom): %d bytes, %v", len(b), err)
	}
}

func wantBound(t *testing.T, what string, err error, why string) {
	t.Helper()
	if !errors.Is(err, pkcs11.Error(pkcs11.CKR_ARGUMENTS_BAD)) || !strings.Contains(err.Error(), why) {
		t.Errorf("%s: %v, want CKR_ARGUMENTS_BAD saying %q", what, err, why)
	}
}

// A hostile server cannot make the client hold more than a frame: a
// response header over MaxFrame, or a response counting more slot IDs
// than the bound, ends the connection (CKR_DEVICE_ERROR) without the
// client reading or allocating the rest.
func TestClientBoundsResponses(t *testing.T) {
	for _, c := range []struct {
		name  string
		reply []byte
	}{
		{"frame header of 1 GiB", binary.BigEndian.AppendUint32(nil, 1<<30)},
		{"a billion slot IDs", frame(uv(1, 0, 0, 1<<30))},
	} {
		t.Run(c.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "hostile.sock")
			l, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			go func() {
				nc, err := l.Accept()
				if err != nil {
					return
				}
				defer nc.Close()
				buf := make([]byte, 4096)
				nc.Read(buf) // the hello
				nc.Write(frame(uv(remote.ProtocolVersion, 0)))
				nc.Read(buf) // the request
				nc.Write(c.reply)
				// Hold the connection: a client waiting for a body would hang.
				nc.SetReadDeadline(time.Now().Add(30 * time.Second))
				nc.Read(buf)
			}()
			cl, err := remote.NewClient(remote.ModulePath(sock), nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := cl.Initialize(); err != nil {
				t.Fatal(err)
			}
			defer cl.Finalize()
			done := make(chan error, 1)
			go func() { _, err := cl.GetSlotList(true); done <- err }()
			select {
			case err := <-done:
				if !errors.Is(err, pkcs11.Error(pkcs11.CKR_DEVICE_ERROR)) {
					t.Errorf("GetSlotList from a hostile server: %v, want CKR_DEVICE_ERROR", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("the client still waits 20s after a hostile response")
			}
		})
	}
}

func uv(vs ...uint64) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.AppendUvarint(b, v)
	}
	return b
}

func frame(body []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}
