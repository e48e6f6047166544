package group

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/recover"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
)

// Regression tests for engine bugs the chaos soak (test/soak) found.

var errGeneral = pkcs11.Error(pkcs11.CKR_GENERAL_ERROR)

// holdsLabel counts the objects labelled label on every token of f,
// looked at directly.
func holdsLabel(t *testing.T, f *fixture, label string) []int {
	t.Helper()
	out := make([]int, len(f.toks))
	for i, tok := range f.toks {
		out[i] = len(findDirect(t, openDirect(t, tok), label))
	}
	return out
}

func wantServing(t *testing.T, f *fixture, what string) {
	t.Helper()
	for _, m := range f.g.Members() {
		if !m.State.Serving() {
			t.Errorf("%s: member %s is %v (%s), want it serving", what, m.Name, m.State, m.LastError)
		}
	}
}

// G2: SoftHSM 2.6 answers a key generation that overlaps another creation
// on the token with CKR_GENERAL_ERROR now and then. One such answer is
// tried again and the key is made and replicated; the primary is not
// failed.
func TestGenerateKeyPairGeneralErrorIsTriedAgain(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{interceptor: faults, policy: "primary-backup"})
	s := openSession(t, f.g)
	primary := f.g.Primary()
	faults.FailN(primary, slot.OpGenerateKeyPair, errGeneral, 1)
	before := faults.Calls(primary, slot.OpGenerateKeyPair) // the wrap probe's trial keys
	genEC(t, s, "flake-once")
	if n := faults.Calls(primary, slot.OpGenerateKeyPair) - before; n != 2 {
		t.Errorf("GenerateKeyPair reached the primary %d times, want 2 (one failed, one tried again)", n)
	}
	wantServing(t, f, "after one CKR_GENERAL_ERROR")
	for i, n := range holdsLabel(t, f, "flake-once") {
		if n != 2 {
			t.Errorf("member %s holds %d objects of the key pair, want 2", f.toks[i].Name, n)
		}
	}
	if n := f.events.count(MemberFailed, ""); n != 0 {
		t.Errorf("%d MemberFailed events, want 0", n)
	}
}

// G2: a creation the primary refuses with CKR_GENERAL_ERROR twice is the
// request's failure (CKR_GENERAL_ERROR to the caller), not the member's:
// not even the last serving member is failed, and it makes the next key.
func TestGeneralErrorNeverFailsTheLastMember(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{interceptor: faults, n: 2, policy: "primary-backup"})
	s := openSession(t, f.g)
	last, other := f.toks[0].Name, f.toks[1].Name
	faults.FailAll(other, errDevice)
	if err := f.g.FailMember(other, errDevice); err != nil {
		t.Fatal(err)
	}
	faults.FailN(last, slot.OpGenerateKeyPair, errGeneral, 2)
	_, _, err := s.GenerateKeyPair(testContext(t), pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{attr(pkcs11.CKA_EC_PARAMS, p256), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_LABEL, "flake-twice")},
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_LABEL, "flake-twice")})
	if CodeOf(err) != pkcs11.CKR_GENERAL_ERROR {
		t.Fatalf("GenerateKeyPair refused twice: %v (0x%x), want CKR_GENERAL_ERROR", err, CodeOf(err))
	}
	if st := memberState(f.g, last); st != member.Active {
		t.Fatalf("the last serving member is %v after a CKR_GENERAL_ERROR, want active", st)
	}
	if f.events.count(GroupDown, "") != 0 {
		t.Fatal("the group went down for a CKR_GENERAL_ERROR")
	}
	if n := holdsLabel(t, f, "flake-twice")[0]; n != 0 {
		t.Errorf("the refused creation left %d objects", n)
	}
	genEC(t, s, "after-flake")
}

