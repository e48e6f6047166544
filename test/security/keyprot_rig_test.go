package security

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/miekg/pkcs11"
)

// keyprotSerials gives every group of these tests its own serial (and so
// its own domain key label).
var keyprotSerials atomic.Int64

func keyprotCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func keyprotAttr(t uint, v any) *pkcs11.Attribute { return pkcs11.NewAttribute(t, v) }

// keyprotRig is a 3-member group on real SoftHSM tokens, with a trusted
// domain key (installed with the SO PIN, as `hactl hagroup domain` does),
// and a bare token beside it: the reference every answer is held to.
type keyprotRig struct {
	t       testing.TB
	toks    []testhsm.Token
	cfg     config.Group
	g       *group.Group
	s       *group.Session
	faults  *slottest.Faults
	bareTok testhsm.Token
	bare    keyprotTokenFace
}

func keyprotSetup(t testing.TB) *keyprotRig {
	t.Helper()
	toks := testhsm.Take(t, 3)
	serial := fmt.Sprintf("%d", 7300000+keyprotSerials.Add(1))
	var targets []domainkey.Target
	for _, tok := range toks {
		targets = append(targets, domainkey.Target{Slot: keyprotDirect(t, tok),
			SOPIN: secret.PINFromString(tok.SOPIN), UserPIN: secret.PINFromString(tok.UserPIN)})
	}
	if err := domainkey.Install(keyprotCtx(t), targets, serial); err != nil {
		t.Fatalf("install the domain key: %v", err)
	}
	cfg := config.Group{Label: "ha-" + serial, Serial: serial}
	for _, tok := range toks {
		cfg.Members = append(cfg.Members, config.Member{Name: tok.Name, Module: tok.Module, ModuleEnv: tok.ModuleEnv, TokenLabel: tok.Label})
	}
	r := &keyprotRig{t: t, toks: toks, cfg: cfg, faults: slottest.NewFaults()}
	r.g = keyprotOpen(t, cfg, r.faults)
	s, err := r.g.OpenSession(keyprotCtx(t), pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	r.s = s
	r.bareTok = testhsm.Take(t, 1)[0]
	r.bare = keyprotTokenFace{s: keyprotDirect(t, r.bareTok)}
	return r
}

// keyprotOpen opens the group cfg and logs in: a process of its own, as
// far as the group's state goes.
func keyprotOpen(t testing.TB, cfg config.Group, faults slot.Interceptor) *group.Group {
	t.Helper()
	set := config.Defaults()
	set.CommandTimeout = 20 * time.Second
	set.Retries = 0 // a failed member stays failed: the tests choose who serves
	opts := group.Options{}
	if faults != nil {
		opts.Interceptor = faults
	}
	g, err := group.Open(keyprotCtx(t), cfg, set, opts)
	if err != nil {
		t.Fatalf("open group %s: %v", cfg.Label, err)
	}
	t.Cleanup(func() { g.Close() })
	if err := g.Login(keyprotCtx(t), pkcs11.CKU_USER, secret.PINFromString(testhsm.UserPIN)); err != nil {
		t.Fatalf("Login to group %s: %v", cfg.Label, err)
	}
	return g
}

// keyprotDirect opens tok directly, logged in with the user PIN: what a
// user holding the PIN can do on the member, outside the group.
func keyprotDirect(t testing.TB, tok testhsm.Token) *slot.Slot {
	t.Helper()
	s, err := slot.Open(keyprotCtx(t), slot.Spec{
		Name: tok.Name + "-direct", Module: tok.Module, ModuleEnv: tok.ModuleEnv, TokenLabel: tok.Label,
		PIN: secret.PINFromString(tok.UserPIN), CommandTimeout: 20 * time.Second,
	})
	if err != nil {
		t.Fatalf("open %s directly: %v", tok.Name, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// keyprotFind returns the one object labelled label on the direct slot s.
func keyprotFind(t testing.TB, s *slot.Slot, class uint, label string) pkcs11.ObjectHandle {
	t.Helper()
	hs, err := s.FindObjects(keyprotCtx(t), []*pkcs11.Attribute{keyprotAttr(pkcs11.CKA_CLASS, class), keyprotAttr(pkcs11.CKA_LABEL, label)})
	if err != nil {
		t.Fatalf("%s: find %q: %v", s.Name(), label, err)
	}
	if len(hs) != 1 {
		t.Fatalf("%s: %d objects of class %d labelled %q, want 1", s.Name(), len(hs), class, label)
	}
	return hs[0]
}

// keyprotMaker makes keys on either face: through the group session or
// directly on a bare token, with the same templates, so that the two can
// be compared call for call.
type keyprotMaker interface {
	GenerateKey(ctx context.Context, m *pkcs11.Mechanism, tmpl []*pkcs11.Attribute) (uint, error)
	GenerateKeyPair(ctx context.Context, m *pkcs11.Mechanism, pub, priv []*pkcs11.Attribute) (uint, uint, error)
	CreateObject(ctx context.Context, tmpl []*pkcs11.Attribute) (uint, error)
	WrapKey(ctx context.Context, m *pkcs11.Mechanism, wrapping, key uint) ([]byte, error)
	UnwrapKey(ctx context.Context, m *pkcs11.Mechanism, unwrapping uint, blob []byte, tmpl []*pkcs11.Attribute) (uint, error)
	DeriveKey(ctx context.Context, m *pkcs11.Mechanism, base uint, tmpl []*pkcs11.Attribute) (uint, error)
	CopyObject(ctx context.Context, h uint, tmpl []*pkcs11.Attribute) (uint, error)
	GetAttributes(ctx context.Context, h uint, types []uint) ([]slot.Attribute, error)
	SetAttributes(ctx context.Context, h uint, attrs []*pkcs11.Attribute) error
	Code(err error) uint
}

// keyprotGroupFace is the group, as libhapkcs11.so's virtual slot drives it.
type keyprotGroupFace struct {
	g *group.Group
	s *group.Session
}

func (f keyprotGroupFace) GenerateKey(ctx context.Context, m *pkcs11.Mechanism, tmpl []*pkcs11.Attribute) (uint, error) {
	h, err := f.s.GenerateKey(ctx, m, tmpl)
	return uint(h), err
}

func (f keyprotGroupFace) GenerateKeyPair(ctx context.Context, m *pkcs11.Mechanism, pub, priv []*pkcs11.Attribute) (uint, uint, error) {
	a, b, err := f.s.GenerateKeyPair(ctx, m, pub, priv)
	return uint(a), uint(b), err
}

func (f keyprotGroupFace) CreateObject(ctx context.Context, tmpl []*pkcs11.Attribute) (uint, error) {
	h, err := f.s.CreateObject(ctx, tmpl)
	return uint(h), err
}

func (f keyprotGroupFace) WrapKey(ctx context.Context, m *pkcs11.Mechanism, wrapping, key uint) ([]byte, error) {
	return f.g.WrapKey(ctx, m, group.ObjectHandle(wrapping), group.ObjectHandle(key))
}

func (f keyprotGroupFace) UnwrapKey(ctx context.Context, m *pkcs11.Mechanism, unwrapping uint, blob []byte, tmpl []*pkcs11.Attribute) (uint, error) {
	h, err := f.s.UnwrapKey(ctx, m, group.ObjectHandle(unwrapping), blob, tmpl)
	return uint(h), err
}

func (f keyprotGroupFace) DeriveKey(ctx context.Context, m *pkcs11.Mechanism, base uint, tmpl []*pkcs11.Attribute) (uint, error) {
	h, err := f.s.DeriveKey(ctx, m, group.ObjectHandle(base), tmpl)
	return uint(h), err
}

func (f keyprotGroupFace) CopyObject(ctx context.Context, h uint, tmpl []*pkcs11.Attribute) (uint, error) {
	c, err := f.s.CopyObject(ctx, group.ObjectHandle(h), tmpl)
	return uint(c), err
}

func (f keyprotGroupFace) GetAttributes(ctx context.Context, h uint, types []uint) ([]slot.Attribute, error) {
	return f.g.GetAttributes(ctx, group.ObjectHandle(h), types)
}

func (f keyprotGroupFace) SetAttributes(ctx context.Context, h uint, attrs []*pkcs11.Attribute) error {
	return f.g.SetAttributes(ctx, group.ObjectHandle(h), attrs)
}

func (keyprotGroupFace) Code(err error) uint { return group.CodeOf(err) }

// keyprotTokenFace is one token reached directly: a bare token, or a
// member outside the group.
type keyprotTokenFace struct{ s *slot.Slot }

func (f keyprotTokenFace) GenerateKey(ctx context.Context, m *pkcs11.Mechanism, tmpl []*pkcs11.Attribute) (uint, error) {
	h, err := f.s.GenerateKey(ctx, m, tmpl)
	return uint(h), err
}

func (f keyprotTokenFace) GenerateKeyPair(ctx context.Context, m *pkcs11.Mechanism, pub, priv []*pkcs11.Attribute) (uint, uint, error) {
	a, b, err := f.s.GenerateKeyPair(ctx, m, pub, priv)
	return uint(a), uint(b), err
}

func (f keyprotTokenFace) CreateObject(ctx context.Context, tmpl []*pkcs11.Attribute) (uint, error) {
	h, err := f.s.CreateObject(ctx, tmpl)
	return uint(h), err
}

func (f keyprotTokenFace) WrapKey(ctx context.Context, m *pkcs11.Mechanism, wrapping, key uint) ([]byte, error) {
	return f.s.WrapKey(ctx, m, pkcs11.ObjectHandle(wrapping), pkcs11.ObjectHandle(key))
}

func (f keyprotTokenFace) UnwrapKey(ctx context.Context, m *pkcs11.Mechanism, unwrapping uint, blob []byte, tmpl []*pkcs11.Attribute) (uint, error) {
	h, err := f.s.UnwrapKey(ctx, m, pkcs11.ObjectHandle(unwrapping), blob, tmpl)
	return uint(h), err
}

func (f keyprotTokenFace) DeriveKey(ctx context.Context, m *pkcs11.Mechanism, base uint, tmpl []*pkcs11.Attribute) (uint, error) {
	h, err := f.s.DeriveKey(ctx, m, pkcs11.ObjectHandle(base), tmpl)
	return uint(h), err
}

func (f keyprotTokenFace) CopyObject(ctx context.Context, h uint, tmpl []*pkcs11.Attribute) (uint, error) {
	c, err := f.s.CopyObject(ctx, pkcs11.ObjectHandle(h), tmpl)
	return uint(c), err
}

func (f keyprotTokenFace) GetAttributes(ctx context.Context, h uint, types []uint) ([]slot.Attribute, error) {
	return f.s.GetAttributes(ctx, pkcs11.ObjectHandle(h), types)
}

func (f keyprotTokenFace) SetAttributes(ctx context.Context, h uint, attrs []*pkcs11.Attribute) error {
	return f.s.SetAttributes(ctx, pkcs11.ObjectHandle(h), attrs)
}

func (keyprotTokenFace) Code(err error) uint { return slot.CodeOf(err) }

// keyprotModule builds libhapkcs11.so (as the Makefile does) into a
// directory of the test's and writes a configuration for the group cfg;
// it returns the library and the environment a client needs (the user PIN
// in HA_PIN, for pkcs11-tool's --pin env:HA_PIN: never on a command line).
func keyprotModule(t *testing.T, cfg config.Group) (lib string, env []string) {
	t.Helper()
	dir := t.TempDir()
	_, file, _, _ := runtime.Caller(0)
	repo := filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	lib = filepath.Join(dir, "libhapkcs11.so")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildmode=c-shared", "-o", lib, "./cmd/hapkcs11")
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build libhapkcs11.so: %v\n%s", err, out)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "[agent]\nsocket = %q\nstate_dir = %q\nlog_file = %q\n\n", filepath.Join(dir, "no-agent.sock"), filepath.Join(dir, "state"), filepath.Join(dir, "ha.log"))
	fmt.Fprintf(&b, "[ha]\ncommand_timeout = \"20s\"\n\n[[group]]\nlabel = %q\nserial = %q\n", cfg.Label, cfg.Serial)
	for _, m := range cfg.Members {
		fmt.Fprintf(&b, "\n  [[group.member]]\n  name = %q\n  module = %q\n  token_label = %q\n", m.Name, m.Module, m.TokenLabel)
	}
	conf := filepath.Join(dir, "hagroup.toml")
	if err := os.WriteFile(conf, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	// SOFTHSM2_CONF is the pool's (testhsm.Main set it for this process).
	return lib, append(os.Environ(), "HAGROUP_CONF="+conf, "HA_PIN="+testhsm.UserPIN)
}

// keyprotRV is the CKR a pkcs11-tool run reported, or "CKR_OK" when it
// succeeded.
var keyprotRV = regexp.MustCompile(`rv = (CKR_[A-Z_]+)`)

// keyprotTool runs pkcs11-tool on module and token with the user logged
// in, and returns the CKR code it reported and its output.
func keyprotTool(t *testing.T, env []string, module, token string, args ...string) (string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	all := append([]string{"--module", module, "--token-label", token, "--login", "--pin", "env:HA_PIN"}, args...)
	cmd := exec.CommandContext(ctx, "pkcs11-tool", all...)
	cmd.Env = env
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("pkcs11-tool %s: no answer within the deadline", strings.Join(args, " "))
	}
	if err == nil {
		return "CKR_OK", string(out)
	}
	if m := keyprotRV.FindStringSubmatch(string(out)); m != nil {
		return m[1], string(out)
	}
	return "failed without a CKR", string(out)
}
