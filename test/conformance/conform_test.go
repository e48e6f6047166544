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
	main, general := sequence(t), generalErrors(t)
	bare := newWorld(t, "bare token", 0, false)
	want := play(t, bare, main, nil)
	wantGeneral := play(t, bare, general, nil)
	for _, a := range append(append([]answer{}, want...), wantGeneral...) {
		t.Logf("bare: %-40s %s", a.step.name, a.line)
	}
	for _, c := range configs {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t, c.name, c.members, c.served)
			check(t, c.name, compare(c.name, want, play(t, w, main, nil), allowances))
			check(t, c.name, compare(c.name, wantGeneral, play(t, w, general, nil), allowances))
		})
	}
}

// check fails the test for each undocumented difference.
func check(t *testing.T, config string, r report) {
	t.Helper()
	for _, d := range r.diffs {
		t.Errorf("%s: undocumented difference from the member token: %s", config, d)
	}
}
