package security

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/ha"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/recover"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/miekg/pkcs11"
)

// The application proves the PIN; a PIN a token refuses is never offered
// to it again by itself; no message carries a PIN.

// loginWrongPIN is the attacker's guess; loginURIPIN a PIN put in a URI.
const (
	loginWrongPIN = "not-the-pin-4711"
	loginURIPIN   = "83127465"
)

var loginSerials atomic.Int64

func loginCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// loginEvents keeps a group's and its recoverer's events.
type loginEvents struct {
	mu      sync.Mutex
	rec     []recover.Event
	changed chan struct{}
}

func newLoginEvents() *loginEvents { return &loginEvents{changed: make(chan struct{}, 1)} }

func (e *loginEvents) recovery(ev recover.Event) {
	e.mu.Lock()
	e.rec = append(e.rec, ev)
	e.mu.Unlock()
	select {
	case e.changed <- struct{}{}:
	default:
	}
}

func (e *loginEvents) count(kind recover.EventKind, name string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, ev := range e.rec {
		if ev.Kind == kind && ev.Member == name {
			n++
		}
	}
	return n
}

// wait waits (30 s at most) until cond holds, re-checking it after every
// recovery event and every 100 ms (member states move without one).
func (e *loginEvents) wait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-e.changed:
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%s: not within 30s", what)
		}
	}
}

// loginDirect opens tok outside any group, logged in when pin is given.
func loginDirect(t *testing.T, tok testhsm.Token, pin string) *slot.Slot {
	t.Helper()
	s, err := slot.Open(loginCtx(t), slot.Spec{Name: tok.Name + "-direct", Module: tok.Module, TokenLabel: tok.Label,
		PIN: secret.PINFromString(pin), CommandTimeout: 20 * time.Second})
	if err != nil {
		t.Fatalf("open %s directly: %v", tok.Name, err)
	}
	return s
}

// loginInstallDomain installs a trusted domain key for serial on toks and
// closes its own sessions again: SoftHSM keeps a login per process and
// token, and a token left logged in would answer any PIN with
// CKR_USER_ALREADY_LOGGED_IN.
func loginInstallDomain(t *testing.T, serial string, toks []testhsm.Token) {
	t.Helper()
	var targets []domainkey.Target
	for _, tok := range toks {
		s := loginDirect(t, tok, tok.UserPIN)
		defer s.Close()
		targets = append(targets, domainkey.Target{Slot: s,
			SOPIN: secret.PINFromString(tok.SOPIN), UserPIN: secret.PINFromString(tok.UserPIN)})
	}
	if err := domainkey.Install(loginCtx(t), targets, serial); err != nil {
		t.Fatalf("install domain key: %v", err)
	}
}

