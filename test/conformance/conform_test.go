package conformance

import (
	"testing"
)

// The names of the configurations that allowances single out.
const (
	served    = "three served members"
	underKill = "three served members, under kill"
)

// configs are the virtual slot's configurations compared with the bare
// token.
var configs = []struct {
	name    string
	members int
	served  bool
}{
	{"one member", 1, false},
	{"three members", 3, false},
	{served, 3, true},
}

// TestConformance runs the sequences on a bare SoftHSM token and through
// the virtual slot of each configuration, each on fresh tokens; every
// answer must be the bare token's but for the documented differences.
func TestConformance(t *testing.T) {
	seqs := sequences(t)
	bare := newWorld(t, "bare token", 0, false)
	want := make([][]answer, len(seqs))
	for i, s := range seqs {
		want[i] = play(t, bare, s, nil)
		for _, a := range want[i] {
			t.Logf("bare: %-40s %s", a.step.name, a.line)
		}
	}
	for _, c := range configs {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t, c.name, c.members, c.served)
			for i, s := range seqs {
				check(t, c.name, compare(c.name, want[i], play(t, w, s, nil), allowances))
			}
		})
	}
}

// sequences are the call sequences every configuration runs, in this
// order, each from its own C_Initialize: the main sequence, the requests
// a token answers CKR_GENERAL_ERROR, and the sweeps (sweep_test.go,
// keyview_test.go).
func sequences(t testing.TB) [][]step {
	return [][]step{sequence(t), generalErrors(t), parameterSweep(t), keyViews(t), sessionStates(t), operationStates(t)}
}

// check fails the test for each undocumented difference.
func check(t *testing.T, config string, r report) {
	t.Helper()
	for _, d := range r.diffs {
		t.Errorf("%s: undocumented difference from the member token: %s", config, d)
	}
}