// G2: a replication target that answers the unwrap of a copy with
// CKR_GENERAL_ERROR once gets the copy on a second try and stays in
// rotation.
func TestReplicationGeneralErrorIsTriedAgain(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{interceptor: faults, policy: "primary-backup"})
	s := openSession(t, f.g)
	target := f.toks[2].Name
	faults.FailN(target, slot.OpUnwrapKey, errGeneral, 1)
	before := faults.Calls(target, slot.OpUnwrapKey) // the wrap probe's trial keys
	primary := f.toks[0].Name
	wraps := faults.Calls(primary, slot.OpWrapKey)
	genEC(t, s, "target-flake")
	if n := faults.Calls(target, slot.OpUnwrapKey) - before; n != 2 {
		t.Errorf("UnwrapKey reached the target %d times, want 2", n)
	}
	// The answer was the target's: the second try unwraps the blob the
	// primary wrapped once for both targets.
	if n := faults.Calls(primary, slot.OpWrapKey) - wraps; n != 1 {
		t.Errorf("the primary wrapped the private half %d times, want once", n)
	}
	wantServing(t, f, "after a target's CKR_GENERAL_ERROR")
	for i, n := range holdsLabel(t, f, "target-flake") {
		if n != 2 {
			t.Errorf("member %s holds %d objects of the key pair, want 2", f.toks[i].Name, n)
		}
	}
}

// G3: destroying an object that is already gone from a member (another
// process destroyed it there, or a recovery applied its tombstone) counts
// as done there: CKR_OBJECT_HANDLE_INVALID is not a failure of that
// member, and the destroy succeeds.
func TestDestroyOfObjectAlreadyGoneFromAMember(t *testing.T) {
	f := setup(t, setupOpts{policy: "primary-backup"})
	s := openSession(t, f.g)
	pub, _ := genEC(t, s, "gone-on-one")
	ctx := testContext(t)
	// Every member's physical handle is cached; then the public key
	// vanishes from the second and the third member behind the group.
	if _, err := f.g.GetAttributes(ctx, pub, []uint{pkcs11.CKA_LABEL}); err != nil {
		t.Fatal(err)
	}
	o, _ := f.g.objs.Get(pub)
	for _, m := range f.g.view().members {
		if _, err := f.g.resolve(ctx, o, m); err != nil {
			t.Fatalf("resolve on %s: %v", m.Name(), err)
		}
	}
	for _, tok := range f.toks[1:] {
		d := openDirect(t, tok)
		hs, err := d.FindObjects(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_PUBLIC_KEY), attr(pkcs11.CKA_LABEL, "gone-on-one")})
		if err != nil || len(hs) != 1 {
			t.Fatalf("public key on %s: %v, %v", tok.Name, hs, err)
		}
		if err := d.DestroyObject(ctx, hs[0]); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.g.DestroyObject(ctx, pub); err != nil {
		t.Fatalf("DestroyObject: %v", err)
	}
	wantServing(t, f, "after destroying an object already gone from two members")
	if n := f.events.count(ReplicationFailed, ""); n != 0 {
		t.Errorf("%d ReplicationFailed events, want 0", n)
	}
	for i, n := range holdsLabel(t, f, "gone-on-one") {
		if n != 1 { // the private half stays
			t.Errorf("member %s holds %d objects labelled gone-on-one, want 1 (the private key)", f.toks[i].Name, n)
		}
	}
}

// G3, the same at the fault boundary: a member answering
// CKR_OBJECT_HANDLE_INVALID to the destroy (its cached handle is stale)
// is asked again by identity, destroys the object and stays in rotation.
func TestDestroyStaleHandleIsLookedUpAgain(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{interceptor: faults, policy: "primary-backup"})
	s := openSession(t, f.g)
	pub, _ := genEC(t, s, "stale-handle")
	for _, tok := range f.toks {
		faults.FailN(tok.Name, slot.OpDestroyObject, pkcs11.Error(pkcs11.CKR_OBJECT_HANDLE_INVALID), 1)
	}
	if err := f.g.DestroyObject(testContext(t), pub); err != nil {
		t.Fatalf("DestroyObject: %v", err)
	}
	wantServing(t, f, "after stale handles")
	for i, n := range holdsLabel(t, f, "stale-handle") {
		if n != 1 {
			t.Errorf("member %s holds %d objects labelled stale-handle, want 1 (the private key)", f.toks[i].Name, n)
		}
	}
}

