package recover

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/member"
)

// S1 of the chaos soak: one object a member will not describe (SoftHSM
// 2.6.1 left an object file without CKA_CLASS, answering
// CKR_ATTRIBUTE_VALUE_INVALID) made every catch-up plan fail, so failed
// members never returned. Now the member is caught up with every readable
// object and returns to rotation; the unreadable objects, on the member
// and on a peer, are reported by member and handle and left alone.
func TestRecoveryWithUnreadableObjects(t *testing.T) {
	r := newRig(t, rigOpts{n: 3, retries: 0})
	victim := r.name(2)
	if err := r.g.FailMember(victim, errors.New("test: taken out")); err != nil {
		t.Fatal(err)
	}
	s := r.session()
	for i := range 3 {
		r.genEC(s, fmt.Sprintf("while-away-%d", i))
	}
	testhsm.PlantUnreadableObject(t, r.toks[1])
	testhsm.PlantUnreadableObject(t, r.toks[2])

	res, err := r.rec.Recover(rigCtx(t), victim)
	if err != nil {
		t.Fatalf("recover with unreadable objects: %v", err)
	}
	if st := r.state(victim); st != member.Active {
		t.Fatalf("victim is %v after recovery, want active", st)
	}
	if res.CatchUp.Copied != 6 || res.CatchUp.Deleted != 0 {
		t.Errorf("catch-up copied %d and deleted %d, want the 3 pairs (6) and nothing", res.CatchUp.Copied, res.CatchUp.Deleted)
	}
	on := map[string]int{}
	for _, u := range res.CatchUp.Unreadable {
		on[u.Member]++
		if u.Handle == 0 || !strings.Contains(u.String(), "CKR_ATTRIBUTE_VALUE_INVALID") {
			t.Errorf("unreadable object reported as %q (handle %d)", u, u.Handle)
		}
	}
	if len(res.CatchUp.Unreadable) != 2 || on[r.name(1)] != 1 || on[victim] != 1 {
		t.Errorf("unreadable objects reported: %v; want one on %s and one on %s", res.CatchUp.Unreadable, r.name(1), victim)
	}
	r.rev.mu.Lock()
	var recovered *Event
	for _, e := range r.rev.all {
		if e.Kind == Recovered && e.Member == victim {
			recovered = &e
		}
	}
	r.rev.mu.Unlock()
	if recovered == nil || len(recovered.Unreadable) != 2 {
		t.Errorf("recovered event %+v does not carry the 2 unreadable objects", recovered)
	}
	onVictim := inventory(t, r.direct(r.toks[2], "-check"))
	onFirst := inventory(t, r.direct(r.toks[0], "-check"))
	if dump(onVictim) != dump(onFirst) {
		t.Fatalf("victim differs from %s:\nvictim:\n  %s\n%s:\n  %s", r.name(0), dump(onVictim), r.name(0), dump(onFirst))
	}

	rep, err := r.rec.Synchronize(rigCtx(t), SyncOptions{Check: true})
	if err != nil {
		t.Fatalf("synchronize --check: %v", err)
	}
	if rep.InSync() || len(rep.Plan.Unreadable) != 2 || len(rep.Plan.Actions) != 0 || len(rep.Plan.Conflicts) != 0 {
		t.Errorf("check: in sync %v, unreadable %v, actions %v, conflicts %v; want out of sync by the 2 unreadable objects only",
			rep.InSync(), rep.Plan.Unreadable, rep.Plan.Actions, rep.Plan.Conflicts)
	}
	if n := rep.OutOfSync()[victim]; n != 1 {
		t.Errorf("victim out of sync by %d, want 1 (its unreadable object)", n)
	}
}
