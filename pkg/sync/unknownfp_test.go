package sync_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync"
	"github.com/miekg/pkcs11"
)

// dropPublicHalf destroys the public half of the EC pair labelled label
// on s: SoftHSM then cannot give the private half's fingerprint (it hides
// an EC private key's point), so a listing shows it with none.
func dropPublicHalf(t *testing.T, s *slot.Slot, label string) {
	t.Helper()
	dropped := false
	for _, o := range planFind(t, s, label) {
		if o.Class == pkcs11.CKO_PUBLIC_KEY {
			if err := s.DestroyObject(planCtx(t), o.Handle); err != nil {
				t.Fatal(err)
			}
			dropped = true
		}
	}
	if !dropped {
		t.Fatalf("%s holds no public half of %s", s.Name(), label)
	}
	for _, o := range planFind(t, s, label) {
		if o.Class == pkcs11.CKO_PRIVATE_KEY && o.Fingerprint != nil {
			t.Fatalf("the private half of %s on %s still has a fingerprint without its public half: the test cannot make an unknown one", label, s.Name())
		}
	}
}

// An object whose fingerprint one member cannot compute matches the one
// fingerprint the others know: no conflict (soak: "fingerprints none on
// m3; X on m0,…" kept m3 out of service for good), nothing copied over
// it, and the public half it lacks is copied back, after which all agree.
// Only two known fingerprints that differ are a conflict; objects no
// member can fingerprint are one version. (One test, one set of tokens:
// the package's token pool is shared by every test.)
func TestPlanUnknownFingerprint(t *testing.T) {
	ms := planMembers(t, 3, nil)
	planGenEC(t, ms[0].Slot, "k", planID(t))
	planApply(t, planMake(t, ms, nil, sync.PlanOptions{}))
	planAllEqual(t, ms)
	dropPublicHalf(t, ms[2].Slot, "k")

	p := planMake(t, ms, nil, sync.PlanOptions{})
	if len(p.Conflicts) != 0 {
		t.Fatalf("a key m2 cannot fingerprint is a conflict: %v", p.Conflicts)
	}
	if got := strings.Join(actionStrings(p.Actions), ";"); got != "copy public key k m2<-m0" {
		t.Fatalf("actions %q, want only the public half copied back to m2", got)
	}
	if p.Objects != 2 {
		t.Errorf("%d objects, want 2 (one key pair)", p.Objects)
	}
	planApply(t, p)
	if p2 := planMake(t, ms, nil, sync.PlanOptions{}); !p2.Empty() {
		t.Fatalf("after apply: actions %v, conflicts %v", actionStrings(p2.Actions), p2.Conflicts)
	}
	planAllEqual(t, ms) // m2's private half has its fingerprint again, the same

	// Prune deletes the unknown copy too, as it is listed (no fingerprint).
	planGenEC(t, ms[0].Slot, "stray", planID(t))
	planApply(t, planMake(t, []sync.PlanMember{ms[0], ms[2]}, nil, sync.PlanOptions{}))
	dropPublicHalf(t, ms[2].Slot, "stray")
	pr := planMake(t, ms, nil, sync.PlanOptions{Prune: true}) // m1 lacks it
	if got := strings.Join(actionStrings(pr.Actions), ";"); got != "delete private key stray m0<-;delete private key stray m2<-;delete public key stray m0<-" {
		t.Fatalf("prune actions %q", got)
	}
	for _, a := range pr.Actions {
		if a.Member == "m2" && a.Fingerprint != nil {
			t.Fatalf("prune deletes m2's fingerprint-less copy by fingerprint %x: it would not find it", a.Fingerprint)
		}
	}

	// Two known fingerprints under one identity stay a conflict when a
	// third member holds the identity without one; that member is named
	// in it.
	id := planID(t)
	for _, m := range ms {
		planGenEC(t, m.Slot, "dup", id) // three different keys, one identity
	}
	dropPublicHalf(t, ms[2].Slot, "dup")
	var priv *sync.Conflict
	pc := planMake(t, ms, nil, sync.PlanOptions{})
	for i, c := range pc.Conflicts {
		if c.Identity.Class == pkcs11.CKO_PRIVATE_KEY && c.Identity.Label == "dup" {
			priv = &pc.Conflicts[i]
		}
	}
	if priv == nil {
		t.Fatalf("no conflict for the private halves: %v", pc.Conflicts)
	}
	if len(priv.Versions) != 3 || priv.Versions[2].Fingerprint != nil || strings.Join(priv.Versions[2].Members, ",") != "m2" {
		t.Fatalf("conflict %v: want m0's and m1's fingerprints, and m2 holding it without one", priv)
	}
	if bytes.Equal(priv.Versions[0].Fingerprint, priv.Versions[1].Fingerprint) {
		t.Fatalf("conflict %v between equal fingerprints", priv)
	}
	for _, a := range pc.Actions {
		if a.Identity.Label == "dup" && a.Identity.Class == pkcs11.CKO_PRIVATE_KEY {
			t.Fatalf("action on a conflicting identity: %v", a)
		}
	}

	// No member knows the fingerprint: one version, no conflict.
	id2 := planID(t)
	planGenEC(t, ms[0].Slot, "blind", id2)
	planGenEC(t, ms[1].Slot, "blind", id2)
	dropPublicHalf(t, ms[0].Slot, "blind")
	dropPublicHalf(t, ms[1].Slot, "blind")
	pb := planMake(t, ms[:2], nil, sync.PlanOptions{})
	for _, c := range pb.Conflicts {
		if c.Identity.Label == "blind" {
			t.Fatalf("fingerprint-less objects of one identity are a conflict: %v", c)
		}
	}
	for _, a := range pb.Actions {
		if a.Identity.Label == "blind" {
			t.Fatalf("fingerprint-less objects of one identity on both members: action %v", a)
		}
	}
}
