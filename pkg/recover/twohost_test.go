package recover

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/hagroup/hagroup/pkg/member"
)

// secondHost opens r's group as another host would: the same members, its
// own state directory (so its own recovery locks and tombstone journal),
// its own engine and recoverer.
func secondHost(t *testing.T, r *rig) *rig {
	t.Helper()
	b := &rig{t: t, opts: r.opts, toks: r.toks, servers: r.servers, cfg: r.cfg, set: r.set, stateDir: t.TempDir()}
	b.open()
	t.Cleanup(b.close)
	return b
}

// inSync reports whether a check of host h (Synchronize with Check)
// finds the members equal.
func inSync(t *testing.T, h *rig) bool {
	t.Helper()
	rep, err := h.rec.Synchronize(rigCtx(t), SyncOptions{Check: true})
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	return rep.InSync()
}

// Issue 15: a key made through host A while m2 is away; both hosts recover
// m2 at the same moment, each under its own host's lock. m2 ends with the
// private and the public half exactly once, and both hosts' checks agree
// that the group is in sync.
func TestTwoHostsRecoverAKeyMadeWhileAway(t *testing.T) {
	r := newRig(t, rigOpts{n: 3, retries: 0})
	b := secondHost(t, r)
	m2 := r.name(2)
	for _, h := range []*rig{r, b} {
		if err := h.g.FailMember(m2, errors.New("test: away")); err != nil {
			t.Fatal(err)
		}
	}
	r.genEC(r.session(), "L")

	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, h := range []*rig{r, b} {
		wg.Go(func() { _, errs[i] = h.rec.Recover(rigCtx(t), m2) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("host %d's recovery of %s: %v", i, m2, err)
		}
	}
	for i := range r.toks {
		inv := inventory(t, r.direct(r.toks[i], fmt.Sprintf("-check%d", i)))
		if got := labels(inv); !slices.Equal(got, []string{"L", "L"}) {
			t.Errorf("%s holds %q, want L's private and public half once each:\n  %s", r.name(i), got, dump(inv))
		}
	}
	for i, h := range []*rig{r, b} {
		if st := h.state(m2); st != member.Active {
			t.Errorf("host %d: %s is %v", i, m2, st)
		}
		if !inSync(t, h) {
			t.Errorf("host %d's check says the group is out of sync", i)
		}
	}
}

// Issue 15: a key destroyed through host A while m2 is away does not come
// back when host B, whose journal never saw the destroy, recovers m2.
func TestTwoHostsDestroyWhileAwayStaysGone(t *testing.T) {
	r := newRig(t, rigOpts{n: 3, retries: 0})
	b := secondHost(t, r)
	m2 := r.name(2)
	s := r.session()
	pub, priv := r.genEC(s, "K")
	r.genEC(s, "kept")
	for _, h := range []*rig{r, b} {
		if err := h.g.FailMember(m2, errors.New("test: away")); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.g.DestroyObject(rigCtx(t), priv); err != nil {
		t.Fatal(err)
	}
	if err := r.g.DestroyObject(rigCtx(t), pub); err != nil {
		t.Fatal(err)
	}
	b.recoverExpecting(m2, "kept", "kept")
	if !inSync(t, b) {
		t.Errorf("host B's check says the group is out of sync after its recovery")
	}
	// Host A, which made the destroy, then takes m2 back too: nothing to
	// copy or delete, and it agrees.
	r.recoverExpecting(m2, "kept", "kept")
	if !inSync(t, r) {
		t.Errorf("host A's check says the group is out of sync after the recoveries")
	}
}
