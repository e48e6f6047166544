package security

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/ha"
	"github.com/hagroup/hagroup/pkg/remote"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// hsmserve will not put its socket where another user could bind the
// path after it: a directory that group or others can write, sticky or
// not, or that another user owns, or under a directory that others can
// write without the sticky bit (they could move ours aside). It exits 1
// naming the directory at fault and creates nothing.
func TestHSMServeRefusesSharedSocketDir(t *testing.T) {
	bin := testhsm.HSMServe(t)
	for _, c := range []struct {
		name string
		// dir returns the socket directory and the one the error names.
		dir  func(t *testing.T) (string, string)
		want string
	}{
		{"world-writable sticky", func(t *testing.T) (string, string) {
			d := hsmserveSharedDir(t, 0o777|os.ModeSticky)
			return d, d
		}, "group or others can write it"},
		{"world-writable", func(t *testing.T) (string, string) {
			d := hsmserveSharedDir(t, 0o777)
			return d, d
		}, "group or others can write it"},
		{"group-writable", func(t *testing.T) (string, string) {
			d := hsmserveSharedDir(t, 0o770)
			return d, d
		}, "group or others can write it"},
		{"owned by another user", func(t *testing.T) (string, string) {
			d := hsmserveSharedDir(t, 0o700)
			if err := os.Chown(d, hsmserveNobody, hsmserveNobody); err != nil {
				t.Fatal(err)
			}
			return d, d
		}, fmt.Sprintf("is owned by uid %d", hsmserveNobody)},
		{"under a world-writable directory", func(t *testing.T) (string, string) {
			up := hsmserveSharedDir(t, 0o777)
			d := filepath.Join(up, "own")
			if err := os.Mkdir(d, 0o700); err != nil {
				t.Fatal(err)
			}
			return d, up
		}, "group or others can write it"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir, bad := c.dir(t)
			sock := filepath.Join(dir, "m.sock")
			cmd := exec.CommandContext(hsmserveCtx(t), bin, "--module", testhsm.SoftHSMModule, "--socket", sock)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("hsmserve with its socket in %s: %v (%s), want exit status 1", dir, err, out)
			}
			if !strings.Contains(string(out), bad) || !strings.Contains(string(out), c.want) {
				t.Errorf("hsmserve's error %q: want it to name %s and say %q", out, bad, c.want)
			}
			if _, err := os.Lstat(sock); !os.IsNotExist(err) {
				t.Errorf("%s exists after the refusal: %v", sock, err)
			}
		})
	}
}

// Another user binds a member's socket path (in a world-writable sticky
// directory, as /tmp): the client refuses the connection before it sends
// a byte, with an error naming the socket and the uid it found, however
// often it tries; the engine opens the group on its other member, logs in
// there, and the impostor receives nothing, the PIN above all. Before,
// the client sent the PIN at every retry (12 copies in 12 s).
func TestHSMServeImpostorGetsNothing(t *testing.T) {
	tok := testhsm.Take(t, 1)[0]
	dir := hsmserveSharedDir(t, 0o777|os.ModeSticky)
	sock := filepath.Join(dir, "m.sock")
	im := hsmserveStartImpostor(t, sock)
	module := remote.ModulePath(sock)
	spec := slot.Spec{Name: "b", Module: module, TokenLabel: "ha-b", PIN: secret.PINFromString(tok.UserPIN), CommandTimeout: 5 * time.Second}
	for i := range 3 {
		_, err := slot.Open(hsmserveCtx(t), spec)
		if slot.CodeOf(err) != pkcs11.CKR_DEVICE_ERROR || slot.ClassOf(err) != slot.ClassHealth {
			t.Fatalf("Open %d of the impostor's socket: %v, want CKR_DEVICE_ERROR, a health error", i, err)
		}
		want := fmt.Sprintf("token server at %s runs as uid %d", sock, hsmserveNobody)
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open %d: %v, want it to say %q", i, err, want)
		}
	}

	var mu sync.Mutex
	var failed []error
	events := group.EventFunc(func(e group.Event) {
		if e.Member == "b" && e.Err != nil {
			mu.Lock()
			failed = append(failed, e.Err)
			mu.Unlock()
		}
	})
	set := config.Defaults()
	set.Retries = 0
	g, err := ha.Open(hsmserveCtx(t), hsmserveGroup(tok, module, nil), set, ha.Options{StateDir: t.TempDir(), Events: events})
	if err != nil {
		t.Fatalf("open the group: %v", err)
	}
	defer g.Close()
	if err := g.Engine().Login(hsmserveCtx(t), pkcs11.CKU_USER, secret.PINFromString(tok.UserPIN)); err != nil {
		t.Fatalf("log in to the group with member b bound by the impostor: %v", err)
	}
	mu.Lock()
	if len(failed) == 0 || !strings.Contains(failed[0].Error(), fmt.Sprintf("uid %d", hsmserveNobody)) {
		t.Errorf("member b's failure events %v: want one naming uid %d", failed, hsmserveNobody)
	}
	mu.Unlock()
	g.Close()

	conns, got := im.received(t)
	if conns < 4 {
		t.Errorf("the impostor saw %d connections, want at least the 3 Opens and the group's", conns)
	}
	if len(got) != 0 {
		// Not the bytes themselves: they could hold the PIN.
		t.Errorf("the impostor received %d bytes (the PIN among them: %v), want none", len(got), bytes.Contains(got, []byte(tok.UserPIN)))
	}
}