// loginPINFile writes pin to a new PIN file.
func loginPINFile(t *testing.T, dir, name, pin string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(pin+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// loginGroupCfg is a group of toks; member i has pin_file files[i] ("":
// none).
func loginGroupCfg(serial string, toks []testhsm.Token, files []string) config.Group {
	g := config.Group{Label: "login-" + serial, Serial: serial}
	for i, tok := range toks {
		g.Members = append(g.Members, config.Member{Name: tok.Name, Module: tok.Module, TokenLabel: tok.Label, PINFile: files[i]})
	}
	return g
}

// loginOpen opens cfg with a one-second recovery interval, counting every
// call at the slot boundary in faults.
func loginOpen(t *testing.T, cfg config.Group, stateDir string, faults *slottest.Faults, ev *loginEvents) *ha.Group {
	t.Helper()
	set := config.Defaults()
	set.Interval = time.Second
	set.Retries = -1
	set.CommandTimeout = 10 * time.Second
	opts := ha.Options{StateDir: stateDir, Interceptor: faults}
	if ev != nil {
		opts.RecoveryEvents = ev.recovery
	}
	g, err := ha.Open(loginCtx(t), cfg, set, opts)
	if err != nil {
		t.Fatalf("open group: %v", err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// loginCalls sums the C_Login calls the members saw.
func loginCalls(f *slottest.Faults, toks []testhsm.Token) int {
	n := 0
	for _, tok := range toks {
		n += f.Calls(tok.Name, slot.OpLogin)
	}
	return n
}

func loginState(g *ha.Group, name string) member.State {
	for _, m := range g.Engine().Members() {
		if m.Name == name {
			return m.State
		}
	}
	return 0
}

func loginMemberStatus(g *ha.Group, name string) ha.MemberStatus {
	for _, m := range g.Snapshot().Members {
		if m.Name == name {
			return m
		}
	}
	return ha.MemberStatus{}
}

// loginBareCode is what a bare token answers C_Login(CKU_USER, pin) with.
func loginBareCode(t *testing.T, tok testhsm.Token, pin string) uint {
	t.Helper()
	s := loginDirect(t, tok, "")
	defer s.Close()
	return slot.CodeOf(s.Login(loginCtx(t), pkcs11.CKU_USER, secret.PINFromString(pin)))
}

// loginSign makes an EC key pair through the group and signs with it.
func loginSign(t *testing.T, g *ha.Group) {
	t.Helper()
	ctx := loginCtx(t)
	s, err := g.Engine().OpenSession(ctx, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p256 := []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}
	label := fmt.Sprintf("login-key-%d", loginSerials.Add(1))
	_, priv, err := s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, p256), pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
			pkcs11.NewAttribute(pkcs11.CKA_VERIFY, true), pkcs11.NewAttribute(pkcs11.CKA_LABEL, label)},
		[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true), pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
			pkcs11.NewAttribute(pkcs11.CKA_SIGN, true), pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true),
			pkcs11.NewAttribute(pkcs11.CKA_LABEL, label)})
	if err != nil {
		t.Fatalf("GenerateKeyPair after the right PIN: %v", err)
	}
	if err := s.SignInit(ctx, pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil), priv); err != nil {
		t.Fatalf("SignInit: %v", err)
	}
	digest := make([]byte, 32)
	rand.Read(digest)
	if sig, err := s.Sign(ctx, digest); err != nil || len(sig) != 64 {
		t.Fatalf("Sign after the right PIN: %d bytes, %v", len(sig), err)
	}
}

// TestLoginWrongAppPINGoAPI: Group.Login with a wrong PIN — where every
// member has its own pin_file (the attack of issue 14: CKR_OK before)
// and where none has — answers what a bare token answers
// (CKR_PIN_INCORRECT), after exactly one C_Login on one member, marks no
// member and fails none. The empty PIN likewise. The right PIN opens the
// group and signs; a second Login and a second Logout answer as a bare
// token does. Only a member that is down passes the check on.
func TestLoginWrongAppPINGoAPI(t *testing.T) {
	// Three tokens for every case (the package's token pool is shared):
	// each case is a group of its own on them.
	toks := testhsm.Take(t, 3)
	bare := toks[0] // opened directly, outside the groups, without a PIN
	for _, tc := range []struct {
		name     string
		pinFiles bool
	}{
		{"every member has a pin_file", true},
		{"no member has a PIN source", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			serial := fmt.Sprintf("%d", 7100000+loginSerials.Add(1))
			loginInstallDomain(t, serial, toks)
			dir := t.TempDir()
			files := make([]string, len(toks))
			if tc.pinFiles {
				for i, tok := range toks {
					files[i] = loginPINFile(t, dir, tok.Name+".pin", tok.UserPIN)
				}
			}
			faults := slottest.NewFaults()
			g := loginOpen(t, loginGroupCfg(serial, toks, files), filepath.Join(dir, "state"), faults, nil)
			ctx := loginCtx(t)

			for _, pin := range []string{loginWrongPIN, ""} {
				want := loginBareCode(t, bare, pin)
				before := loginCalls(faults, toks)
				err := g.Engine().Login(ctx, pkcs11.CKU_USER, secret.PINFromString(pin))
				if got := group.CodeOf(err); got != want || got == pkcs11.CKR_OK {
					t.Fatalf("Login(%q): %v (0x%x), want 0x%x as a bare token answers", pinShown(pin), err, got, want)
				}
				if n := loginCalls(faults, toks) - before; n != 1 {
					t.Errorf("Login(%q) made %d C_Login calls on the members, want 1", pinShown(pin), n)
				}
				if g.Snapshot().LoggedIn {
					t.Errorf("the group says it is logged in after Login(%q) failed", pinShown(pin))
				}
				for _, m := range g.Snapshot().Members {
					if m.State != member.Active || m.PINBlocked {
						t.Errorf("after Login(%q): %s is %v (PIN blocked %v), want active: a wrong application PIN is not the member's fault", pinShown(pin), m.Name, m.State, m.PINBlocked)
					}
				}
			}

			before := loginCalls(faults, toks)
			if err := g.Engine().Login(ctx, pkcs11.CKU_USER, secret.PINFromString(toks[0].UserPIN)); err != nil {
				t.Fatalf("Login with the right PIN: %v", err)
			}
			if n := loginCalls(faults, toks) - before; n != len(toks) {
				t.Errorf("the right PIN made %d C_Login calls, want one per member (%d)", n, len(toks))
			}
			loginSign(t, g)
			if err := g.Engine().Login(ctx, pkcs11.CKU_USER, secret.PINFromString(toks[0].UserPIN)); group.CodeOf(err) != pkcs11.CKR_USER_ALREADY_LOGGED_IN {
				t.Errorf("second Login: %v, want CKR_USER_ALREADY_LOGGED_IN", err)
			}
			if err := g.Engine().Logout(ctx); err != nil {
				t.Fatalf("Logout: %v", err)
			}
			if err := g.Engine().Logout(ctx); group.CodeOf(err) != pkcs11.CKR_USER_NOT_LOGGED_IN {
				t.Errorf("second Logout: %v, want CKR_USER_NOT_LOGGED_IN", err)
			}
		})
	}
	t.Run("a member down passes the check on", func(t *testing.T) { loginHealthFailureMovesCheck(t, toks) })
}

