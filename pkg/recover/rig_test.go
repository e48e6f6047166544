package recover

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/asn1"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	hasync "github.com/hagroup/hagroup/pkg/sync"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/hagroup/hagroup/pkg/sync/tombstone"
	"github.com/miekg/pkcs11"
)

// The real-token rig: a group (pkg/group) over SoftHSM tokens, some of
// them served by a real `p11-kit server` that tests kill and restart, a
// tombstone journal in a temporary state directory, and a Recoverer
// wired to the group the way haagent and the PKCS#11 module wire it.

func TestMain(m *testing.M) {
	if os.Getenv(envHelper) == "recover" {
		os.Exit(helperRecover())
	}
	os.Exit(testhsm.Main(m, 200)) // up to ~60 a run, so -count=3 fits
}

var rigSerial atomic.Int64

type rigOpts struct {
	n      int   // members (default 3)
	served []int // indexes of members served by p11-kit (killable)
	// remote: indexes of members served by hsmserve (killable, and
	// unlike p11-kit 0.24 able to take the domain key and replicated keys)
	remote   []int
	interval time.Duration
	retries  int
	clock    Clock
	policy   string
	// importEC names a P-256 key pair imported, with one value, on every
	// member before the group opens (so no replication is needed).
	importEC string
	// interceptor is given to every member's slot in the group.
	interceptor slot.Interceptor
}

type rig struct {
	t        testing.TB
	opts     rigOpts
	toks     []testhsm.Token
	servers  map[string]*testhsm.Served // by member name
	cfg      config.Group
	set      config.Settings
	stateDir string

	g       *group.Group
	rec     *Recoverer
	journal *tombstone.Journal
	gev     *groupEvents
	rev     *events
}

// groupEvents records a group's events and forwards member failures to the
// recoverer, as haagent does.
type groupEvents struct {
	rec     atomic.Pointer[Recoverer]
	mu      sync.Mutex
	all     []group.Event
	changed chan struct{} // signalled after every event
}

func (ge *groupEvents) Event(e group.Event) {
	ge.mu.Lock()
	ge.all = append(ge.all, e)
	ge.mu.Unlock()
	select {
	case ge.changed <- struct{}{}:
	default:
	}
	if e.Kind == group.MemberFailed {
		if r := ge.rec.Load(); r != nil {
			r.MemberFailed(e.Member)
		}
	}
}

func (ge *groupEvents) count(k group.EventKind, name string) int {
	ge.mu.Lock()
	defer ge.mu.Unlock()
	n := 0
	for _, e := range ge.all {
		if e.Kind == k && e.Member == name {
			n++
		}
	}
	return n
}

func rigCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newRig(t testing.TB, o rigOpts) *rig {
	t.Helper()
	if o.n == 0 {
		o.n = 3
	}
	if o.interval == 0 {
		o.interval = time.Second
	}
	if o.policy == "" {
		o.policy = config.DefaultPolicy
	}
	serial := fmt.Sprintf("%d", 3000000+rigSerial.Add(1))
	r := &rig{t: t, opts: o, servers: map[string]*testhsm.Served{}, stateDir: t.TempDir()}
	isServed, isRemote := map[int]bool{}, map[int]bool{}
	for _, i := range o.served {
		isServed[i] = true
	}
	for _, i := range o.remote {
		isRemote[i] = true
	}
	pool := testhsm.Take(t, o.n-len(o.served)-len(o.remote))
	for i := range o.n {
		if isServed[i] || isRemote[i] {
			var srv *testhsm.Served
			if isRemote[i] {
				srv = testhsm.ServeRemote(t, fmt.Sprintf("r%s-%d", serial, i))
			} else {
				srv = testhsm.Serve(t, fmt.Sprintf("s%s-%d", serial, i))
			}
			tok := srv.Token()
			r.servers[tok.Name] = srv
			r.toks = append(r.toks, tok)
			continue
		}
		r.toks = append(r.toks, pool[0])
		pool = pool[1:]
	}
	r.cfg = config.Group{Label: "rec-" + serial, Serial: serial}
	for _, tok := range r.toks {
		r.cfg.Members = append(r.cfg.Members, config.Member{Name: tok.Name, Module: tok.Module, ModuleEnv: tok.ModuleEnv, TokenLabel: tok.Label})
	}
	r.set = config.Defaults()
	r.set.CommandTimeout = 10 * time.Second
	r.set.Interval = o.interval
	r.set.Retries = o.retries
	r.set.Policy = o.policy

	// The group's domain key, on every member.
	if len(o.served) == 0 {
		var dts []domainkey.Target
		for _, tok := range r.toks {
			dts = append(dts, domainkey.Target{Slot: r.direct(tok, "-install")})
		}
		if err := domainkey.Install(rigCtx(t), dts, serial); err != nil {
			t.Fatalf("install domain key: %v", err)
		}
		for _, dt := range dts {
			dt.Slot.Close()
		}
	} else {
		r.plainDomainKey(serial)
	}
	if o.importEC != "" {
		r.importEC(o.importEC)
	}
	r.open()
	t.Cleanup(r.close)
	return r
}