// G4: a token's login can end under the group (another process on the
// same token logged out: the login state of a token is shared by everyone
// using it through one module instance, as behind hsmserve). A search
// for an existing private key must still find it.
func TestFindAfterLoginLostUnderTheGroup(t *testing.T) {
	f := setup(t, setupOpts{})
	s := openSession(t, f.g)
	ctx := testContext(t)
	key, err := s.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), []*pkcs11.Attribute{
		attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_LABEL, "lost-login"),
		attr(pkcs11.CKA_VALUE_LEN, 32), attr(pkcs11.CKA_ENCRYPT, true), attr(pkcs11.CKA_DECRYPT, true)})
	if err != nil {
		t.Fatal(err)
	}
	tmpl := []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_LABEL, "lost-login")}
	for _, tok := range f.toks {
		if err := openDirect(t, tok).Logout(ctx); err != nil {
			t.Fatalf("log out %s directly: %v", tok.Name, err)
		}
	}
	hs, err := f.g.Find(ctx, tmpl)
	if err != nil || len(hs) != 1 || hs[0] != key {
		t.Fatalf("Find after the members' login ended under the group = %v, %v; want [%v]", hs, err, key)
	}
	wantServing(t, f, "after the lost login")
}

// G4, the other way a member serves without the login: the application
// logs in while the member is being recovered (re-opened logged out,
// after an outage in activeBasic); it returns to rotation logged in.
func TestMemberRecoveredDuringLoginIsLoggedIn(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{interceptor: faults, n: 2, noLogin: true})
	ctx := testContext(t)
	back := f.toks[1].Name
	faults.FailAll(back, errDevice)
	if err := f.g.FailMember(back, errDevice); err != nil {
		t.Fatal(err)
	}
	faults.Heal(back)
	if _, err := f.g.Reconnect(ctx, back); err != nil {
		t.Fatalf("Reconnect: %v", err)
	}
	if err := f.g.Login(ctx, pkcs11.CKU_USER, pinOf(f.toks[0].UserPIN)); err != nil {
		t.Fatalf("Login: %v", err)
	}
	if err := f.g.ActivateMember(ctx, back); err != nil {
		t.Fatalf("ActivateMember: %v", err)
	}
	m, _ := f.g.Member(back)
	if !m.Slot().LoggedIn() {
		t.Fatal("the member returned to rotation logged out while the group is logged in")
	}
}

// G1: a member that fails again the moment its recovery has returned it
// to rotation — before the recoverer has recorded that success — must be
// recovered again. Its MemberFailed arrived while the recoverer still
// counted the attempt's episode as running (so it started none), and the
// success then ended that episode: the member stayed failed for good, and
// once every member had gone that way the Go engine answered "no healthy
// member" for ever (soak seed 1796061521568879701).
func TestMemberFailingAsItReturnsIsRecoveredAgain(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{interceptor: faults, policy: "primary-backup"})
	signer := ecSigner(t, f.g, "fails-as-it-returns")
	back := f.toks[0].Name // the primary: primary-backup gives it every signature
	rec, err := recover.New(recover.Options{Engine: f.g, Interval: recover.MinInterval, Retries: -1, Tombstones: f.tombs})
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	var again sync.Once
	var againErr error
	hook := func(e Event) {
		switch {
		case e.Kind == MemberFailed:
			rec.MemberFailed(e.Member)
		case e.Kind == MemberRecovered && e.Member == back:
			// The member is back in rotation and the recovery attempt
			// has not returned yet: it dies again under the next
			// signature, which fails over.
			again.Do(func() {
				faults.FailAll(back, errDevice)
				againErr = sign(t, signer)
				faults.Heal(back)
			})
		}
	}
	f.events.hook.Store(&hook)
	faults.FailAll(back, errDevice)
	if err := sign(t, signer); err != nil {
		t.Fatalf("sign with the primary down: %v", err)
	}
	if st := memberState(f.g, back); st != member.Failed {
		t.Fatalf("the primary is %v, want failed", st)
	}
	faults.Heal(back)
	deadline := time.After(15 * time.Second)
	for f.events.count(MemberRecovered, back) < 2 {
		select {
		case <-f.events.ch:
		case <-deadline:
			t.Fatalf("member %s was recovered %d times and is %v; want it recovered again after it failed as it returned",
				back, f.events.count(MemberRecovered, back), memberState(f.g, back))
		}
	}
	if againErr != nil {
		t.Errorf("the signature that failed the returning member over: %v", againErr)
	}
	if n := f.events.count(MemberFailed, back); n != 2 {
		t.Errorf("member %s failed %d times, want 2", back, n)
	}
	if st := memberState(f.g, back); st != member.Active {
		t.Errorf("member %s is %v, want active", back, st)
	}
}