// pinShown names a PIN in a test message without showing it.
func pinShown(pin string) string {
	if pin == "" {
		return "empty PIN"
	}
	return "wrong PIN"
}

// loginHealthFailureMovesCheck: only a member that is down passes the
// check on. The first member answers C_Login with CKR_DEVICE_ERROR: the
// wrong PIN goes to the second, whose CKR_PIN_INCORRECT is final — the
// third sees no C_Login.
func loginHealthFailureMovesCheck(t *testing.T, toks []testhsm.Token) {
	serial := fmt.Sprintf("%d", 7200000+loginSerials.Add(1))
	dir := t.TempDir()
	files := make([]string, len(toks))
	for i, tok := range toks {
		files[i] = loginPINFile(t, dir, tok.Name+".pin", tok.UserPIN)
	}
	faults := slottest.NewFaults()
	g := loginOpen(t, loginGroupCfg(serial, toks, files), filepath.Join(dir, "state"), faults, nil)
	faults.FailN(toks[0].Name, slot.OpLogin, pkcs11.Error(pkcs11.CKR_DEVICE_ERROR), 1)
	err := g.Engine().Login(loginCtx(t), pkcs11.CKU_USER, secret.PINFromString(loginWrongPIN))
	if group.CodeOf(err) != pkcs11.CKR_PIN_INCORRECT {
		t.Fatalf("Login with a wrong PIN, first member down: %v, want CKR_PIN_INCORRECT", err)
	}
	for i, want := range []int{1, 1, 0} {
		if n := faults.Calls(toks[i].Name, slot.OpLogin); n != want {
			t.Errorf("member %d saw %d C_Login calls, want %d", i, n, want)
		}
	}
	if st := loginState(g, toks[0].Name); st != member.Failed {
		t.Errorf("the member that answered CKR_DEVICE_ERROR is %v, want failed", st)
	}
	for _, tok := range toks[1:] {
		if st := loginState(g, tok.Name); st != member.Active {
			t.Errorf("%s is %v after the wrong PIN, want active", tok.Name, st)
		}
	}
}

