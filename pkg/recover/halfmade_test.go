package recover

import (
	"errors"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/sync"
)

// The soak's one false "in sync" (seed 1796182500888228415): a member
// killed in the middle of a key creation keeps SoftHSM's half-written key
// (no label, no id, CKA_TOKEN false), which the check did not count. Now
// the check says the member is out of sync by it while it serves, and
// the member's next recovery (after its next failure) deletes it, after
// which the group is in sync.
func TestRecoveryDeletesHalfMadeObject(t *testing.T) {
	r := newRig(t, rigOpts{n: 3, retries: 0})
	victim := r.name(2)
	r.genEC(r.session(), "before-the-kill")
	testhsm.PlantHalfMadeObject(t, r.toks[2])

	rep, err := r.rec.Synchronize(rigCtx(t), SyncOptions{Check: true})
	if err != nil {
		t.Fatalf("synchronize --check: %v", err)
	}
	if rep.InSync() || rep.OutOfSync()[victim] != 1 || len(rep.Plan.Unreadable) != 1 ||
		!errors.Is(rep.Plan.Unreadable[0].Err, sync.ErrHalfMade) {
		t.Fatalf("check with a half-made key on %s: in sync %v, out of sync %v, unreadable %v; want %s out of sync by it",
			victim, rep.InSync(), rep.OutOfSync(), rep.Plan.Unreadable, victim)
	}

	if err := r.g.FailMember(victim, errors.New("test: taken out")); err != nil {
		t.Fatal(err)
	}
	res, err := r.rec.Recover(rigCtx(t), victim)
	if err != nil {
		t.Fatalf("recover: %v", err)
	}
	if st := r.state(victim); st != member.Active {
		t.Fatalf("victim is %v after recovery, want active", st)
	}
	if res.CatchUp.Deleted != 1 || len(res.CatchUp.Unreadable) != 0 {
		t.Errorf("catch-up deleted %d, unreadable %v; want the half-made key deleted", res.CatchUp.Deleted, res.CatchUp.Unreadable)
	}
	rep, err = r.rec.Synchronize(rigCtx(t), SyncOptions{Check: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.InSync() {
		t.Errorf("after recovery: out of sync %v, actions %v, unreadable %v; want in sync",
			rep.OutOfSync(), rep.Plan.Actions, rep.Plan.Unreadable)
	}
	onVictim := inventory(t, r.direct(r.toks[2], "-check"))
	onFirst := inventory(t, r.direct(r.toks[0], "-check"))
	if dump(onVictim) != dump(onFirst) {
		t.Fatalf("victim differs from %s:\nvictim:\n  %s\n%s:\n  %s", r.name(0), dump(onVictim), r.name(0), dump(onFirst))
	}
}
