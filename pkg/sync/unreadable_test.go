package sync_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/sync"
)

// A member holding an object it will not describe (SoftHSM's classless
// object) is still planned and synchronised: the object is reported by
// member and handle, never copied nor counted as a conflict, and the
// readable objects are copied as usual.
func TestPlanReportsUnreadableObject(t *testing.T) {
	ms, toks := planMembersToks(t, 2, nil)
	ctx := planCtx(t)
	id := planID(t)
	planGenEC(t, ms[0].Slot, "unreadable-neighbour", id)
	testhsm.PlantUnreadableObject(t, toks[1])

	p, err := sync.MakePlan(ctx, ms, nil, sync.PlanOptions{})
	if err != nil {
		t.Fatalf("plan failed for one unreadable object: %v", err)
	}
	if len(p.Unreadable) != 1 {
		t.Fatalf("unreadable objects = %v, want exactly the planted one on m1", p.Unreadable)
	}
	u := p.Unreadable[0]
	if u.Member != "m1" || u.Handle == 0 || u.Identity != nil {
		t.Errorf("unreadable = %+v, want member m1, its handle, no identity", u)
	}
	if got := u.String(); !strings.Contains(got, "m1") || !strings.Contains(got, fmt.Sprint(u.Handle)) ||
		!strings.Contains(got, "CKR_ATTRIBUTE_VALUE_INVALID") {
		t.Errorf("report %q does not name member, handle and the member's answer", got)
	}
	if len(p.Conflicts) != 0 {
		t.Errorf("conflicts = %v, want none", p.Conflicts)
	}
	if len(p.Actions) != 2 {
		t.Fatalf("actions = %v, want the copies of both halves to m1", p.Actions)
	}
	for _, a := range p.Actions {
		if a.Kind != sync.Copy || a.Member != "m1" || a.Source != "m0" {
			t.Errorf("action %v: want copy from m0 to m1", a)
		}
	}
	if n := p.OutOfSync("m1"); n != 3 {
		t.Errorf("m1 out of sync by %d, want 3 (two copies, one unreadable)", n)
	}
	if n := p.OutOfSync("m0"); n != 0 {
		t.Errorf("m0 out of sync by %d, want 0", n)
	}
	r := &sync.Replicator{GroupSerial: planSerial}
	if _, err := r.Apply(ctx, p); err != nil {
		t.Fatalf("apply: %v", err)
	}
	again, err := sync.MakePlan(ctx, ms, nil, sync.PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Actions) != 0 || len(again.Conflicts) != 0 || len(again.Unreadable) != 1 {
		t.Errorf("after apply: actions %v, conflicts %v, unreadable %v; want none, none, the planted one",
			again.Actions, again.Conflicts, again.Unreadable)
	}
	objs, err := sync.List(ctx, ms[1].Slot)
	if err != nil {
		t.Fatalf("List with an unreadable object: %v", err)
	}
	n := 0
	for _, o := range objs {
		if bytes.Equal(o.ID, id) {
			n++
		}
	}
	if n != 2 {
		t.Errorf("m1 holds %d halves of the pair, want 2", n)
	}
}
