package group

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/asn1"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/hagroup/hagroup/pkg/sync/tombstone"
	"github.com/miekg/pkcs11"
)

// poolSize tokens are made for the package's tests, and three more that
// Take never hands out for Example, which names them by label.
const poolSize = 297

func TestMain(m *testing.M) {
	os.Exit(testhsm.Main(m, poolSize, "example-a", "example-b", "example-c"))
}

var serials atomic.Int64

// testContext bounds a test's calls.
func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// eventLog records a group's events and lets a test wait for one.
type eventLog struct {
	mu     sync.Mutex
	events []Event
	ch     chan struct{}
	// hook, when set, is called with every event, synchronously, as a
	// program's event sink would be (after it is recorded).
	hook atomic.Pointer[func(Event)]
}

func newEventLog() *eventLog { return &eventLog{ch: make(chan struct{}, 1)} }

func (l *eventLog) Event(e Event) {
	defer func() {
		if h := l.hook.Load(); h != nil {
			(*h)(e)
		}
	}()
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
	select {
	case l.ch <- struct{}{}:
	default:
	}
}

func (l *eventLog) all() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.events...)
}

func (l *eventLog) count(kind EventKind, memberName string) int {
	n := 0
	for _, e := range l.all() {
		if e.Kind == kind && (memberName == "" || e.Member == memberName) {
			n++
		}
	}
	return n
}

// fixture is a group over fresh SoftHSM tokens.
type fixture struct {
	g      *Group
	toks   []testhsm.Token
	cfg    config.Group
	set    config.Settings
	events *eventLog
	tombs  *tombstone.Memory
	// journal is the group's tombstone store when setupOpts.journal is
	// set (tombs is then unused).
	journal *tombstone.Journal
}

type setupOpts struct {
	n           int
	policy      string
	timeout     time.Duration
	keygen      time.Duration // keygen_timeout (default: the configuration's)
	threshold   int
	standby     []int // indexes of standby members
	interceptor slot.Interceptor
	noLogin     bool
	noDomain    bool
	untrusted   bool
	toks        []testhsm.Token // use these instead of fresh pool tokens
	mode        string          // recovery mode (default activeBasic)
	journal     bool            // tombstones in a journal in a temp state dir, as haagent keeps them
	ownPINs     bool            // every member reads its PIN from $HAGROUP_TEST_PIN
	noHedge     bool            // hedge = false
	dispatch    string          // every member's dispatch (default: the configuration's)
}

func memberCfg(tok testhsm.Token) config.Member {
	return config.Member{Name: tok.Name, Module: tok.Module, ModuleEnv: tok.ModuleEnv, InitArgs: tok.InitArgs, TokenLabel: tok.Label}
}

func setup(t testing.TB, o setupOpts) *fixture {
	t.Helper()
	if o.n == 0 {
		o.n = 3
	}
	toks := o.toks
	if toks == nil {
		toks = testhsm.Take(t, o.n)
	}
	serial := fmt.Sprintf("%d", 2000000+serials.Add(1))
	if !o.noDomain {
		installDomain(t, serial, toks, !o.untrusted)
	}
	cfg := config.Group{Label: "ha-" + serial, Serial: serial}
	for i, tok := range toks {
		mc := memberCfg(tok)
		mc.Dispatch = o.dispatch
		for _, s := range o.standby {
			mc.Standby = mc.Standby || s == i
		}
		if tok.UserPIN != toks[0].UserPIN { // a make with PINs of its own (opencryptoki)
			mc.PINFile = pinFile(t, tok.UserPIN)
		}
		if o.ownPINs {
			t.Setenv("HAGROUP_TEST_PIN", toks[0].UserPIN)
			mc.PINEnv = "HAGROUP_TEST_PIN"
		}
		cfg.Members = append(cfg.Members, mc)
	}
	set := config.Defaults()
	set.CommandTimeout = 10 * time.Second
	if o.timeout > 0 {
		set.CommandTimeout = o.timeout
	}
	if o.keygen > 0 {
		set.KeygenTimeout = o.keygen
	}
	if o.policy != "" {
		set.Policy = o.policy
	}
	if o.threshold > 0 {
		set.FailureThreshold = o.threshold
	}
	if o.mode != "" {
		set.RecoveryMode = o.mode
	}
	set.Hedge = !o.noHedge
	f := &fixture{toks: toks, cfg: cfg, set: set, events: newEventLog(), tombs: &tombstone.Memory{}}
	var tombs Tombstones = f.tombs
	if o.journal {
		j, err := tombstone.Open(t.TempDir(), serial, tombstone.Options{})
		if err != nil {
			t.Fatalf("open tombstone journal: %v", err)
		}
		t.Cleanup(func() { j.Close() })
		f.journal, tombs = j, j
	}
	g, err := Open(testContext(t), cfg, set, Options{Events: f.events, Interceptor: o.interceptor, Tombstones: tombs})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { g.Close() })
	f.g = g
	if !o.noLogin {
		if err := g.Login(testContext(t), pkcs11.CKU_USER, secret.PINFromString(toks[0].UserPIN)); err != nil {
			t.Fatalf("Login: %v", err)
		}
	}
	return f
}