// newP256 makes a P-256 key here: its CKA_EC_POINT and private scalar.
func newP256(t testing.TB) (ecPoint, scalar []byte) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	point, err := k.PublicKey.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	if ecPoint, err = asn1.Marshal(point); err != nil {
		t.Fatal(err)
	}
	if scalar, err = k.Bytes(); err != nil {
		t.Fatal(err)
	}
	return ecPoint, scalar
}

// importEC puts one P-256 key pair, labelled label, on every member.
func (r *rig) importEC(label string) {
	r.t.Helper()
	ecPoint, scalar := newP256(r.t)
	id := []byte("id-" + label)
	for _, tok := range r.toks {
		s := r.direct(tok, "-import")
		for _, tmpl := range [][]*pkcs11.Attribute{
			{rigA(pkcs11.CKA_CLASS, pkcs11.CKO_PUBLIC_KEY), rigA(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_EC), rigA(pkcs11.CKA_TOKEN, true),
				rigA(pkcs11.CKA_EC_PARAMS, rigP256), rigA(pkcs11.CKA_EC_POINT, ecPoint), rigA(pkcs11.CKA_VERIFY, true),
				rigA(pkcs11.CKA_LABEL, label), rigA(pkcs11.CKA_ID, id)},
			{rigA(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY), rigA(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_EC), rigA(pkcs11.CKA_TOKEN, true),
				rigA(pkcs11.CKA_PRIVATE, true), rigA(pkcs11.CKA_SENSITIVE, true), rigA(pkcs11.CKA_EXTRACTABLE, true),
				rigA(pkcs11.CKA_EC_PARAMS, rigP256), rigA(pkcs11.CKA_VALUE, scalar), rigA(pkcs11.CKA_SIGN, true),
				rigA(pkcs11.CKA_LABEL, label), rigA(pkcs11.CKA_ID, id)},
		} {
			if _, err := s.CreateObject(rigCtx(r.t), tmpl); err != nil {
				r.t.Fatalf("import %s on %s: %v", label, tok.Name, err)
			}
		}
		s.Close()
	}
}

