package testhsm_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/remote"
	"github.com/miekg/pkcs11"
)

func TestMain(m *testing.M) { os.Exit(testhsm.Main(m, 3)) }

// listLabels lists label → serial of the initialised tokens a module shows,
// through a context of its own (loaded with env set, then finalized).
func listLabels(t *testing.T, module string, env map[string]string) map[string]string {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	c := pkcs11.New(module)
	if c == nil {
		t.Fatalf("load %s", module)
	}
	defer c.Destroy()
	if err := c.Initialize(); err != nil {
		t.Fatalf("Initialize %s: %v", module, err)
	}
	defer c.Finalize()
	ids, err := c.GetSlotList(true)
	if err != nil {
		t.Fatalf("GetSlotList: %v", err)
	}
	out := make(map[string]string)
	for _, id := range ids {
		ti, err := c.GetTokenInfo(id)
		if err != nil {
			t.Fatalf("GetTokenInfo: %v", err)
		}
		if ti.Flags&pkcs11.CKF_TOKEN_INITIALIZED != 0 {
			out[ti.Label] = ti.SerialNumber
		}
	}
	return out
}

// Not parallel: it uses the process's SoftHSM context alone.
func TestMainMakesTokens(t *testing.T) {
	conf := os.Getenv("SOFTHSM2_CONF")
	if conf == "" || !strings.HasPrefix(conf, os.TempDir()) {
		t.Fatalf("SOFTHSM2_CONF = %q, want a temporary file", conf)
	}
	toks := testhsm.Take(t, 2)
	more := testhsm.Take(t, 1)
	// Listed after Take: a Take of a later run (-count) recycles tokens
	// under new labels.
	got := listLabels(t, testhsm.SoftHSMModule, nil)
	if len(got) != 3 {
		t.Fatalf("token directory holds %v, want 3 tokens", got)
	}
	seen := map[string]bool{}
	for _, tok := range append(toks, more...) {
		if seen[tok.Label] {
			t.Fatalf("Take handed out %s twice", tok.Label)
		}
		seen[tok.Label] = true
		if got[tok.Label] != tok.Serial || tok.Serial == "" {
			t.Fatalf("token %s: serial %q, module says %q", tok.Label, tok.Serial, got[tok.Label])
		}
		if tok.Module != testhsm.SoftHSMModule || tok.UserPIN == "" || tok.SOPIN == "" || tok.Name == "" {
			t.Fatalf("incomplete token %+v", tok)
		}
	}
	// The PIN works.
	c := pkcs11.New(testhsm.SoftHSMModule)
	defer c.Destroy()
	if err := c.Initialize(); err != nil {
		t.Fatal(err)
	}
	defer c.Finalize()
	ids, _ := c.GetSlotList(true)
	for _, id := range ids {
		ti, _ := c.GetTokenInfo(id)
		if ti.Label != toks[0].Label {
			continue
		}
		h, err := c.OpenSession(id, pkcs11.CKF_SERIAL_SESSION)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Login(h, pkcs11.CKU_USER, toks[0].UserPIN); err != nil {
			t.Fatalf("Login with the harness's user PIN: %v", err)
		}
		c.Logout(h)
		c.CloseSession(h)
	}
}

// initialize loads SoftHSM in a context of the test's own, finalized when
// the test ends: C_Initialize reads the token directory as another
// process would.
func initialize(t *testing.T) *pkcs11.Ctx {
	t.Helper()
	c := pkcs11.New(testhsm.SoftHSMModule)
	if c == nil {
		t.Fatalf("load %s", testhsm.SoftHSMModule)
	}
	if err := c.Initialize(); err != nil {
		t.Fatalf("Initialize: %v", err)
	}
	t.Cleanup(func() { c.Finalize(); c.Destroy() })
	return c
}

