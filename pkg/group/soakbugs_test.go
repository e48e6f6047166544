package group

import (
	"testing"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
)

// Regression tests for engine bugs the chaos soak (test/soak) found.

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
	o, _ := f.g.objs.get(pub)
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
