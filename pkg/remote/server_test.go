package remote_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/remote"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

func TestParseModulePath(t *testing.T) {
	for _, c := range []struct {
		path, sock, err string
	}{
		{"hagroup-remote:unix:/run/hsm-a.sock", "/run/hsm-a.sock", ""},
		{"hagroup-remote:unix:run/a.sock", "", "not an absolute path"},
		{"hagroup-remote:unix:", "", "not an absolute path"},
		{"hagroup-remote:tcp:10.0.0.1:5000", "", "the only transport is unix:"},
		{"/usr/lib/softhsm/libsofthsm2.so", "", "does not start with hagroup-remote:"},
		{"hagroup-remote:unix:/" + strings.Repeat("x", 120), "", "at most 107"},
	} {
		sock, err := remote.ParseModulePath(c.path)
		switch {
		case c.err == "" && (err != nil || sock != c.sock):
			t.Errorf("ParseModulePath(%q) = %q, %v; want %q", c.path, sock, err, c.sock)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("ParseModulePath(%q) error %v; want one saying %q", c.path, err, c.err)
		}
	}
	if got := remote.ModulePath("/run/x.sock"); got != "hagroup-remote:unix:/run/x.sock" || !remote.IsModulePath(got) {
		t.Errorf("ModulePath = %q", got)
	}
}

// A client of another protocol version is refused with a message naming
// both versions.
func TestVersionMismatch(t *testing.T) {
	srv := testhsm.ServeRemote(t, "version")
	c, err := net.DialTimeout("unix", srv.Socket(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	// A hello frame: the magic as a length and bytes, then version 99.
	hello := append([]byte{byte(len("hagroup-remote"))}, "hagroup-remote"...)
	hello = append(hello, 99)
	if _, err := c.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(hello))), hello...)); err != nil {
		t.Fatal(err)
	}
	w, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read welcome: %v", err)
	}
	if len(w) < 6 || int(binary.BigEndian.Uint32(w)) != len(w)-4 || w[4] != remote.ProtocolVersion ||
		!bytes.Contains(w, []byte("version 99")) || !bytes.Contains(w, []byte(fmt.Sprintf("version %d", remote.ProtocolVersion))) {
		t.Errorf("welcome %q: want one frame refusing, naming versions 99 and %d", w, remote.ProtocolVersion)
	}
}

// serveInProcess serves the SoftHSM token directory of the test process
// with srv on a fresh socket until the test ends.
func serveInProcess(t *testing.T, srv *remote.Server) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "rsrv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s.sock")
	l, err := remote.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Serve did not return within 10s of its context ending")
		}
	})
	return sock
}

// The socket is 0600, a second server on a live socket is refused, and a
// peer whose uid is not allowed is turned away (the client sees
// CKR_DEVICE_ERROR, the server's Refused hook the uid).
func TestListenAndPeerCheck(t *testing.T) {
	var mu sync.Mutex
	var refused []error
	tok := testhsm.Take(t, 1)[0]
	sock := serveInProcess(t, &remote.Server{
		Module:   testhsm.SoftHSMModule,
		AllowUID: func(uint32) bool { return false },
		Refused:  func(err error) { mu.Lock(); refused = append(refused, err); mu.Unlock() },
	})
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want 0600", fi.Mode().Perm())
	}
	if _, err := remote.Listen(sock); err == nil || !strings.Contains(err.Error(), "already answers") {
		t.Errorf("Listen on a live socket: %v, want a refusal", err)
	}
	c, err := remote.NewClient(remote.ModulePath(sock), nil)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Initialize()
	if !errors.Is(err, pkcs11.Error(pkcs11.CKR_DEVICE_ERROR)) {
		t.Fatalf("Initialize refused by uid: %v, want CKR_DEVICE_ERROR", err)
	}
	spec := specOf(tok, 5*time.Second)
	spec.Module = remote.ModulePath(sock)
	if _, err := slot.Open(ctxT(t), spec); err == nil || slot.ClassOf(err) != slot.ClassHealth {
		t.Errorf("slot.Open of a refused remote: %v (class %v), want a health error", err, slot.ClassOf(err))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(refused) == 0 || !strings.Contains(refused[0].Error(), "uid not allowed") {
		t.Errorf("Refused saw %v, want the uid refusal", refused)
	}
}

// The in-process server tolerates a module this process has initialised
// already (foreign) and, with TokenLabel, serves only that token.
func TestServeOneTokenInProcess(t *testing.T) {
	toks := testhsm.Take(t, 2)
	local := open(t, toks[0], 10*time.Second) // SoftHSM initialised here first
	sock := serveInProcess(t, &remote.Server{Module: testhsm.SoftHSMModule, TokenLabel: toks[1].Label})
	list, err := slot.ListModuleTokens(ctxT(t), slot.ModuleRef{Path: remote.ModulePath(sock)})
	if err != nil {
		t.Fatalf("ListModuleTokens: %v", err)
	}
	if len(list) != 1 || list[0].Label != toks[1].Label {
		t.Fatalf("served tokens %+v, want only %s", list, toks[1].Label)
	}
	spec := specOf(toks[1], 10*time.Second)
	spec.Module = remote.ModulePath(sock)
	rem, err := slot.Open(ctxT(t), spec)
	if err != nil {
		t.Fatalf("open the served token: %v", err)
	}
	defer rem.Close()
	pub, priv := genEC(t, rem, "inproc")
	signVerify(t, rem, priv, rem, pub)
	// Another token of the module is not reachable through the server.
	spec = specOf(toks[0], 10*time.Second)
	spec.Module = remote.ModulePath(sock)
	if _, err := slot.Open(ctxT(t), spec); !errors.Is(err, slot.ErrTokenNotFound) {
		t.Errorf("open an unserved token through the server: %v, want ErrTokenNotFound", err)
	}
	if _, err := local.GenerateRandom(ctxT(t), 8); err != nil {
		t.Errorf("the local slot after serving its module: %v", err)
	}
}

// A request the client cannot encode fails alone; the connection stays.
func TestBadRequestKeepsConnection(t *testing.T) {
	srv := testhsm.ServeRemote(t, "badreq")
	c, err := remote.NewClient(srv.Token().Module, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	defer c.Finalize()
	ids, err := c.GetSlotList(true)
	if err != nil || len(ids) != 1 {
		t.Fatalf("GetSlotList: %v, %v", ids, err)
	}
	sh, err := c.OpenSession(ids[0], pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateObject(sh, []*pkcs11.Attribute{nil}); !errors.Is(err, pkcs11.Error(pkcs11.CKR_ARGUMENTS_BAD)) {
		t.Errorf("nil attribute: %v, want CKR_ARGUMENTS_BAD", err)
	}
	if _, err := c.GenerateRandom(sh, 4); err != nil {
		t.Errorf("after a bad request: %v", err)
	}
	// A session handle the connection did not open is invalid for it.
	if err := c.CloseSession(sh + 1000); !errors.Is(err, pkcs11.Error(pkcs11.CKR_SESSION_HANDLE_INVALID)) {
		t.Errorf("foreign session handle: %v, want CKR_SESSION_HANDLE_INVALID", err)
	}
}