// userSession opens a read-write session on tok with the user logged in.
func userSession(t *testing.T, c *pkcs11.Ctx, tok testhsm.Token) pkcs11.SessionHandle {
	t.Helper()
	ids, err := c.GetSlotList(true)
	if err != nil {
		t.Fatalf("GetSlotList: %v", err)
	}
	for _, id := range ids {
		ti, err := c.GetTokenInfo(id)
		if err != nil || ti.SerialNumber != tok.Serial {
			continue
		}
		if ti.Label != tok.Label {
			t.Fatalf("token %s is labelled %q, Take said %q", tok.Serial, ti.Label, tok.Label)
		}
		sh, err := c.OpenSession(id, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
		if err != nil {
			t.Fatalf("OpenSession on %s: %v", tok.Label, err)
		}
		if err := c.Login(sh, pkcs11.CKU_USER, tok.UserPIN); err != nil {
			t.Fatalf("Login on %s with the harness's user PIN: %v", tok.Label, err)
		}
		return sh
	}
	t.Fatalf("no slot holds token %s (serial %s)", tok.Label, tok.Serial)
	return 0
}

// objectLabels lists the labels of every object the session sees.
func objectLabels(t *testing.T, c *pkcs11.Ctx, sh pkcs11.SessionHandle) []string {
	t.Helper()
	if err := c.FindObjectsInit(sh, nil); err != nil {
		t.Fatal(err)
	}
	hs, _, err := c.FindObjects(sh, 100)
	c.FindObjectsFinal(sh)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, h := range hs {
		a, err := c.GetAttributeValue(sh, h, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_LABEL, nil)})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, string(a[0].Value))
	}
	return out
}

// createObject leaves a private data object labelled label on the token.
func createObject(t *testing.T, c *pkcs11.Ctx, sh pkcs11.SessionHandle, label string) {
	t.Helper()
	if _, err := c.CreateObject(sh, []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_DATA),
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
		pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, label),
		pkcs11.NewAttribute(pkcs11.CKA_VALUE, []byte("x")),
	}); err != nil {
		t.Fatalf("CreateObject: %v", err)
	}
}

// Five rounds of three tokens from a pool of three (as go test -count=5
// of a test taking three): each round's tokens come fresh, with none of
// the objects the previous round left, under a label and member name no
// earlier round saw (SoftHSM keeps a token's serial number through
// C_InitToken).
// Not parallel: it uses the process's SoftHSM context alone.
func TestTakeRecyclesReleasedTokens(t *testing.T) {
	seen := map[string]int{}
	for round := range 5 {
		t.Run(fmt.Sprint("round", round), func(t *testing.T) {
			toks := testhsm.Take(t, 3)
			c := initialize(t)
			for _, tok := range toks {
				for _, id := range []string{"label " + tok.Label, "name " + tok.Name} {
					if r, ok := seen[id]; ok {
						t.Fatalf("Take handed out %s in round %d and again in round %d", id, r, round)
					}
					seen[id] = round
				}
				sh := userSession(t, c, tok)
				if objs := objectLabels(t, c, sh); len(objs) != 0 {
					t.Fatalf("token %s comes with objects %q", tok.Label, objs)
				}
				createObject(t, c, sh, fmt.Sprintf("left by round %d", round))
				c.CloseSession(sh)
			}
		})
	}
	if got := listLabels(t, testhsm.SoftHSMModule, nil); len(got) != 3 {
		t.Fatalf("token directory holds %v, want the pool's 3 tokens (recycled in place)", got)
	}
}

// A token whose test left a session open on it is not recycled under
// that session: its objects stay, and it comes back once the session is
// closed.
func TestTakeLeavesATokenInUse(t *testing.T) {
	c := initialize(t)
	var leaked testhsm.Token
	var sh pkcs11.SessionHandle
	t.Run("leak", func(t *testing.T) {
		toks := testhsm.Take(t, 3)
		leaked = toks[0]
		sh = userSession(t, c, leaked)
		createObject(t, c, sh, "still in use")
	})
	testhsm.Take(t, 2) // the other two
	if objs := objectLabels(t, c, sh); len(objs) != 1 || objs[0] != "still in use" {
		t.Fatalf("the token in use holds %q after Take, want its object \"still in use\"", objs)
	}
	if err := c.CloseSession(sh); err != nil {
		t.Fatal(err)
	}
	tok := testhsm.Take(t, 1)[0]
	if tok.Serial != leaked.Serial || tok.Label == leaked.Label {
		t.Fatalf("Take handed out %s (serial %s), want the token that was in use (serial %s) initialised afresh under a new label", tok.Label, tok.Serial, leaked.Serial)
	}
	sh = userSession(t, c, tok)
	defer c.CloseSession(sh)
	if objs := objectLabels(t, c, sh); len(objs) != 0 {
		t.Fatalf("recycled token %s comes with objects %q", tok.Label, objs)
	}
}

