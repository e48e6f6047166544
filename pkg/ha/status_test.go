package ha

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/recover"
)

// Status carries each member's state, last error, last attempt, attempts
// left and objects out of sync, through automatic attempts that run out
// and a manual recovery. The failing member is a real token behind
// hsmserve, killed (SIGKILL) and restarted.
func TestStatusFollowsRecovery(t *testing.T) {
	local := testhsm.Take(t, 2)
	srv := testhsm.ServeRemote(t, "status-remote")
	toks := []testhsm.Token{local[0], srv.Token(), local[1]}
	r := newRig(t, rigOpts{toks: toks, retries: 2})
	ctx := testCtx(t)
	victim := toks[1].Name
	st := r.g.Status(testCtx(t))
	if st.Degraded() || st.OutOfSync() || len(st.Members) != 3 || st.Primary != toks[0].Name {
		t.Fatalf("status of a healthy group: %+v", st)
	}
	if ms := memberStatus(t, st, victim); ms.AttemptsLeft != 2 || ms.State != member.Active {
		t.Fatalf("healthy member: %+v", ms)
	}
	s := r.session()
	srv.Kill()
	// A write the member misses while it is down; the generation itself
	// fails the member (its replication fails).
	genEC(t, s, "while-down")
	r.ev.waitFor(t, "automatic attempts run out", func() bool {
		return memberStatus(t, r.g.Status(testCtx(t)), victim).GaveUp
	})
	ms := memberStatus(t, r.g.Status(testCtx(t)), victim)
	if ms.State != member.Failed || ms.Attempts != 2 || ms.AttemptsLeft != 0 || ms.LastAttempt.IsZero() ||
		ms.LastAttemptError == "" || ms.LastError == "" || ms.AutoRecovery {
		t.Fatalf("after the attempts ran out: %+v", ms)
	}
	// Out of service, so not compared now: what it holds is unknown, and
	// it counts as one difference (recover.SyncReport.OutOfSync), as in
	// haagent's listgroups and synchronize --check.
	if ms.OutOfSync != 1 || !ms.NeedsSync {
		t.Errorf("the failed member is out of sync by %d (needs sync %v), want 1 and needs sync: it was not compared", ms.OutOfSync, ms.NeedsSync)
	}
	if !strings.Contains(ms.LastAttemptError, victim) {
		t.Errorf("last attempt error does not name the member: %s", ms.LastAttemptError)
	}
	if st := r.g.Status(testCtx(t)); !st.Degraded() || st.Failed != 1 {
		t.Errorf("group status: %+v", st)
	}

	srv.Restart(t)
	res, err := r.g.Recover(ctx, victim)
	if err != nil {
		t.Fatalf("manual Recover: %v", err)
	}
	if res.CatchUp.Copied != 2 {
		t.Errorf("catch-up copied %d objects, want the 2 halves made while it was down", res.CatchUp.Copied)
	}
	ms = memberStatus(t, r.g.Status(testCtx(t)), victim)
	if ms.State != member.Active || ms.GaveUp || ms.LastAttemptError != "" || ms.LastRecovered.IsZero() || ms.OutOfSync != 0 || ms.NeedsSync || ms.CheckedAt.IsZero() {
		t.Fatalf("after the manual recovery: %+v", ms)
	}
	rep, err := r.g.Synchronize(ctx, recover.SyncOptions{Check: true})
	if err != nil || !rep.InSync() {
		t.Fatalf("check after recovery: in sync %v, %v", rep != nil && rep.InSync(), err)
	}
	if _, err := json.Marshal(r.g.Status(testCtx(t))); err != nil {
		t.Errorf("status does not encode as JSON: %v", err)
	}
	if _, err := r.g.Recover(ctx, "nobody"); err == nil {
		t.Error("Recover of an unknown member succeeded")
	}
}