// openDirect opens a token directly (not through the group), logged in.
func openDirect(t testing.TB, tok testhsm.Token) *slot.Slot {
	t.Helper()
	s, err := slot.Open(testContext(t), slot.Spec{
		Name:           tok.Name + "-direct",
		Module:         tok.Module,
		ModuleEnv:      tok.ModuleEnv,
		InitArgs:       tok.InitArgs,
		TokenLabel:     tok.Label,
		PIN:            secret.PINFromString(tok.UserPIN),
		CommandTimeout: 20 * time.Second,
	})
	if err != nil {
		t.Fatalf("open %s directly: %v", tok.Name, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// installDomain gives the tokens one domain key for the group serial,
// trusted (made by the SO) or not.
func installDomain(t testing.TB, serial string, toks []testhsm.Token, trusted bool) {
	t.Helper()
	var targets []domainkey.Target
	var slots []*slot.Slot
	for _, tok := range toks {
		s, err := slot.Open(testContext(t), slot.Spec{
			Name: tok.Name + "-install", Module: tok.Module, ModuleEnv: tok.ModuleEnv, TokenLabel: tok.Label,
			PIN: secret.PINFromString(tok.UserPIN), CommandTimeout: 20 * time.Second,
		})
		if err != nil {
			t.Fatalf("open %s for the domain key: %v", tok.Name, err)
		}
		slots = append(slots, s)
		dt := domainkey.Target{Slot: s}
		if trusted {
			dt.SOPIN = secret.PINFromString(tok.SOPIN)
			dt.UserPIN = secret.PINFromString(tok.UserPIN)
		}
		targets = append(targets, dt)
	}
	err := domainkey.Install(testContext(t), targets, serial)
	for _, s := range slots {
		s.Close()
	}
	if err != nil {
		t.Fatalf("install domain key: %v", err)
	}
}

func attr(t uint, v any) *pkcs11.Attribute { return pkcs11.NewAttribute(t, v) }

var p256 = []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}

var ed25519Params = []byte{0x06, 0x03, 0x2b, 0x65, 0x70} // the curve of Ed25519

// genEC makes a P-256 token key pair through the group.
func genEC(t testing.TB, s *Session, label string, extraPriv ...*pkcs11.Attribute) (pub, priv ObjectHandle) {
	t.Helper()
	pub, priv, err := s.GenerateKeyPair(testContext(t), pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{attr(pkcs11.CKA_EC_PARAMS, p256), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_VERIFY, true), attr(pkcs11.CKA_LABEL, label)},
		append([]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SIGN, true),
			attr(pkcs11.CKA_SENSITIVE, true), attr(pkcs11.CKA_LABEL, label)}, extraPriv...))
	if err != nil {
		t.Fatalf("GenerateKeyPair %s: %v", label, err)
	}
	return pub, priv
}

func openSession(t testing.TB, g *Group) *Session {
	t.Helper()
	s, err := g.OpenSession(testContext(t), pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func memberState(g *Group, name string) member.State {
	m, _ := g.Member(name)
	return m.State()
}

// findDirect lists the objects with the given label on a direct slot.
func findDirect(t testing.TB, s *slot.Slot, label string) []pkcs11.ObjectHandle {
	t.Helper()
	hs, err := s.FindObjects(testContext(t), []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, label)})
	if err != nil {
		t.Fatalf("find %q on %s: %v", label, s.Name(), err)
	}
	return hs
}

