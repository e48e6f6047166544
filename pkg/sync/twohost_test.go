package sync_test

import (
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
	"sync"
	"testing"

	hasync "github.com/hagroup/hagroup/pkg/sync"
)

// Issue 15: two hosts recover one member at once. Each host lists the
// members before either copies, so each plan says m2 lacks the key pair
// and each applies it. m2 must end with the private and the public half
// exactly once, and a plan made afterwards (from what the members hold
// now) must be empty.
func TestTwoHostsRecoverOneMemberOnce(t *testing.T) {
	for _, tc := range []struct {
		name     string
		parallel bool
	}{
		{"one after the other", false},
		{"at once", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := planMembers(t, 3, nil)
			planGenEC(t, ms[0].Slot, "L", planID(t))
			planGenAES(t, ms[0].Slot, "S", planID(t))
			// m1 holds what m0 holds; m2 was away.
			first := planMake(t, ms[:2], nil, hasync.PlanOptions{})
			planApply(t, first)

			// Host A and host B: their own replicator, their own plan, both
			// made from listings taken before either host copied anything.
			pa := planMake(t, ms, nil, hasync.PlanOptions{})
			pb := planMake(t, ms, nil, hasync.PlanOptions{})
			if n := pa.OutOfSync("m2"); n != 3 {
				t.Fatalf("m2 out of sync by %d, want 3 (public, private, secret)", n)
			}
			apply := func(p *hasync.Plan) {
				res, err := (&hasync.Replicator{GroupSerial: planSerial}).Apply(planCtx(t), p)
				if err != nil {
					t.Errorf("apply: %v", err)
					return
				}
				if len(res.Failed) != 0 {
					t.Errorf("apply failed: %v", res.Failed)
				}
			}
			if tc.parallel {
				var wg sync.WaitGroup
				wg.Go(func() { apply(pa) })
				wg.Go(func() { apply(pb) })
				wg.Wait()
			} else {
				apply(pa)
				apply(pb)
			}
			inv := planAllEqual(t, ms)
			if len(inv) != 3 {
				t.Fatalf("members hold %d objects, want 3:\n  %s", len(inv), planDump(inv))
			}
			if p := planMake(t, ms, nil, hasync.PlanOptions{}); !p.Empty() || p.OutOfSync("m2") != 0 {
				t.Fatalf("plan after both hosts applied: %v %v", actionStrings(p.Actions), p.Conflicts)
			}
		})
	}
}

// Duplicates of one version left by a race (here made by hand: two
// copies that each promise the member lacked the identity) are out of
// sync by the plan, and its Apply leaves one copy.
func TestPlanRemovesDuplicates(t *testing.T) {
	ms := planMembers(t, 3, nil)
	planGenEC(t, ms[0].Slot, "D", planID(t))
	planApply(t, planMake(t, ms, nil, hasync.PlanOptions{}))
	r := &hasync.Replicator{GroupSerial: planSerial}
	for _, o := range planFind(t, ms[0].Slot, "D") {
		if _, err := r.Replicate(planCtx(t), ms[0].Slot, o.Handle, hasync.Target{Slot: ms[2].Slot, Absent: true}); err != nil {
			t.Fatalf("second copy on m2: %v", err)
		}
	}
	if n := len(planFind(t, ms[2].Slot, "D")); n != 4 {
		t.Fatalf("m2 holds %d objects labelled D, want 4 (each half twice)", n)
	}

	p := planMake(t, ms, nil, hasync.PlanOptions{})
	if p.Empty() || p.OutOfSync("m2") != 2 || p.OutOfSync("m0") != 0 {
		t.Fatalf("plan with duplicates on m2: empty %v, m2 out of sync by %d, m0 by %d; actions %v",
			p.Empty(), p.OutOfSync("m2"), p.OutOfSync("m0"), actionStrings(p.Actions))
	}
	for _, a := range p.Actions {
		if a.Kind != hasync.Delete || a.Reason != hasync.ReasonDuplicate || a.Member != "m2" {
			t.Fatalf("unexpected action %s", a)
		}
	}
	planApply(t, p)
	if inv := planAllEqual(t, ms); len(inv) != 2 {
		t.Fatalf("members hold %d objects, want 2:\n  %s", len(inv), planDump(inv))
	}
	if p := planMake(t, ms, nil, hasync.PlanOptions{}); !p.Empty() {
		t.Fatalf("plan after the clean-up: %v", actionStrings(p.Actions))
	}
}

// Two hosts clean up the same duplicates from plans made before either
// applies: each removes one copy, and the member still ends with exactly
// one.
func TestTwoHostsRemoveDuplicatesOnce(t *testing.T) {
	ms := planMembers(t, 2, nil)
	planData(t, ms[0].Slot, "X", "x")
	planApply(t, planMake(t, ms, nil, hasync.PlanOptions{}))
	r := &hasync.Replicator{GroupSerial: planSerial}
	src := planFind(t, ms[0].Slot, "X")[0]
	if _, err := r.Replicate(planCtx(t), ms[0].Slot, src.Handle, hasync.Target{Slot: ms[1].Slot, Absent: true}); err != nil {
		t.Fatal(err)
	}
	pa := planMake(t, ms, nil, hasync.PlanOptions{})
	pb := planMake(t, ms, nil, hasync.PlanOptions{})
	// The two listings saw the copies in one order; each host removes
	// "the extra" — on a real second host possibly the other one. Apply
	// A, then B: B's extra is gone, so B must not remove the last copy.
	planApply(t, pa)
	planApply(t, pb)
	if n := len(planFind(t, ms[1].Slot, "X")); n != 1 {
		t.Fatalf("m1 holds %d copies of X, want 1", n)
	}
}

// A public key is never left on a member without its private half: when
// the private half's copy fails, the public half copied with it is taken
// back and both are reported failed.
func TestApplyKeepsPairsTogether(t *testing.T) {
	f := slottest.NewFaults()
	ms := planMembers(t, 2, f)
	planGenEC(t, ms[0].Slot, "P", planID(t))
	p := planMake(t, ms, nil, hasync.PlanOptions{})
	f.Fail("m1", slot.OpUnwrapKey, pkcs11.Error(pkcs11.CKR_DEVICE_MEMORY))
	res, err := (&hasync.Replicator{GroupSerial: planSerial}).Apply(planCtx(t), p)
	if err == nil || len(res.Failed) != 2 || len(res.Done) != 0 {
		t.Fatalf("apply with the private half failing on m1: err %v, done %v, failed %v", err, res.Done, res.Failed)
	}
	if got := planFind(t, ms[1].Slot, "P"); len(got) != 0 {
		t.Fatalf("m1 holds %d objects labelled P, want none (no public half without its private half)", len(got))
	}
	f.Heal("m1")
	planApply(t, planMake(t, ms, nil, hasync.PlanOptions{}))
	if inv := planAllEqual(t, ms); len(inv) != 2 {
		t.Fatalf("members hold %d objects, want 2:\n  %s", len(inv), planDump(inv))
	}
}