// With server_uid naming the impostor's uid, the engine does talk to it
// (its hello reaches it): the option is carried from the configuration to
// the client. Still no PIN: the impostor speaks no protocol.
func TestHSMServeServerUIDIsHonoured(t *testing.T) {
	tok := testhsm.Take(t, 1)[0]
	dir := hsmserveSharedDir(t, 0o777|os.ModeSticky)
	sock := filepath.Join(dir, "m.sock")
	im := hsmserveStartImpostor(t, sock)
	uid := int64(hsmserveNobody)
	set := config.Defaults()
	set.Retries = 0
	g, err := ha.Open(hsmserveCtx(t), hsmserveGroup(tok, remote.ModulePath(sock), &uid), set, ha.Options{StateDir: t.TempDir()})
	if err != nil {
		t.Fatalf("open the group: %v", err)
	}
	g.Close()
	_, got := im.received(t)
	if !bytes.Contains(got, []byte("hagroup-remote")) {
		t.Errorf("with server_uid = %d the impostor received %d bytes without the client's hello", uid, len(got))
	}
	if bytes.Contains(got, []byte(tok.UserPIN)) {
		t.Errorf("the impostor received the PIN")
	}
}

// hsmserveGroup is a group of tok (member a, in process) and a member b
// served at module.
func hsmserveGroup(tok testhsm.Token, module string, serverUID *int64) config.Group {
	return config.Group{Label: "hsmserve-impostor", Members: []config.Member{
		{Name: "a", Module: tok.Module, TokenLabel: tok.Label},
		{Name: "b", Module: module, TokenLabel: "ha-b", ServerUID: serverUID},
	}}
}