// TestLoginWrongMemberPINLibrary: a member whose pin_file holds a wrong
// PIN, in a library process (the Go API with its recovery). Before: the
// wrong PIN was offered at every recovery interval, forever. Now: one
// C_Login over more than five intervals, the member marked PIN-blocked
// in the state directory (status, event); a second group sharing the
// state directory (as another process would) sends it no C_Login at all;
// after the pin_file is fixed, a manual Recover clears the mark, tries
// once and brings it back, and the second group's own recovery follows.
func TestLoginWrongMemberPINLibrary(t *testing.T) {
	toks := testhsm.Take(t, 3)
	serial := fmt.Sprintf("%d", 7300000+loginSerials.Add(1))
	loginInstallDomain(t, serial, toks)
	dir := t.TempDir()
	stateDir := filepath.Join(dir, "state")
	files := make([]string, len(toks))
	for i, tok := range toks {
		files[i] = loginPINFile(t, dir, tok.Name+".pin", tok.UserPIN)
	}
	bad := toks[1].Name
	files[1] = loginPINFile(t, dir, bad+".pin", loginWrongPIN)
	cfg := loginGroupCfg(serial, toks, files)

	faults, ev := slottest.NewFaults(), newLoginEvents()
	g := loginOpen(t, cfg, stateDir, faults, ev)
	if err := g.Engine().Login(loginCtx(t), pkcs11.CKU_USER, secret.PINFromString(toks[0].UserPIN)); err != nil {
		t.Fatalf("Login with the right application PIN: %v", err)
	}
	ev.wait(t, "the member's recovery reports the PIN block", func() bool { return ev.count(recover.PINBlocked, bad) > 0 })
	// The behaviour under test is that nothing happens: let five more
	// recovery intervals pass, then count.
	time.Sleep(5*time.Second + 500*time.Millisecond)
	if n := faults.Calls(bad, slot.OpLogin); n != 1 {
		t.Errorf("the member with the wrong pin_file saw %d C_Login calls over more than 5 intervals, want 1", n)
	}
	if n := ev.count(recover.AttemptStarted, bad); n != 0 {
		t.Errorf("%d automatic recovery attempts were made on the PIN-blocked member, want 0", n)
	}
	ms := loginMemberStatus(g, bad)
	if !ms.PINBlocked || !strings.Contains(ms.PINBlockedReason, "CKR_PIN_INCORRECT") || ms.State != member.Failed {
		t.Errorf("status of %s: state %v, PIN blocked %v (%q); want failed, blocked by CKR_PIN_INCORRECT", bad, ms.State, ms.PINBlocked, ms.PINBlockedReason)
	}
	mark := filepath.Join(stateDir, serial, bad+".pinblock")
	if data, err := os.ReadFile(mark); err != nil || strings.Contains(string(data), loginWrongPIN) {
		t.Errorf("mark %s: %v (a PIN in it: %v)", mark, err, strings.Contains(string(data), loginWrongPIN))
	}

	// Another process on the host, sharing the state directory, with the
	// same configuration: the mark keeps the wrong PIN from it too.
	faults2, ev2 := slottest.NewFaults(), newLoginEvents()
	g2 := loginOpen(t, cfg, stateDir, faults2, ev2)
	if err := g2.Engine().Login(loginCtx(t), pkcs11.CKU_USER, secret.PINFromString(toks[0].UserPIN)); err != nil {
		t.Fatalf("second group: Login: %v", err)
	}
	ev2.wait(t, "the second group's recovery sees the mark", func() bool { return ev2.count(recover.PINBlocked, bad) > 0 })
	time.Sleep(5*time.Second + 500*time.Millisecond)
	if n := faults2.Calls(bad, slot.OpLogin); n != 0 {
		t.Errorf("the second group offered the PIN-blocked member %d C_Login calls, want 0", n)
	}
	if st := loginMemberStatus(g2, bad); !st.PINBlocked || st.State != member.Failed {
		t.Errorf("second group: %s is %v, PIN blocked %v; want failed and blocked", bad, st.State, st.PINBlocked)
	}

	// The operator fixes the PIN file and recovers the member.
	loginPINFile(t, dir, bad+".pin", toks[1].UserPIN)
	if _, err := g.Recover(loginCtx(t), bad); err != nil {
		t.Fatalf("manual Recover after the pin_file was fixed: %v", err)
	}
	if st := loginMemberStatus(g, bad); st.State != member.Active || st.PINBlocked {
		t.Errorf("after the manual recover: %v, PIN blocked %v; want active, not blocked", st.State, st.PINBlocked)
	}
	if n := faults.Calls(bad, slot.OpLogin); n != 2 {
		t.Errorf("the manual recover made %d C_Login calls in all, want 2 (the refused one and its own)", n-1)
	}
	if _, err := os.Stat(mark); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the mark is still there after the manual recover: %v", err)
	}
	ev2.wait(t, "the second group recovers the member by itself once the mark is gone", func() bool {
		return loginState(g2, bad) == member.Active
	})
	if n := faults2.Calls(bad, slot.OpLogin); n != 1 {
		t.Errorf("the second group's recovery made %d C_Login calls, want 1", n)
	}
}