func TestServe(t *testing.T) {
	srv := testhsm.Serve(t, "served-a")
	tok := srv.Token()
	addr := tok.ModuleEnv["P11_KIT_SERVER_ADDRESS"]
	sock, ok := strings.CutPrefix(addr, "unix:path=")
	if !ok || tok.Module != testhsm.P11KitClient {
		t.Fatalf("served token %+v", tok)
	}
	if got := listLabels(t, tok.Module, tok.ModuleEnv); len(got) != 1 || got["served-a"] != tok.Serial {
		t.Fatalf("through p11-kit: %v, want served-a with serial %s", got, tok.Serial)
	}
	// The served token is not in the process's own token directory.
	if strings.HasPrefix(sock, filepath.Dir(os.Getenv("SOFTHSM2_CONF"))) {
		t.Fatalf("served token shares the process's token directory")
	}

	srv.Kill()
	if c, err := net.Dial("unix", sock); err == nil {
		c.Close()
		t.Fatalf("socket still answers after Kill")
	}
	srv.Restart(t)
	if got := listLabels(t, tok.Module, tok.ModuleEnv); got["served-a"] != tok.Serial {
		t.Fatalf("after Restart: %v, want the same token (serial %s)", got, tok.Serial)
	}

	// Stop leaves the server stopped; Cont resumes it.
	srv.Stop()
	if st := procState(t, srv.PID()); st != "T" {
		t.Fatalf("server state after Stop: %s, want T (stopped)", st)
	}
	srv.Cont()
	if st := procState(t, srv.PID()); st == "T" {
		t.Fatalf("server still stopped after Cont")
	}
	if got := listLabels(t, tok.Module, tok.ModuleEnv); got["served-a"] != tok.Serial {
		t.Fatalf("after Stop and Cont: %v", got)
	}
}

// procState returns the state letter of a process from /proc.
func procState(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// pid (comm) state ...; comm may hold spaces, so cut after the last ')'.
	rest := string(b[strings.LastIndexByte(string(b), ')')+2:])
	return rest[:1]
}

func TestServeRemote(t *testing.T) {
	srv := testhsm.ServeRemote(t, "remote-a")
	tok := srv.Token()
	if tok.Module != remote.ModulePath(srv.Socket()) || len(tok.ModuleEnv) != 0 || tok.Label != "remote-a" || tok.Serial == "" {
		t.Fatalf("served token %+v", tok)
	}
	labels := func() map[string]string {
		t.Helper()
		c, err := remote.NewClient(tok.Module, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Initialize(); err != nil {
			t.Fatalf("connect: %v", err)
		}
		defer c.Finalize()
		ids, err := c.GetSlotList(true)
		if err != nil {
			t.Fatalf("GetSlotList: %v", err)
		}
		out := map[string]string{}
		for _, id := range ids {
			ti, err := c.GetTokenInfo(id)
			if err != nil {
				t.Fatalf("GetTokenInfo: %v", err)
			}
			out[strings.TrimSpace(ti.Label)] = strings.TrimSpace(ti.SerialNumber)
		}
		return out
	}
	if got := labels(); len(got) != 1 || got["remote-a"] != tok.Serial {
		t.Fatalf("through hsmserve: %v, want remote-a with serial %s", got, tok.Serial)
	}
	pid := srv.PID()
	srv.Stop()
	if st := procState(t, pid); st != "T" {
		t.Fatalf("server state after Stop: %s, want T", st)
	}
	srv.Cont()
	srv.Kill()
	if srv.PID() != 0 {
		t.Fatalf("PID after Kill: %d, want 0", srv.PID())
	}
	srv.Restart(t)
	if srv.PID() == 0 || srv.PID() == pid {
		t.Fatalf("PID after Restart: %d (before %d)", srv.PID(), pid)
	}
	if got := labels(); got["remote-a"] != tok.Serial {
		t.Fatalf("after Restart: %v, want the same token (serial %s)", got, tok.Serial)
	}
}

// hsmserve exits 0 on SIGTERM and removes its socket; bad flags exit 2.
func TestHSMServeTerm(t *testing.T) {
	bin := testhsm.HSMServe(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "s.sock")
	cmd := exec.Command(bin, "--module", testhsm.SoftHSMModule, "--socket", sock)
	var out strings.Builder
	cmd.Stderr = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("hsmserve did not listen within 15s: %v", err)
		}
		select {
		case err := <-done:
			t.Fatalf("hsmserve exited: %v: %s", err, out.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("hsmserve after SIGTERM: %v (want exit 0): %s", err, out.String())
		}
	case <-time.After(15 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("hsmserve did not exit within 15s of SIGTERM")
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left behind after SIGTERM: %v", err)
	}
	err := exec.Command(bin, "--module", "relative.so", "--socket", sock).Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Errorf("bad --module: %v, want exit status 2", err)
	}
}
