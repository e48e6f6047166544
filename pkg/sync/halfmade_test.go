package sync_test

import (
	"context"
	"errors"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync"
	"github.com/miekg/pkcs11"
)

// unlabelled counts the objects on s without a label, as a bare token
// lists them, and those of them sync.GroupObject counts (the soak's
// truth).
func unlabelled(t *testing.T, ctx context.Context, s *slot.Slot) (all, group int) {
	t.Helper()
	hs, err := s.FindObjects(ctx, nil)
	if err != nil {
		t.Fatalf("list %s: %v", s.Name(), err)
	}
	for _, h := range hs {
		a, err := s.GetAttributes(ctx, h, []uint{pkcs11.CKA_LABEL})
		if err != nil || len(a) != 1 {
			t.Fatalf("label of object %d on %s: %v", h, s.Name(), err)
		}
		if len(a[0].Value) > 0 {
			continue
		}
		all++
		ok, err := sync.GroupObject(ctx, s, h)
		if err != nil {
			t.Fatalf("object %d on %s: %v", h, s.Name(), err)
		}
		if ok {
			group++
		}
	}
	return all, group
}

// The object a member killed in the middle of a key creation keeps (the
// soak's, byte for byte) makes that member out of sync in every plan,
// which names it, and the plan that catches the member up deletes it;
// the members are in sync then, by the plan and by a bare listing.
func TestPlanHalfMadeObject(t *testing.T) {
	ms, toks := planMembersToks(t, 2, nil)
	ctx := planCtx(t)
	planGenEC(t, ms[0].Slot, "halfmade-neighbour", planID(t))
	r := &sync.Replicator{GroupSerial: planSerial}
	if p, err := sync.MakePlan(ctx, ms, nil, sync.PlanOptions{}); err != nil {
		t.Fatal(err)
	} else if _, err := r.Apply(ctx, p); err != nil {
		t.Fatalf("apply: %v", err)
	}
	testhsm.PlantHalfMadeObject(t, toks[1])
	if all, group := unlabelled(t, ctx, ms[1].Slot); all != 1 || group != 1 {
		t.Fatalf("m1 lists %d unlabelled objects, %d of them group objects; want the planted one, counted", all, group)
	}

	p, err := sync.MakePlan(ctx, ms, nil, sync.PlanOptions{})
	if err != nil {
		t.Fatalf("plan with a half-made object: %v", err)
	}
	if n := p.OutOfSync("m1"); n != 1 {
		t.Errorf("m1 out of sync by %d, want 1 (the half-made object)", n)
	}
	if n := p.OutOfSync("m0"); n != 0 {
		t.Errorf("m0 out of sync by %d, want 0", n)
	}
	if len(p.Unreadable) != 1 || !errors.Is(p.Unreadable[0].Err, sync.ErrHalfMade) || p.Unreadable[0].Member != "m1" {
		t.Fatalf("unreadable = %v, want the half-made object on m1", p.Unreadable)
	}
	if len(p.Actions) != 0 || len(p.Conflicts) != 0 {
		t.Errorf("a plan that does not catch m1 up: actions %v, conflicts %v; want none", p.Actions, p.Conflicts)
	}

	p, err = sync.MakePlan(ctx, ms, nil, sync.PlanOptions{Returning: "m1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Actions) != 1 || p.Actions[0].Kind != sync.Delete || p.Actions[0].Member != "m1" ||
		p.Actions[0].Reason != sync.ReasonHalfMade {
		t.Fatalf("catch-up of m1: actions %v, want one half-made delete on m1", p.Actions)
	}
	if n := p.OutOfSync("m1"); n != 1 {
		t.Errorf("m1 out of sync by %d in its catch-up, want 1", n)
	}
	if _, err := r.Apply(ctx, p); err != nil {
		t.Fatalf("apply the catch-up: %v", err)
	}
	if all, _ := unlabelled(t, ctx, ms[1].Slot); all != 0 {
		t.Errorf("m1 still lists %d unlabelled objects after its catch-up", all)
	}
	again, err := sync.MakePlan(ctx, ms, nil, sync.PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !again.Empty() || len(again.Unreadable) != 0 || again.OutOfSync("m1") != 0 {
		t.Errorf("after the catch-up: actions %v, conflicts %v, unreadable %v; want in sync",
			again.Actions, again.Conflicts, again.Unreadable)
	}
}

// A complete session key without label or CKA_ID (an application's
// ephemeral key) is not half-made: no plan reports or deletes it.
func TestPlanKeepsUnlabelledSessionKey(t *testing.T) {
	ms, _ := planMembersToks(t, 2, nil)
	ctx := planCtx(t)
	_, _, err := ms[1].Slot.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{planA(pkcs11.CKA_EC_PARAMS, planP256), planA(pkcs11.CKA_TOKEN, false)},
		[]*pkcs11.Attribute{planA(pkcs11.CKA_TOKEN, false), planA(pkcs11.CKA_PRIVATE, true),
			planA(pkcs11.CKA_SIGN, true), planA(pkcs11.CKA_SENSITIVE, true)})
	if err != nil {
		t.Fatalf("generate a session pair: %v", err)
	}
	if all, group := unlabelled(t, ctx, ms[1].Slot); all != 2 || group != 0 {
		t.Fatalf("m1 lists %d unlabelled objects, %d of them group objects; want the session pair, not counted", all, group)
	}
	p, err := sync.MakePlan(ctx, ms, nil, sync.PlanOptions{Returning: "m1"})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Empty() || len(p.Unreadable) != 0 {
		t.Fatalf("plan with a session pair: actions %v, conflicts %v, unreadable %v; want nothing",
			p.Actions, p.Conflicts, p.Unreadable)
	}
	if _, err := (&sync.Replicator{GroupSerial: planSerial}).Apply(ctx, p); err != nil {
		t.Fatal(err)
	}
	if all, _ := unlabelled(t, ctx, ms[1].Slot); all != 2 {
		t.Errorf("m1 lists %d unlabelled objects after the plan, want the session pair kept", all)
	}
}