// Two clients of one hsmserve socket have an application state each, as
// two processes on a bare token do: B's C_Logout does not log A out (A
// still finds its private key and signs), and a client that never logged
// in sees no private object and cannot sign with A's key. Before, one
// state was shared: B's C_Logout made A's private objects vanish, and a
// client that never logged in saw them and signed.
func TestHSMServeClientsIsolated(t *testing.T) {
	srv := testhsm.ServeRemote(t, "isolated")
	pin := srv.Token().UserPIN
	a, sa := hsmserveConnect(t, srv)
	if err := a.Login(sa, pkcs11.CKU_USER, pin); err != nil {
		t.Fatalf("A logs in: %v", err)
	}
	ec := []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}
	_, priv, err := a.GenerateKeyPair(sa, []*pkcs11.Mechanism{pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil)},
		[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true), pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, ec),
			pkcs11.NewAttribute(pkcs11.CKA_LABEL, "iso"), pkcs11.NewAttribute(pkcs11.CKA_VERIFY, true)},
		[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true), pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
			pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true), pkcs11.NewAttribute(pkcs11.CKA_LABEL, "iso"),
			pkcs11.NewAttribute(pkcs11.CKA_SIGN, true)})
	if err != nil {
		t.Fatalf("A makes a key pair: %v", err)
	}
	hsmserveSign(t, "A, logged in", a, sa, priv, pkcs11.CKR_OK)

	b, sb := hsmserveConnect(t, srv)
	if err, bare := b.Logout(sb), hsmserveBareLogout(t); slot.CodeOf(err) != slot.CodeOf(bare) {
		t.Errorf("B's C_Logout, never logged in: %v, want what a bare token answers: %v", err, bare)
	}
	if n := hsmserveCount(t, a, sa, pkcs11.CKO_PRIVATE_KEY); n != 1 {
		t.Errorf("A finds %d private keys after B's C_Logout, want 1", n)
	}
	hsmserveSign(t, "A after B's C_Logout", a, sa, priv, pkcs11.CKR_OK)

	c, sc := hsmserveConnect(t, srv)
	if n := hsmserveCount(t, c, sc, pkcs11.CKO_PRIVATE_KEY); n != 0 {
		t.Errorf("C, never logged in, finds %d private keys, want 0", n)
	}
	if n := hsmserveCount(t, c, sc, pkcs11.CKO_PUBLIC_KEY); n != 1 {
		t.Errorf("C finds %d public keys, want A's 1 (public objects are visible)", n)
	}
	// C's process never saw the key: SoftHSM knows no such handle.
	hsmserveSign(t, "C, never logged in, with A's key handle", c, sc, priv, pkcs11.CKR_OBJECT_HANDLE_INVALID)

	// B logs in and out on its own; A stays logged in.
	if err := b.Login(sb, pkcs11.CKU_USER, pin); err != nil {
		t.Fatalf("B logs in: %v", err)
	}
	if err := b.Logout(sb); err != nil {
		t.Fatalf("B logs out: %v", err)
	}
	hsmserveSign(t, "A after B's login and logout", a, sa, priv, pkcs11.CKR_OK)
}

// hsmserveBareLogout is what C_Logout answers on a bare SoftHSM token
// nobody logged in to.
func hsmserveBareLogout(t *testing.T) error {
	t.Helper()
	tok := testhsm.Take(t, 1)[0]
	mc := pkcs11.New(tok.Module)
	if mc == nil {
		t.Fatalf("load %s", tok.Module)
	}
	if err := mc.Initialize(); err != nil && !errors.Is(err, pkcs11.Error(pkcs11.CKR_CRYPTOKI_ALREADY_INITIALIZED)) {
		t.Fatal(err)
	}
	ids, err := mc.GetSlotList(true)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		ti, err := mc.GetTokenInfo(id)
		if err != nil || strings.TrimRight(ti.Label, " ") != tok.Label {
			continue
		}
		sh, err := mc.OpenSession(id, pkcs11.CKF_SERIAL_SESSION)
		if err != nil {
			t.Fatal(err)
		}
		defer mc.CloseSession(sh)
		return mc.Logout(sh)
	}
	t.Fatalf("no slot holds token %s", tok.Label)
	return nil
}

// hsmserveSign signs a digest with key on sh and checks the CKR code.
func hsmserveSign(t *testing.T, who string, c *remote.Client, sh pkcs11.SessionHandle, key pkcs11.ObjectHandle, want uint) {
	t.Helper()
	err := c.SignInit(sh, []*pkcs11.Mechanism{pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil)}, key)
	if err == nil {
		var sig []byte
		sig, err = c.Sign(sh, make([]byte, 32))
		if err == nil && len(sig) != 64 {
			t.Errorf("%s: a signature of %d bytes", who, len(sig))
		}
	}
	if slot.CodeOf(err) != want {
		t.Errorf("%s: sign: %v, want %s", who, err, pkcs11.Error(want))
	}
}

// hsmserveCount counts the objects of class on sh.
func hsmserveCount(t *testing.T, c *remote.Client, sh pkcs11.SessionHandle, class uint) int {
	t.Helper()
	if err := c.FindObjectsInit(sh, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_CLASS, class)}); err != nil {
		t.Fatalf("FindObjectsInit: %v", err)
	}
	hs, _, err := c.FindObjects(sh, 100)
	if err != nil {
		t.Fatalf("FindObjects: %v", err)
	}
	if err := c.FindObjectsFinal(sh); err != nil {
		t.Fatalf("FindObjectsFinal: %v", err)
	}
	return len(hs)
}