// A primary that dies under the copies of the key pair it has just made,
// before any other member holds them whole, leaves no serving member with
// the key: the creation fails (CKR_DEVICE_ERROR, as a primary failing
// during the creation itself does) instead of returning handles no live
// member can use (the soak's "find did not see <key>, created by this
// worker").
func TestPrimaryDyingBeforeAnyCopyFailsTheCreation(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{interceptor: faults, policy: "primary-backup"})
	s := openSession(t, f.g)
	primary := f.toks[0].Name
	faults.Fail(primary, slot.OpWrapKey, errDevice) // the private half cannot leave it
	_, _, err := s.GenerateKeyPair(testContext(t), pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{attr(pkcs11.CKA_EC_PARAMS, p256), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_LABEL, "orphan")},
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_LABEL, "orphan")})
	if CodeOf(err) != pkcs11.CKR_DEVICE_ERROR {
		t.Fatalf("GenerateKeyPair with the primary dying under the copies: %v (0x%x), want CKR_DEVICE_ERROR", err, CodeOf(err))
	}
	if st := memberState(f.g, primary); st != member.Failed {
		t.Errorf("the primary is %v, want failed", st)
	}
	for i, n := range holdsLabel(t, f, "orphan")[1:] {
		if n != 0 {
			t.Errorf("member %s holds %d objects of the failed creation, want 0", f.toks[i+1].Name, n)
		}
	}
	hs, err := f.g.Find(testContext(t), []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, "orphan")})
	if err != nil || len(hs) != 0 {
		t.Errorf("Find after the failed creation = %v, %v; want none", hs, err)
	}
	wantServingExcept(t, f, primary)
}

func wantServingExcept(t *testing.T, f *fixture, except string) {
	t.Helper()
	for _, m := range f.g.Members() {
		if m.Name != except && !m.State.Serving() {
			t.Errorf("member %s is %v (%s), want it serving", m.Name, m.State, m.LastError)
		}
	}
}

// A destroy reaches a member the group had found without the object when
// the object has come there since (another process's replication or
// catch-up put it there): "absent" is looked at again, and the object
// does not stay behind to come back everywhere (the soak's destroyed
// key pairs present on every member).
func TestDestroyReachesAMemberOnceFoundWithout(t *testing.T) {
	f := setup(t, setupOpts{policy: "primary-backup"})
	s := openSession(t, f.g)
	pub, _ := genEC(t, s, "came-back")
	ctx := testContext(t)
	tmpl := []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_PUBLIC_KEY), attr(pkcs11.CKA_LABEL, "came-back")}
	src, dst := openDirect(t, f.toks[0]), openDirect(t, f.toks[2])
	hs, err := src.FindObjects(ctx, tmpl)
	if err != nil || len(hs) != 1 {
		t.Fatalf("public key on %s: %v, %v", f.toks[0].Name, hs, err)
	}
	types := []uint{pkcs11.CKA_CLASS, pkcs11.CKA_KEY_TYPE, pkcs11.CKA_TOKEN, pkcs11.CKA_LABEL, pkcs11.CKA_ID, pkcs11.CKA_EC_PARAMS, pkcs11.CKA_EC_POINT, pkcs11.CKA_VERIFY}
	attrs, err := src.GetAttributes(ctx, hs[0], types)
	if err != nil {
		t.Fatal(err)
	}
	var copyTmpl []*pkcs11.Attribute
	for _, a := range attrs {
		copyTmpl = append(copyTmpl, pkcs11.NewAttribute(a.Type, a.Value))
	}
	// The third member loses the key, the group finds it absent there,
	// and then it is put back behind the group's back.
	dh, err := dst.FindObjects(ctx, tmpl)
	if err != nil || len(dh) != 1 {
		t.Fatalf("public key on %s: %v, %v", f.toks[2].Name, dh, err)
	}
	if err := dst.DestroyObject(ctx, dh[0]); err != nil {
		t.Fatal(err)
	}
	o, _ := f.g.objs.Get(pub)
	m2, _ := f.g.Member(f.toks[2].Name)
	o.Forget(m2.Index())
	if _, err := f.g.resolve(ctx, o, m2); !errors.Is(err, errAbsent) {
		t.Fatalf("resolve on %s after the key was taken away: %v, want errAbsent", m2.Name(), err)
	}
	if _, err := dst.CreateObject(ctx, copyTmpl); err != nil {
		t.Fatalf("put the key back on %s: %v", f.toks[2].Name, err)
	}
	if err := f.g.DestroyObject(ctx, pub); err != nil {
		t.Fatalf("DestroyObject: %v", err)
	}
	for i, tok := range f.toks {
		if n := len(findDirect(t, openDirect(t, tok), "came-back")); n != 1 { // the private half stays
			t.Errorf("member %s (%d) holds %d objects labelled came-back, want 1 (the private key)", tok.Name, i, n)
		}
	}
}