// plainDomainKey installs one random AES-256 domain key on every member
// with a plain CreateObject. domainkey.Install cannot be used across
// p11-kit 0.24: its RPC refuses the attribute-array CKA_UNWRAP_TEMPLATE
// that domainkey.Install puts on the key (CKR_DEVICE_ERROR). The key made
// here is what Replicator looks for (domainkey.Find) without that extra
// guard, which these tests do not exercise.
func (r *rig) plainDomainKey(serial string) {
	r.t.Helper()
	value := make([]byte, 32)
	rand.Read(value)
	for _, tok := range r.toks {
		s := r.direct(tok, "-install")
		_, err := s.CreateObject(rigCtx(r.t), []*pkcs11.Attribute{
			rigA(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), rigA(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
			rigA(pkcs11.CKA_VALUE, value), rigA(pkcs11.CKA_LABEL, domainkey.Label(serial)),
			rigA(pkcs11.CKA_TOKEN, true), rigA(pkcs11.CKA_PRIVATE, true), rigA(pkcs11.CKA_SENSITIVE, true),
			rigA(pkcs11.CKA_EXTRACTABLE, false), rigA(pkcs11.CKA_WRAP, true), rigA(pkcs11.CKA_UNWRAP, true),
			rigA(pkcs11.CKA_ENCRYPT, false), rigA(pkcs11.CKA_DECRYPT, false),
		})
		if err != nil {
			r.t.Fatalf("domain key on %s: %v", tok.Name, err)
		}
		s.Close()
	}
}

// direct opens tok outside the group, logged in (closed at cleanup).
func (r *rig) direct(tok testhsm.Token, suffix string) *slot.Slot {
	r.t.Helper()
	s, err := slot.Open(rigCtx(r.t), slot.Spec{
		Name: tok.Name + suffix, Module: tok.Module, ModuleEnv: tok.ModuleEnv, TokenLabel: tok.Label,
		PIN: secret.PINFromString(tok.UserPIN), CommandTimeout: 20 * time.Second,
	})
	if err != nil {
		r.t.Fatalf("open %s directly: %v", tok.Name, err)
	}
	r.t.Cleanup(func() { s.Close() })
	return s
}

// open starts the "process": journal, group (logged in), recoverer.
func (r *rig) open() {
	t := r.t
	t.Helper()
	j, err := tombstone.Open(r.stateDir, r.cfg.Serial, tombstone.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r.journal = j
	// The tombstones on the members too, as ha.Open has them, so that two
	// rigs with two state directories are two hosts sharing the members.
	shared := tombstone.NewShared(j, r.cfg.Serial, tombstone.SharedOptions{})
	r.gev = &groupEvents{changed: make(chan struct{}, 1)}
	r.rev = newEvents()
	gopts := group.Options{Events: r.gev, Tombstones: shared, Interceptor: r.opts.interceptor}
	g, err := group.Open(rigCtx(t), r.cfg, r.set, gopts)
	if err != nil {
		t.Fatalf("open group: %v", err)
	}
	r.g = g
	shared.SetMembers(g.StateSlots)
	if err := g.Login(rigCtx(t), pkcs11.CKU_USER, secret.PINFromString(testhsm.UserPIN)); err != nil {
		t.Fatalf("login: %v", err)
	}
	rec, err := New(Options{
		Engine:     g,
		StateDir:   r.stateDir,
		Interval:   r.opts.interval,
		Retries:    r.opts.retries,
		Tombstones: shared,
		Events:     r.rev.sink,
		Clock:      r.opts.clock,
	})
	if err != nil {
		t.Fatal(err)
	}
	r.rec = rec
	r.gev.rec.Store(rec)
	rec.Resume()
}

// close ends the "process".
func (r *rig) close() {
	if r.rec != nil {
		r.rec.Close()
		r.rec = nil
	}
	if r.g != nil {
		r.g.Close()
		r.g = nil
	}
	if r.journal != nil {
		r.journal.Close()
		r.journal = nil
	}
}

func (r *rig) name(i int) string { return r.toks[i].Name }

func (r *rig) state(name string) member.State {
	m, ok := r.g.Member(name)
	if !ok {
		r.t.Fatalf("no member %s", name)
	}
	return m.State()
}

// waitState waits (with a deadline) until member name is in state st.
func (r *rig) waitState(name string, st member.State) {
	r.t.Helper()
	deadline := time.After(30 * time.Second)
	for r.state(name) != st {
		select {
		case <-r.gev.changed: // every state change is an event
		case <-deadline:
			r.t.Fatalf("member %s is %v, not %v, after 30s", name, r.state(name), st)
		}
	}
}

func (r *rig) session() *group.Session {
	r.t.Helper()
	s, err := r.g.OpenSession(rigCtx(r.t), pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		r.t.Fatal(err)
	}
	return s
}

var rigP256 = []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}

func rigA(typ uint, v any) *pkcs11.Attribute { return pkcs11.NewAttribute(typ, v) }

// genEC makes a P-256 key pair through the group.
func (r *rig) genEC(s *group.Session, label string) (pub, priv group.ObjectHandle) {
	r.t.Helper()
	id := make([]byte, 8)
	rand.Read(id)
	pub, priv, err := s.GenerateKeyPair(rigCtx(r.t), pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{rigA(pkcs11.CKA_EC_PARAMS, rigP256), rigA(pkcs11.CKA_TOKEN, true), rigA(pkcs11.CKA_VERIFY, true),
			rigA(pkcs11.CKA_LABEL, label), rigA(pkcs11.CKA_ID, id)},
		[]*pkcs11.Attribute{rigA(pkcs11.CKA_TOKEN, true), rigA(pkcs11.CKA_PRIVATE, true), rigA(pkcs11.CKA_SIGN, true),
			rigA(pkcs11.CKA_SENSITIVE, true), rigA(pkcs11.CKA_LABEL, label), rigA(pkcs11.CKA_ID, id)})
	if err != nil {
		r.t.Fatalf("generate %s through the group: %v", label, err)
	}
	return pub, priv
}

// recoverExpecting recovers name, and checks that it is back in rotation
// and that every member then holds objects labelled want and no others
// (sorted, one per object, as labels gives them).
func (r *rig) recoverExpecting(name string, want ...string) {
	t := r.t
	t.Helper()
	res, err := r.rec.Recover(rigCtx(t), name)
	if err != nil {
		t.Fatalf("recover %s: %v", name, err)
	}
	if st := r.state(name); st != member.Active {
		t.Fatalf("%s is %v after recovery", name, st)
	}
	for i := range r.toks {
		inv := inventory(t, r.direct(r.toks[i], fmt.Sprintf("-check%d", i)))
		if got := labels(inv); !slices.Equal(got, want) {
			t.Errorf("%s holds %q after %s's recovery, want %q (catch-up: %+v)\n  %s", r.name(i), got, name, want, res.CatchUp, dump(inv))
		}
	}
}

// inventory lists a token directly: "identity fp=…" -> count.
func inventory(t testing.TB, s *slot.Slot) map[string]int {
	t.Helper()
	objs, err := hasync.List(rigCtx(t), s)
	if err != nil {
		t.Fatalf("list %s: %v", s.Name(), err)
	}
	out := map[string]int{}
	for _, o := range objs {
		out[o.Identity.String()+" fp="+hex.EncodeToString(o.Fingerprint)]++
	}
	return out
}

func dump(m map[string]int) string {
	var ks []string
	for k, n := range m {
		ks = append(ks, fmt.Sprintf("%s ×%d", k, n))
	}
	sort.Strings(ks)
	return strings.Join(ks, "\n  ")
}

// labels returns the labels in an inventory, sorted, one per object.
func labels(inv map[string]int) []string {
	var out []string
	for k, n := range inv {
		i := strings.Index(k, `label="`)
		l := k[i+7:]
		l = l[:strings.Index(l, `"`)]
		for range n {
			out = append(out, l)
		}
	}
	sort.Strings(out)
	return out
}