// hsmserveRSSBound is what any one of hsmserve's processes may hold
// resident after the attacks: a connection's process holds its runtime
// and SoftHSM (~12 MiB measured), and reads no request while MaxFrame of
// requests and unwritten replies are held; the parent reads nothing from
// its connections. Twice MaxFrame leaves room
// for the garbage collector's slack; before, the attacks made one process
// hold 592 MB, 1.6 GB and 1.8 GB.
const hsmserveRSSBound = 32<<20 + 2*remote.MaxFrame

// Attacks on hsmserve's memory get errors and leave every one of its
// processes under hsmserveRSSBound: request frames of 100 MiB (the header
// is refused, the connection closed, nothing read), 300,000 pipelined
// requests whose replies are never read (the server stops reading: the
// attacker's writes block), and C_GenerateRandom of 256 MiB
// (CKR_ARGUMENTS_BAD; a bare SoftHSM would return it).
func TestHSMServeMemoryBounds(t *testing.T) {
	srv := testhsm.ServeRemote(t, "membound")
	c, sh := hsmserveConnect(t, srv)
	check := func(what string) {
		t.Helper()
		all := hsmserveRSS(t, srv.PID())
		var sum int64
		for _, rss := range all {
			sum += rss
		}
		t.Logf("after %s: %d hsmserve processes hold %d MiB resident", what, len(all), sum>>20)
		for pid, rss := range all {
			if rss > hsmserveRSSBound {
				t.Errorf("after %s: hsmserve process %d holds %d MiB resident, bound %d MiB", what, pid, rss>>20, hsmserveRSSBound>>20)
			}
		}
	}
	check("start")

	t.Run("oversized frames", func(t *testing.T) {
		nc := hsmserveDialRaw(t, srv.Socket())
		nc.SetDeadline(time.Now().Add(30 * time.Second))
		body := make([]byte, 1<<20)
		for range 8 {
			// A header of 100 MiB and the first MiB of its body.
			frame := append(binary.BigEndian.AppendUint32(nil, 100<<20), body...)
			if _, err := nc.Write(frame); err != nil {
				break // the server closed: expected
			}
		}
		got, err := io.ReadAll(nc)
		if err != nil && !errors.Is(err, net.ErrClosed) && !isReset(err) {
			t.Errorf("reading after the oversized frames: %v, want the server to close", err)
		}
		if len(got) != 0 {
			t.Errorf("the server answered %d bytes to an oversized frame, want none (it closes)", len(got))
		}
		check("8 request frames of 100 MiB")
	})

	t.Run("replies never read", func(t *testing.T) {
		nc := hsmserveDialRaw(t, srv.Socket())
		const requests = 300000
		var stream []byte
		for id := range uint64(requests) {
			stream = append(stream, hsmserveFrame(hsmserveGetInfo(id+1))...)
		}
		nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
		n, err := nc.Write(stream)
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("writing %d requests without reading a reply: %d bytes written, %v; want the server to stop reading (a write deadline)", requests, n, err)
		}
		if n >= len(stream)/2 {
			t.Errorf("the server took %d of %d bytes of requests whose replies nobody reads", n, len(stream))
		}
		check(fmt.Sprintf("%d bytes of pipelined requests, no reply read", n))
	})

	t.Run("GenerateRandom of 256 MiB", func(t *testing.T) {
		_, err := c.GenerateRandom(sh, 256<<20)
		if !errors.Is(err, pkcs11.Error(pkcs11.CKR_ARGUMENTS_BAD)) || !strings.Contains(err.Error(), "exceeds the bound of 1048576") {
			t.Errorf("C_GenerateRandom(256 MiB): %v, want CKR_ARGUMENTS_BAD naming the bound", err)
		}
		if _, err := c.GenerateRandom(sh, 16); err != nil {
			t.Errorf("C_GenerateRandom(16) after the refusal: %v", err)
		}
		check("C_GenerateRandom of 256 MiB")
	})
}

// isReset reports whether err is the peer resetting the connection.
func isReset(err error) bool {
	return strings.Contains(err.Error(), "connection reset by peer")
}