// TestLoginSlotForgetsRefusedPIN: a slot whose kept PIN the token stops
// taking (the PIN was changed on the HSM) offers it once, not at every
// re-open: before, each Reinit, new anchor session or lost login logged in
// again with it.
func TestLoginSlotForgetsRefusedPIN(t *testing.T) {
	tok := testhsm.Take(t, 1)[0]
	faults := slottest.NewFaults()
	s, err := slot.Open(loginCtx(t), slot.Spec{Name: tok.Name, Module: tok.Module, TokenLabel: tok.Label,
		PIN: secret.PINFromString(tok.UserPIN), CommandTimeout: 10 * time.Second, Interceptor: faults})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	faults.Fail(tok.Name, slot.OpLogin, pkcs11.Error(pkcs11.CKR_PIN_INCORRECT))
	before := faults.Calls(tok.Name, slot.OpLogin)
	for range 5 {
		s.Reinit(loginCtx(t)) // the first one's re-login is refused
	}
	if n := faults.Calls(tok.Name, slot.OpLogin) - before; n != 1 {
		t.Errorf("5 re-opens after the token refused the kept PIN made %d C_Login calls, want 1", n)
	}
	if s.LoggedIn() {
		t.Errorf("the slot says it is logged in with a refused PIN")
	}
}

// TestLoginURIPINNotEchoed: a PIN put in an RFC 7512 URI, in the path
// (echoed before: "unknown attribute pin-value" with the whole URI) or in
// the query, as pin-value or pin-source, or as a bare path segment, is
// refused with an error that names the attribute and never holds the
// value — from the slot (every face opens tokens through it) and from the
// configuration's validation.
func TestLoginURIPINNotEchoed(t *testing.T) {
	for _, uri := range []string{
		"pkcs11:token=ha-a;pin-value=" + loginURIPIN,
		"pkcs11:token=ha-a;pin-source=file:/run/" + loginURIPIN,
		"pkcs11:token=ha-a?pin-value=" + loginURIPIN,
		"pkcs11:token=ha-a?module-name=softhsm2&pin-source=" + loginURIPIN,
		"pkcs11:token=ha-a;" + loginURIPIN,
	} {
		_, err := slot.Open(loginCtx(t), slot.Spec{Name: "hsm-x", Module: testhsm.SoftHSMModule, URI: uri})
		if err == nil || strings.Contains(err.Error(), loginURIPIN) {
			t.Errorf("slot.Open with a PIN in the URI: %v; want an error without the PIN", err)
		} else if strings.Contains(uri, "pin-") && !strings.Contains(err.Error(), "carries a PIN") {
			t.Errorf("slot.Open: %v; want it to say the URI carries a PIN", err)
		}
		path := filepath.Join(t.TempDir(), "hagroup.toml")
		body := fmt.Sprintf("[[group]]\nlabel = \"g\"\nserial = \"1000001\"\n  [[group.member]]\n  name = \"a\"\n  module = %q\n  uri = %q\n", testhsm.SoftHSMModule, uri)
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err = config.Load(path)
		if err == nil || strings.Contains(err.Error(), loginURIPIN) {
			t.Errorf("config.Load with a PIN in the URI: %v; want an error without the PIN", err)
		}
	}
	if got := slot.RedactURI("pkcs11:token=ha-a;pin-value=" + loginURIPIN + "?pin-source=x"); strings.Contains(got, loginURIPIN) || !strings.Contains(got, "token=ha-a") {
		t.Errorf("RedactURI = %q", got)
	}
}