// pinFile writes pin to a file of the test's, for a member with a PIN of
// its own.
func pinFile(t testing.TB, pin string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pin")
	if err := os.WriteFile(path, []byte(pin+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func pinOf(s string) secret.PIN { return secret.PINFromString(s) }

// importEC puts one P-256 key pair, made here, on every token directly (as
// an operator would before forming a group), so that groups without a
// domain key (served members) share a key.
func importEC(t testing.TB, toks []testhsm.Token, label string) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	point, err := asn1.Marshal(elliptic.Marshal(elliptic.P256(), k.X, k.Y)) //nolint:staticcheck // the PKCS#11 encoding
	if err != nil {
		t.Fatal(err)
	}
	importPair(t, toks, label, pkcs11.CKK_EC,
		[]*pkcs11.Attribute{attr(pkcs11.CKA_EC_PARAMS, p256), attr(pkcs11.CKA_EC_POINT, point)},
		[]*pkcs11.Attribute{attr(pkcs11.CKA_EC_PARAMS, p256), attr(pkcs11.CKA_VALUE, k.D.FillBytes(make([]byte, 32)))})
	return k
}

// importRSA puts one RSA-2048 key pair, made here, on every token
// directly, as importEC does, for makes that hold no EC key.
func importRSA(t testing.TB, toks []testhsm.Token, label string) *rsa.PrivateKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	e := big.NewInt(int64(k.E)).Bytes()
	importPair(t, toks, label, pkcs11.CKK_RSA,
		[]*pkcs11.Attribute{attr(pkcs11.CKA_MODULUS, k.N.Bytes()), attr(pkcs11.CKA_PUBLIC_EXPONENT, e)},
		[]*pkcs11.Attribute{attr(pkcs11.CKA_MODULUS, k.N.Bytes()), attr(pkcs11.CKA_PUBLIC_EXPONENT, e),
			attr(pkcs11.CKA_PRIVATE_EXPONENT, k.D.Bytes()), attr(pkcs11.CKA_PRIME_1, k.Primes[0].Bytes()), attr(pkcs11.CKA_PRIME_2, k.Primes[1].Bytes()),
			attr(pkcs11.CKA_EXPONENT_1, k.Precomputed.Dp.Bytes()), attr(pkcs11.CKA_EXPONENT_2, k.Precomputed.Dq.Bytes()),
			attr(pkcs11.CKA_COEFFICIENT, k.Precomputed.Qinv.Bytes())})
	return k
}

// importPair creates a public and a private key of keyType, labelled
// label, with the given key material, on every token directly.
func importPair(t testing.TB, toks []testhsm.Token, label string, keyType uint, pub, priv []*pkcs11.Attribute) {
	t.Helper()
	id := []byte("id-" + label)
	for _, tok := range toks {
		d := openDirect(t, tok)
		ctx := testContext(t)
		if _, err := d.CreateObject(ctx, append([]*pkcs11.Attribute{
			attr(pkcs11.CKA_CLASS, pkcs11.CKO_PUBLIC_KEY), attr(pkcs11.CKA_KEY_TYPE, keyType),
			attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_VERIFY, true), attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_ID, id),
		}, pub...)); err != nil {
			t.Fatalf("import public key on %s: %v", tok.Name, err)
		}
		if _, err := d.CreateObject(ctx, append([]*pkcs11.Attribute{
			attr(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY), attr(pkcs11.CKA_KEY_TYPE, keyType),
			attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SIGN, true),
			attr(pkcs11.CKA_SENSITIVE, true), attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_ID, id),
		}, priv...)); err != nil {
			t.Fatalf("import private key on %s: %v", tok.Name, err)
		}
	}
}

// importSecret puts one generic secret (HMAC) key on every token directly.
func importSecret(t testing.TB, toks []testhsm.Token, label string) {
	t.Helper()
	v := make([]byte, 32)
	rand.Read(v)
	for _, tok := range toks {
		d := openDirect(t, tok)
		if _, err := d.CreateObject(testContext(t), []*pkcs11.Attribute{
			attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_GENERIC_SECRET),
			attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_VERIFY, true),
			attr(pkcs11.CKA_SENSITIVE, true), attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_ID, []byte("id-"+label)),
			attr(pkcs11.CKA_VALUE, v),
		}); err != nil {
			t.Fatalf("import secret on %s: %v", tok.Name, err)
		}
	}
}

func takeTokens(t testing.TB, n int) []testhsm.Token { return testhsm.Take(t, n) }

// bareMember is a member with no slot, for the scheduler's and the hedge's
// arithmetic: its calls are counted with Begin and End.
func bareMember(t *testing.T, name string, index int) *member.Member {
	t.Helper()
	m, err := member.New(member.Config{Name: name, Index: index}, nil, member.Failed, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
