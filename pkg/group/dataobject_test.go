package group

import (
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/miekg/pkcs11"
)

// TestDataObjectsReplicateWithoutWrapMechanism: when every member lacks
// CKM_AES_KEY_WRAP_PAD (tokens behind p11-kit 0.24 servers), a data object
// (CKO_DATA, whose class value is 0) still reaches every member, since it
// travels by its attributes; it is found by class and label whichever
// member answers, and destroying it through the group removes it from
// every member. (Class 0 was once taken for "unknown, maybe a wrapped
// key", so the object stayed on the creator alone and a search routed to
// another member found nothing.)
func TestDataObjectsReplicateWithoutWrapMechanism(t *testing.T) {
	var toks []testhsm.Token
	for _, name := range []string{"nowrap-a", "nowrap-b", "nowrap-c"} {
		toks = append(toks, testhsm.Serve(t, name).Token())
	}
	f := setup(t, setupOpts{toks: toks, noDomain: true, policy: config.PolicyRoundRobin})
	ctx := testContext(t)
	for _, tok := range toks {
		m, _ := f.g.Member(tok.Name)
		if !m.Lacks(MechWrapPad) {
			t.Fatalf("member %s offers %s; the test needs members without it", tok.Name, MechWrapPad)
		}
	}
	s := openSession(t, f.g)
	byClassAndLabel := func(label string) []*pkcs11.Attribute {
		return []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_LABEL, label)}
	}
	for _, label := range []string{"nowrap-data-1", "nowrap-data-2"} {
		if _, err := s.CreateObject(ctx, []*pkcs11.Attribute{
			attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, false),
			attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_APPLICATION, "regression"), attr(pkcs11.CKA_VALUE, []byte(label)),
		}); err != nil {
			t.Fatalf("create %s: %v", label, err)
		}
		for _, tok := range toks {
			if hs := findDirect(t, openDirect(t, tok), label); len(hs) != 1 {
				t.Errorf("%s after create: member %s holds %d copies; want 1", label, tok.Name, len(hs))
			}
			if u := f.g.Unreplicated(tok.Name); len(u) != 0 {
				t.Errorf("%s after create: member %s counts %v as not replicated; want none", label, tok.Name, u)
			}
		}
		// Round-robin: each search is served by the next member.
		var found []ObjectHandle
		for i := range toks {
			hs, err := f.g.Find(ctx, byClassAndLabel(label))
			if err != nil || len(hs) != 1 {
				t.Errorf("%s: find %d by class and label = %v, %v; want one handle", label, i, hs, err)
			}
			found = hs
		}
		if len(found) != 1 {
			t.Fatalf("%s: nothing to destroy", label)
		}
		if err := f.g.DestroyObject(ctx, found[0]); err != nil {
			t.Fatalf("destroy %s: %v", label, err)
		}
		for _, tok := range toks {
			if hs := findDirect(t, openDirect(t, tok), label); len(hs) != 0 {
				t.Errorf("%s after destroy: member %s still holds %d copies", label, tok.Name, len(hs))
			}
		}
		for i := range toks {
			if hs, err := f.g.Find(ctx, byClassAndLabel(label)); err != nil || len(hs) != 0 {
				t.Errorf("%s: find %d after destroy = %v, %v; want none", label, i, hs, err)
			}
		}
	}
}

// TestFindKeysWhenNoMemberCanWrap: when no member has
// CKM_AES_KEY_WRAP_PAD, a private key held by one member only (the group
// makes none: capability.go; this one was imported on the member) is found
// by a search by class and label whichever member the scheduler would
// pick, and destroying it leaves no copy.
func TestFindKeysWhenNoMemberCanWrap(t *testing.T) {
	var toks []testhsm.Token
	for _, name := range []string{"nowrapkey-a", "nowrapkey-b", "nowrapkey-c"} {
		toks = append(toks, testhsm.Serve(t, name).Token())
	}
	f := setup(t, setupOpts{toks: toks, noDomain: true, policy: config.PolicyRoundRobin})
	ctx := testContext(t)
	importEC(t, toks[1:2], "nowrap-key")
	priv := []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY), attr(pkcs11.CKA_LABEL, "nowrap-key")}
	var found []ObjectHandle
	for i := range 2 * len(toks) {
		hs, err := f.g.Find(ctx, priv)
		if err != nil || len(hs) != 1 {
			t.Errorf("find %d of the private key by class and label = %v, %v; want one handle", i, hs, err)
		}
		found = hs
	}
	if len(found) != 1 {
		t.Fatal("nothing to destroy")
	}
	if err := f.g.DestroyObject(ctx, found[0]); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	for _, tok := range toks {
		d := openDirect(t, tok)
		if hs, err := d.FindObjects(ctx, priv); err != nil || len(hs) != 0 {
			t.Errorf("after destroy: member %s holds %v, %v; want none", tok.Name, hs, err)
		}
	}
	if hs, err := f.g.Find(ctx, priv); err != nil || len(hs) != 0 {
		t.Errorf("find after destroy = %v, %v; want none", hs, err)
	}
}