// TestLoginWrongAppPINModule: through libhapkcs11.so, the attack of issue
// 14 — `pkcs11-tool --login --pin WRONG -O` on the virtual slot with a
// pin_file on every member exited 0 — now fails with CKR_PIN_INCORRECT,
// as on a bare token, and exactly one member's token saw one C_Login
// (counted by the shim under the module). The right PIN opens the slot,
// makes a key through it and signs.
func TestLoginWrongAppPINModule(t *testing.T) {
	bin := loginBuild(t)
	for _, tc := range []struct {
		name string
		pins [3]string
	}{
		{"every member has a pin_file", [3]string{testhsm.UserPIN, testhsm.UserPIN, testhsm.UserPIN}},
		{"no member has a PIN source", [3]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newLoginRig(t, bin, loginRigOpts{pins: tc.pins})
			lib := filepath.Join(r.bin, "libhapkcs11.so")
			bad := []string{"BAD_PIN=" + loginWrongPIN}

			bare, err := r.run(bad, "pkcs11-tool", "--module", filepath.Join(r.bin, "loginshim.so"), "--token-label", r.labels[0], "--login", "--pin", "env:BAD_PIN", "-O")
			if err == nil || !strings.Contains(bare, "CKR_PIN_INCORRECT") {
				t.Fatalf("a bare token with a wrong PIN: %v\n%s", err, bare)
			}
			os.Remove(r.shimLog)

			out, err := r.run(bad, "pkcs11-tool", "--module", lib, "--token-label", loginGroup, "--login", "--pin", "env:BAD_PIN", "-O")
			if err == nil || !strings.Contains(out, "CKR_PIN_INCORRECT") {
				t.Fatalf("the virtual slot with a wrong PIN: %v (want a failure with CKR_PIN_INCORRECT)\n%s", err, out)
			}
			if strings.Contains(out, loginWrongPIN) || strings.Contains(out, testhsm.UserPIN) {
				t.Errorf("a PIN reached pkcs11-tool's output")
			}
			calls := r.logins()
			if len(calls) != 1 || calls[0].rv != loginRVIncorrect {
				t.Errorf("the members' tokens saw %v, want one C_Login answered CKR_PIN_INCORRECT (0xa0)", calls)
			}

			os.Remove(r.shimLog)
			good := []string{"HA_PIN=" + testhsm.UserPIN}
			r.mustRun(good, "pkcs11-tool", "--module", lib, "--slot", loginVirtual, "--login", "--pin", "env:HA_PIN",
				"--keypairgen", "--key-type", "EC:prime256v1", "--label", "login-sig", "--id", "a1")
			data := r.write("data", "the quick brown fox")
			sig := filepath.Join(r.dir, "sig")
			r.mustRun(good, "pkcs11-tool", "--module", lib, "--slot", loginVirtual, "--login", "--pin", "env:HA_PIN",
				"--sign", "--mechanism", "ECDSA", "--id", "a1", "--input-file", data, "--output-file", sig)
			if st, err := os.Stat(sig); err != nil || st.Size() != 64 {
				t.Errorf("signature: %v, want 64 bytes", err)
			}
			for _, c := range r.logins() {
				if c.rv != loginRVOK {
					t.Errorf("with the right PIN a member answered C_Login with %s", c.rv)
				}
			}
		})
	}
}