// G4 in the look-up of one object on one member: with the member's login
// ended under the group, a private key is not taken as absent there.
func TestResolveAfterLoginLostUnderTheGroup(t *testing.T) {
	f := setup(t, setupOpts{})
	s := openSession(t, f.g)
	_, priv := genEC(t, s, "lost-login-resolve")
	ctx := testContext(t)
	o, _ := f.g.objs.Get(priv)
	for _, tok := range f.toks {
		if err := openDirect(t, tok).Logout(ctx); err != nil {
			t.Fatalf("log out %s directly: %v", tok.Name, err)
		}
	}
	for _, m := range f.g.view().members {
		o.Forget(m.Index())
		if _, err := f.g.resolve(ctx, o, m); err != nil {
			t.Errorf("resolve of the private key on %s after its login ended under the group: %v", m.Name(), err)
		}
	}
}

// A replication target that fails under the public half of a new key
// pair is not sent the private half: a member that dies under the copies
// must not keep a private key without its public half, which SoftHSM will
// not fingerprint and which its recovery then reports as a second key
// under the same identity, keeping it out for good (soak: "conflict:
// fingerprints none on m3; … on m0,m1,m2").
func TestReplicationSendsNoPrivateHalfAfterThePublicFailed(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{interceptor: faults, policy: "primary-backup"})
	s := openSession(t, f.g)
	target := f.toks[2].Name
	faults.Fail(target, slot.OpCreateObject, errDevice) // public keys travel by CreateObject
	before := faults.Calls(target, slot.OpUnwrapKey)    // the wrap probe's trial keys
	genEC(t, s, "public-first")
	if n := faults.Calls(target, slot.OpUnwrapKey) - before; n != 0 {
		t.Errorf("the private half was sent (%d unwraps) to a target that failed under the public half", n)
	}
	if st := memberState(f.g, target); st != member.Failed {
		t.Errorf("the target is %v, want failed", st)
	}
	faults.Heal(target)
	if n := holdsLabel(t, f, "public-first")[2]; n != 0 {
		t.Errorf("the target holds %d objects of the pair, want 0", n)
	}
}

