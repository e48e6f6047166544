package ha

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/asn1"
	"encoding/binary"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/recover"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	hasync "github.com/hagroup/hagroup/pkg/sync"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/miekg/pkcs11"
)

// Tests of the composed group on real SoftHSM tokens and real p11-kit
// servers.

func TestMain(m *testing.M) { os.Exit(testhsm.Main(m, 64)) }

var serials atomic.Int64

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// recorder keeps a group's and its recoverer's events and lets a test
// wait for a state.
type recorder struct {
	mu      sync.Mutex
	group   []group.Event
	rec     []recover.Event
	changed chan struct{}
	// onEvent, when set, runs on every group event (before it is kept).
	onEvent func(group.Event)
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{}, 1)} }

func (r *recorder) Event(e group.Event) {
	if r.onEvent != nil {
		r.onEvent(e)
	}
	r.mu.Lock()
	r.group = append(r.group, e)
	r.mu.Unlock()
	r.poke()
}

func (r *recorder) recovery(e recover.Event) {
	r.mu.Lock()
	r.rec = append(r.rec, e)
	r.mu.Unlock()
	r.poke()
}

func (r *recorder) poke() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *recorder) groupEvents(k group.EventKind, memberName string) []group.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []group.Event
	for _, e := range r.group {
		if e.Kind == k && (memberName == "" || e.Member == memberName) {
			out = append(out, e)
		}
	}
	return out
}

// waitFor waits (30 s at most) until cond holds; cond is re-checked after
// every event.
func (r *recorder) waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for !cond() {
		select {
		case <-r.changed:
		case <-deadline:
			t.Fatalf("%s: not within 30s", what)
		}
	}
}

type rigOpts struct {
	toks    []testhsm.Token // members, in order
	standby []int
	mode    string
	faults  slot.Interceptor
	// manual turns automatic recovery off (retries = 0).
	manual   bool
	interval time.Duration
	retries  int
	// plainDomain installs the domain key with a plain CreateObject (p11-kit
	// 0.24 cannot carry domainkey.Install's nested template); otherwise it
	// is installed trusted.
	plainDomain bool
	noDomain    bool
	// extraDomain are tokens outside the group (members to be added)
	// that get the group's domain key too.
	extraDomain []testhsm.Token
	policy      string
	stateDir    bool
}

type rig struct {
	t   testing.TB
	g   *Group
	cfg config.Group
	set config.Settings
	ev  *recorder
}

func memberOf(tok testhsm.Token) config.Member {
	return config.Member{Name: tok.Name, Module: tok.Module, ModuleEnv: tok.ModuleEnv, TokenLabel: tok.Label}
}

func newRig(t testing.TB, o rigOpts) *rig {
	t.Helper()
	serial := fmt.Sprintf("%d", 4000000+serials.Add(1))
	if !o.noDomain {
		installDomain(t, serial, append(append([]testhsm.Token(nil), o.toks...), o.extraDomain...), o.plainDomain)
	}
	cfg := config.Group{Label: "ha-" + serial, Serial: serial}
	for i, tok := range o.toks {
		mc := memberOf(tok)
		for _, s := range o.standby {
			mc.Standby = mc.Standby || s == i
		}
		cfg.Members = append(cfg.Members, mc)
	}
	set := config.Defaults()
	set.CommandTimeout = 10 * time.Second
	set.Interval = time.Second
	if o.interval > 0 {
		set.Interval = o.interval
	}
	set.Retries = -1
	if o.retries != 0 {
		set.Retries = o.retries
	}
	if o.manual {
		set.Retries = 0
	}
	if o.mode != "" {
		set.RecoveryMode = o.mode
	}
	if o.policy != "" {
		set.Policy = o.policy
	}
	ev := newRecorder()
	opts := Options{Events: ev, RecoveryEvents: ev.recovery}
	if o.faults != nil {
		opts.Interceptor = o.faults
	}
	if o.stateDir {
		opts.StateDir = t.TempDir()
	}
	g, err := Open(testCtx(t), cfg, set, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { g.Close() })
	if err := g.Engine().Login(testCtx(t), pkcs11.CKU_USER, secret.PINFromString(testhsm.UserPIN)); err != nil {
		t.Fatalf("Login: %v", err)
	}
	return &rig{t: t, g: g, cfg: cfg, set: set, ev: ev}
}

// groupOn installs a domain key on toks for a new group serial and
// returns the group of toks.
func groupOn(t testing.TB, toks []testhsm.Token) config.Group {
	t.Helper()
	serial := fmt.Sprintf("%d", 4000000+serials.Add(1))
	installDomain(t, serial, toks, false)
	cfg := config.Group{Label: "ha-" + serial, Serial: serial}
	for _, tok := range toks {
		cfg.Members = append(cfg.Members, memberOf(tok))
	}
	return cfg
}