// TestLoginWrongMemberPINAgent: haagent with a member whose pin_file holds
// a wrong PIN. Before: the agent offered it at every interval, forever.
// Now: one C_Login (counted on the token), then the member is shown
// PIN-blocked (listgroups --json and its table, the HA event log, the
// metrics) and no process sharing the state directory offers it a PIN —
// neither the agent over more than five intervals nor an application
// through libhapkcs11.so. After the operator fixes the file, `hactl
// hagroup recover` clears the mark, makes one C_Login and the member
// returns.
func TestLoginWrongMemberPINAgent(t *testing.T) {
	r := newLoginRig(t, loginBuild(t), loginRigOpts{pins: [3]string{testhsm.UserPIN, loginWrongPIN, testhsm.UserPIN}})
	hactl := filepath.Join(r.bin, "hactl")
	r.agent()
	r.waitMember("hsm-1", "PIN-blocked", func(m loginMemberJSON) bool { return m.PINBlocked })
	// The behaviour under test is that nothing happens: let five recovery
	// intervals pass, then count.
	time.Sleep(5*time.Second + 500*time.Millisecond)
	if n, bad := r.loginsOn("ha-1", ""), r.loginsOn("ha-1", loginRVIncorrect); n != 1 || bad != 1 {
		t.Errorf("the member with the wrong pin_file saw %d C_Login calls (%d refused) over more than 5 intervals, want 1", n, bad)
	}
	m := r.members()["hsm-1"]
	if m.State != "failed" || !strings.Contains(m.PINBlockedReason, "CKR_PIN_INCORRECT") {
		t.Errorf("listgroups --json: %+v, want failed and PIN-blocked by CKR_PIN_INCORRECT", m)
	}
	table, _ := r.run(nil, hactl, "--config", r.conf, "hagroup", "listgroups")
	if !strings.Contains(table, "0 (PIN refused)") {
		t.Errorf("listgroups does not show the PIN block:\n%s", table)
	}
	if line := r.metric(`hagroup_member_pin_blocked{group="signing",member="hsm-1"}`); !strings.HasSuffix(line, " 1") {
		t.Errorf("metrics: %q, want hagroup_member_pin_blocked 1 for hsm-1", line)
	}
	halog := r.mustRun(nil, hactl, "--config", r.conf, "hagroup", "halog", "--group", loginGroup)
	if !strings.Contains(halog, "recovery_pin_blocked") {
		t.Errorf("the HA event log has no recovery_pin_blocked:\n%s", halog)
	}
	for _, s := range []string{table, halog, m.PINBlockedReason} {
		if strings.Contains(s, loginWrongPIN) || strings.Contains(s, testhsm.UserPIN) {
			t.Errorf("a PIN reached hactl's output")
		}
	}

	// An application on the same host and state directory logs in with the
	// right PIN: the blocked member gets no C_Login from it either.
	out := r.mustRun([]string{"HA_PIN=" + testhsm.UserPIN}, "pkcs11-tool", "--module", filepath.Join(r.bin, "libhapkcs11.so"),
		"--slot", loginVirtual, "--login", "--pin", "env:HA_PIN", "-O")
	if strings.Contains(out, testhsm.UserPIN) {
		t.Errorf("a PIN reached pkcs11-tool's output")
	}
	if n := r.loginsOn("ha-1", ""); n != 1 {
		t.Errorf("after an application logged in, the PIN-blocked member saw %d C_Login calls, want still 1", n)
	}

	// The operator fixes the PIN file and recovers the member.
	r.write("pin-1", testhsm.UserPIN+"\n")
	rec := r.mustRun(nil, hactl, "--config", r.conf, "hagroup", "recover", "--group", loginGroup, "--member", "hsm-1")
	r.waitMember("hsm-1", "back in service", func(m loginMemberJSON) bool { return m.State == "active" && !m.PINBlocked })
	calls := r.logins()
	var onBad []string
	for _, c := range calls {
		if c.label == "ha-1" {
			onBad = append(onBad, c.rv)
		}
	}
	if len(onBad) != 2 || onBad[1] != loginRVOK {
		t.Errorf("C_Login answers on the member: %v, want the refused one then one that succeeded (recover said:\n%s)", onBad, rec)
	}
	if line := r.metric(`hagroup_member_pin_blocked{group="signing",member="hsm-1"}`); !strings.HasSuffix(line, " 0") {
		t.Errorf("metrics after the recover: %q, want hagroup_member_pin_blocked 0 for hsm-1", line)
	}
}