// A primary that dies under the copies after one target got the new key
// pair whole: the other targets get it from that one instead of staying
// in rotation without it (the soak's "find did not see <key>, created by
// this thread": a search routed to such a target found nothing).
func TestTargetsLeftByADyingPrimaryGetTheKeyFromAnotherHolder(t *testing.T) {
	faults := slottest.NewFaults()
	toks := takeTokens(t, 3)
	primary := toks[0].Name
	dies := &dieAfterWrap{Faults: faults, token: primary}
	f := setup(t, setupOpts{toks: toks, interceptor: dies, policy: "primary-backup"})
	s := openSession(t, f.g)
	// The private half is wrapped once for both targets, and that wrap
	// answers CKR_GENERAL_ERROR: each target asks again with a wrap of its
	// own. The first of those to reach the primary goes through, and the
	// primary dies before the second: one target holds the pair whole,
	// the other's copy fails at the source.
	dies.armed.Store(true)
	genEC(t, s, "resourced")
	if st := memberState(f.g, primary); st != member.Failed {
		t.Errorf("the primary is %v, want failed", st)
	}
	wantServingExcept(t, f, primary)
	for i, n := range holdsLabel(t, f, "resourced") {
		if n != 2 {
			t.Errorf("member %s holds %d objects of the key pair, want 2", f.toks[i].Name, n)
		}
	}
	for _, tok := range f.toks[1:] {
		hs, err := f.g.Find(testContext(t), []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY), attr(pkcs11.CKA_LABEL, "resourced")})
		if err != nil || len(hs) != 1 {
			t.Errorf("Find of the private key (serving: %s and the other) = %v, %v; want one", tok.Name, hs, err)
		}
	}
}

// dieAfterWrap is slottest.Faults where, once armed, token's wraps
// answer in turn CKR_GENERAL_ERROR, then the module's answer, then
// CKR_DEVICE_ERROR for good, in the order they reach the token (decided
// as they arrive: two wraps at once cannot both go through).
type dieAfterWrap struct {
	*slottest.Faults
	token string
	armed atomic.Bool
	wraps atomic.Int32
}

func (d *dieAfterWrap) Before(ctx context.Context, token string, op slot.Op) error {
	return d.Wrap(ctx, token, op, func() error { return nil })
}

func (d *dieAfterWrap) Wrap(ctx context.Context, token string, op slot.Op, call func() error) error {
	if token == d.token && op == slot.OpWrapKey && d.armed.Load() {
		switch d.wraps.Add(1) {
		case 1:
			return errGeneral
		case 2:
		default:
			return errDevice
		}
	}
	return d.Faults.Wrap(ctx, token, op, call)
}

// The soak (session 19, seed 1796684424948840486): the only serving member
// answered one C_Sign with CKR_GENERAL_ERROR, and the application got it.
// A request that leaves no state and changes no object is asked once more
// of that member when no other can serve it: a passing answer is then
// served and charges nothing; an answer given twice is the token's and
// goes to the caller, failing no member (failure_threshold = 1). Where
// another member serves, the first is charged as before.
func TestLoneMemberAskedAgainAfterAmbiguousAnswer(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{interceptor: faults, n: 2, threshold: 1, policy: "primary-backup"})
	s := openSession(t, f.g)
	ctx := testContext(t)
	key := macKey(t, s, "k")
	lone, other := f.toks[0].Name, f.toks[1].Name
	faults.FailAll(other, errDevice)
	if err := f.g.FailMember(other, errDevice); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		flakes   int
		want     pkcs11.Error // 0: served
		reaching int          // calls that reach the lone member
	}{{1, 0, 2}, {2, pkcs11.CKR_GENERAL_ERROR, 2}} {
		before := faults.Calls(lone, slot.OpSign)
		faults.FailN(lone, slot.OpSign, errGeneral, c.flakes)
		_, err := f.g.Sign(ctx, hmac, key, []byte("data"))
		if CodeOf(err) != uint(c.want) {
			t.Errorf("%d CKR_GENERAL_ERROR(s) from the lone member: Sign answered %v, want 0x%x", c.flakes, err, uint(c.want))
		}
		if n := faults.Calls(lone, slot.OpSign) - before; n != c.reaching {
			t.Errorf("%d CKR_GENERAL_ERROR(s): the request reached the lone member %d times, want %d", c.flakes, n, c.reaching)
		}
		if st := memberState(f.g, lone); st != member.Active {
			t.Fatalf("%d CKR_GENERAL_ERROR(s): the lone member is %v, want active", c.flakes, st)
		}
	}
	if n := f.events.count(MemberFailed, lone); n != 0 {
		t.Errorf("%d MemberFailed events for the lone member, want 0", n)
	}
}