// installDomain gives the tokens one domain key for the group serial.
func installDomain(t testing.TB, serial string, toks []testhsm.Token, plain bool) {
	t.Helper()
	if plain {
		value := make([]byte, 32)
		rand.Read(value)
		for _, tok := range toks {
			s := direct(t, tok)
			tmpl := []*pkcs11.Attribute{
				a(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), a(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
				a(pkcs11.CKA_VALUE, value), a(pkcs11.CKA_LABEL, domainkey.Label(serial)),
				a(pkcs11.CKA_TOKEN, true), a(pkcs11.CKA_PRIVATE, true), a(pkcs11.CKA_SENSITIVE, true),
				a(pkcs11.CKA_EXTRACTABLE, false), a(pkcs11.CKA_WRAP, true), a(pkcs11.CKA_UNWRAP, true),
				// The protection the engine's audit asks of a domain key.
				a(pkcs11.CKA_ENCRYPT, false), a(pkcs11.CKA_DECRYPT, false), a(pkcs11.CKA_SIGN, false),
				a(pkcs11.CKA_VERIFY, false), a(pkcs11.CKA_DERIVE, false),
				a(pkcs11.CKA_MODIFIABLE, false), a(pkcs11.CKA_COPYABLE, false),
				a(pkcs11.CKA_ALLOWED_MECHANISMS, binary.NativeEndian.AppendUint64(nil, pkcs11.CKM_AES_KEY_WRAP_PAD)),
			}
			var err error
			if tok.Module == testhsm.P11KitClient {
				// p11-kit 0.24 carries no unwrap template; such a member
				// cannot wrap either, so it never uses the key.
				_, err = s.CreateObject(testCtx(t), tmpl)
			} else {
				_, err = s.CreateObjectNested(testCtx(t), tmpl, map[uint][]*pkcs11.Attribute{
					pkcs11.CKA_UNWRAP_TEMPLATE: {a(pkcs11.CKA_SENSITIVE, true)}})
			}
			if err != nil {
				t.Fatalf("domain key on %s: %v", tok.Name, err)
			}
		}
		return
	}
	var targets []domainkey.Target
	for _, tok := range toks {
		targets = append(targets, domainkey.Target{Slot: direct(t, tok),
			SOPIN: secret.PINFromString(tok.SOPIN), UserPIN: secret.PINFromString(tok.UserPIN)})
	}
	if err := domainkey.Install(testCtx(t), targets, serial); err != nil {
		t.Fatalf("install domain key: %v", err)
	}
}

// direct opens tok outside the group, logged in (closed at cleanup).
func direct(t testing.TB, tok testhsm.Token) *slot.Slot {
	t.Helper()
	s, err := slot.Open(testCtx(t), slot.Spec{
		Name: tok.Name + "-direct", Module: tok.Module, ModuleEnv: tok.ModuleEnv, TokenLabel: tok.Label,
		PIN: secret.PINFromString(tok.UserPIN), CommandTimeout: 20 * time.Second,
	})
	if err != nil {
		t.Fatalf("open %s directly: %v", tok.Name, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func a(typ uint, v any) *pkcs11.Attribute { return pkcs11.NewAttribute(typ, v) }

var p256 = []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}

func (r *rig) session() *group.Session {
	r.t.Helper()
	s, err := r.g.Engine().OpenSession(testCtx(r.t), pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { s.Close() })
	return s
}

// genEC makes a P-256 key pair through the group.
func genEC(t testing.TB, s *group.Session, label string) (pub, priv group.ObjectHandle) {
	t.Helper()
	pub, priv, err := s.GenerateKeyPair(testCtx(t), pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{a(pkcs11.CKA_EC_PARAMS, p256), a(pkcs11.CKA_TOKEN, true), a(pkcs11.CKA_VERIFY, true), a(pkcs11.CKA_LABEL, label)},
		[]*pkcs11.Attribute{a(pkcs11.CKA_TOKEN, true), a(pkcs11.CKA_PRIVATE, true), a(pkcs11.CKA_SIGN, true),
			a(pkcs11.CKA_SENSITIVE, true), a(pkcs11.CKA_LABEL, label)})
	if err != nil {
		t.Fatalf("GenerateKeyPair %s: %v", label, err)
	}
	return pub, priv
}

// dataTemplate is a private token data object labelled label.
func dataTemplate(label string) []*pkcs11.Attribute {
	return []*pkcs11.Attribute{
		a(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), a(pkcs11.CKA_TOKEN, true), a(pkcs11.CKA_PRIVATE, true),
		a(pkcs11.CKA_LABEL, label), a(pkcs11.CKA_APPLICATION, "hagroup-test"), a(pkcs11.CKA_VALUE, []byte("value of "+label)),
	}
}

// dataObject makes a token data object through the group.
func dataObject(ctx context.Context, s *group.Session, label string) error {
	_, err := s.CreateObject(ctx, dataTemplate(label))
	return err
}

// inventory lists a token directly: identity + fingerprint → count.
func inventory(t testing.TB, s *slot.Slot) map[string]int {
	t.Helper()
	objs, err := hasync.List(testCtx(t), s)
	if err != nil {
		t.Fatalf("list %s: %v", s.Name(), err)
	}
	out := map[string]int{}
	for _, o := range objs {
		out[fmt.Sprintf("%s fp=%x", o.Identity, o.Fingerprint)]++
	}
	return out
}

// diff describes how inventory b differs from a (at most a few lines).
func diff(a, b map[string]int) string {
	var out []string
	for k, n := range a {
		if b[k] != n {
			out = append(out, fmt.Sprintf("%s: %d vs %d", k, n, b[k]))
		}
	}
	for k, n := range b {
		if _, ok := a[k]; !ok {
			out = append(out, fmt.Sprintf("%s: 0 vs %d", k, n))
		}
	}
	if len(out) > 5 {
		out = append(out[:5], fmt.Sprintf("… %d differences", len(out)))
	}
	return fmt.Sprint(out)
}

// hookFaults is slottest.Faults with a hook run (synchronously, on the
// call's goroutine) before every call of one operation on one token.
type hookFaults struct {
	*slottest.Faults
	mu    sync.Mutex
	token string
	op    slot.Op
	hook  func()
}

func (h *hookFaults) set(token string, op slot.Op, hook func()) {
	h.mu.Lock()
	h.token, h.op, h.hook = token, op, hook
	h.mu.Unlock()
}

func (h *hookFaults) Before(ctx context.Context, token string, op slot.Op) error {
	return h.Wrap(ctx, token, op, func() error { return nil })
}

func (h *hookFaults) Wrap(ctx context.Context, token string, op slot.Op, call func() error) error {
	h.mu.Lock()
	hook := h.hook
	if token != h.token || op != h.op {
		hook = nil
	}
	h.mu.Unlock()
	if hook != nil {
		hook()
	}
	return h.Faults.Wrap(ctx, token, op, call)
}

// importEC puts one P-256 key pair, made here, on every token directly (no
// replication needed: members served by p11-kit 0.24 cannot take a
// wrapped key).
func importEC(t testing.TB, toks []testhsm.Token, label string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	point, err := k.PublicKey.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	ecPoint, err := asn1.Marshal(point)
	if err != nil {
		t.Fatal(err)
	}
	scalar, err := k.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	id := []byte("id-" + label)
	for _, tok := range toks {
		s := direct(t, tok)
		for _, tmpl := range [][]*pkcs11.Attribute{
			{a(pkcs11.CKA_CLASS, pkcs11.CKO_PUBLIC_KEY), a(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_EC), a(pkcs11.CKA_TOKEN, true),
				a(pkcs11.CKA_EC_PARAMS, p256), a(pkcs11.CKA_EC_POINT, ecPoint), a(pkcs11.CKA_VERIFY, true),
				a(pkcs11.CKA_LABEL, label), a(pkcs11.CKA_ID, id)},
			{a(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY), a(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_EC), a(pkcs11.CKA_TOKEN, true),
				a(pkcs11.CKA_PRIVATE, true), a(pkcs11.CKA_SENSITIVE, true), a(pkcs11.CKA_EXTRACTABLE, true),
				a(pkcs11.CKA_EC_PARAMS, p256), a(pkcs11.CKA_VALUE, scalar), a(pkcs11.CKA_SIGN, true),
				a(pkcs11.CKA_LABEL, label), a(pkcs11.CKA_ID, id)},
		} {
			if _, err := s.CreateObject(testCtx(t), tmpl); err != nil {
				t.Fatalf("import %s on %s: %v", label, tok.Name, err)
			}
		}
	}
}

// findLabelled returns the labels of the token objects on s whose label
// starts with prefix.
func findLabelled(t testing.TB, s *slot.Slot, prefix string) []string {
	t.Helper()
	objs, err := hasync.List(testCtx(t), s)
	if err != nil {
		t.Fatalf("list %s: %v", s.Name(), err)
	}
	var out []string
	for _, o := range objs {
		if strings.HasPrefix(o.Identity.Label, prefix) {
			out = append(out, o.Identity.Label)
		}
	}
	return out
}

func (r *rig) state(name string) member.State {
	m, ok := r.g.Engine().Member(name)
	if !ok {
		return member.Removed
	}
	return m.State()
}
