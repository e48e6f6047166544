package conformance

import (
	"fmt"
	"slices"
	"testing"
)

// fault is one kill or restart of a served member, before a step.
type fault struct {
	before  string // the step's name
	member  int
	restart bool
}

// plans are the runs under kill: a non-primary dies during a multi-part
// encryption, the primary during an RSA signature and the key management
// after it (it is back for the wrap of an extractable key); in a run of
// its own another non-primary dies while token objects are destroyed; in
// a third the primary dies just before the key generations. Each comes
// back later in its run.
var plans = []struct {
	name   string
	faults []fault
}{
	{"non-primary then primary", []fault{
		{before: "CBC-PAD encrypt update 2", member: 1},
		{before: "HMAC sign init", member: 1, restart: true},
		{before: "RSA sign", member: 0},
		{before: "wrap query", member: 0, restart: true},
	}},
	{"non-primary during destroys", []fault{
		{before: "destroy data object", member: 2},
		{before: "no objects left", member: 2, restart: true},
	}},
	// The key generations are the first calls to meet the dead primary
	// (its connection is gone, the request never sent): they move to the
	// next member, and the generated keys read back as on the bare token.
	{"primary before key generation", []fault{
		{before: "generate AES key", member: 0},
		{before: "wrap query", member: 0, restart: true},
	}},
}

// sweepPlans are the runs under kill of the sweeps, played one after the
// other in one driver: the primary dies in the OAEP sweep and is back for
// the GCM sweep, dies among the keys made every way and is back for the
// latching attributes, dies before the user's read-only session and is
// back before the SO's logout, and dies among the operations mixed in one
// session.
var sweepPlans = []struct {
	name   string
	faults []fault
}{
	{"primary during the sweeps", []fault{
		{before: "OAEP SHA-256 MGF1-SHA-256 label=false: decrypt init", member: 0},
		{before: "GCM IV 12 tag 128 AAD .: encrypt init", member: 0, restart: true},
		{before: "keys: derive sensitive=f extractable=t", member: 0},
		{before: "latch: create sensitive=f extractable=t", member: 0, restart: true},
		{before: "states: user ro: info", member: 0},
		{before: "states: logout SO", member: 0, restart: true},
		{before: "ops: sign active: init", member: 0},
		{before: "ops: logout", member: 0, restart: true},
	}},
}

// TestConformanceUnderKill runs the sequences through three served members
// while members are killed with SIGKILL and restarted between steps; the
// only differences allowed beyond the documented ones are the
// CKR_DEVICE_ERROR of a multi-part operation whose member died in it
// (which ends it). Then, every member back, the sequence runs again and
// must answer as the bare token.
func TestConformanceUnderKill(t *testing.T) {
	steps, general := sequence(t), generalErrors(t)
	sweeps := slices.Concat(sequences(t)[2:]...)
	bare := newWorld(t, "bare token", 0, false)
	want := play(t, bare, steps, nil)
	wantGeneral := play(t, bare, general, nil)
	wantSweeps := play(t, bare, sweeps, nil)

	w := newWorld(t, served, 3, true)
	type run struct {
		name   string
		faults []fault
		steps  []step
		want   []answer
	}
	var runs []run
	for _, p := range plans {
		runs = append(runs, run{p.name, p.faults, steps, want})
	}
	for _, p := range sweepPlans {
		runs = append(runs, run{p.name, p.faults, sweeps, wantSweeps})
	}
	for _, plan := range runs {
		t.Run(plan.name, func(t *testing.T) {
			got, cut := playFaults(t, w, plan.steps, plan.faults)
			midOp := allowance{
				rule: func(want []answer, i int, got answer) bool {
					return cut[want[i].step.op] && got.norm() == "rv=0x30"
				},
				endsOp: true,
				design: "**A member's death mid-operation.**",
			}
			check(t, underKill, compare(underKill, plan.want, got, append([]allowance{midOp}, allowances...)))
			// What the run left behind is not the next run's business: a
			// failed destroy, or (item 7, see TestObjectsAfterRestart) the
			// objects a member that was away during the destroys brings back
			// to the new process that cleans up.
			for _, a := range play(t, w, cleanup(), nil) {
				t.Logf("cleanup: %-20s %s", a.step.name, a.line)
			}
		})
	}
	for n, run := range [][2][]answer{{want, play(t, w, steps, nil)}, {wantGeneral, play(t, w, general, nil)}, {wantSweeps, play(t, w, sweeps, nil)}} {
		t.Run(fmt.Sprintf("again %d", n+1), func(t *testing.T) {
			check(t, "after restarts", compare(served, run[0], run[1], allowances))
		})
	}
}

// playFaults plays steps on w, injecting faults before the steps they
// name, and returns the answers and the operations a death cut.
func playFaults(t *testing.T, w *world, steps []step, faults []fault) ([]answer, map[string]bool) {
	t.Helper()
	index := map[string]int{}
	for i, s := range steps {
		index[s.name] = i
	}
	at := map[int][]fault{}
	for _, f := range faults {
		i, ok := index[f.before]
		if !ok {
			t.Fatalf("fault before step %q, which the sequence does not have", f.before)
		}
		at[i] = append(at[i], f)
	}
	cut := map[string]bool{}
	got := play(t, w, steps, func(i int) {
		for _, f := range at[i] {
			s := w.served[f.member]
			if f.restart {
				t.Logf("restarting member m-%d before step %q", f.member, f.before)
				s.Restart(t)
				continue
			}
			t.Logf("killing member m-%d (SIGKILL) before step %q", f.member, f.before)
			s.Kill()
			if i > 0 && steps[i].op != "" && steps[i-1].op == steps[i].op {
				cut[steps[i].op] = true
			}
		}
	})
	return got, cut
}
