package ha

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
)

// Objects made and destroyed through the group while a member catches up
// reach it: each time the recovering member takes a copy, the test makes
// one object and destroys another through the group, so every plan the
// catch-up makes is already stale when it is applied. The member must
// still come back holding exactly what the others hold, which takes the
// final pass under the write barrier (while it runs, key management
// waits: the test's change made then gives up on its deadline and is not
// made at all).
func TestCatchUpWindowMissesNothing(t *testing.T) {
	toks := testhsm.Take(t, 3)
	hf := &hookFaults{Faults: slottest.NewFaults()}
	r := newRig(t, rigOpts{toks: toks, faults: hf, manual: true})
	ctx := testCtx(t)
	victim := toks[2].Name
	s := r.session()
	const doomed = 6
	handles := make([]group.ObjectHandle, doomed)
	for i := range doomed {
		h, err := s.CreateObject(ctx, dataTemplate(fmt.Sprintf("doomed-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		handles[i] = h
	}
	if err := r.g.Engine().FailMember(victim, errors.New("test: taken out of rotation")); err != nil {
		t.Fatal(err)
	}
	if err := dataObject(ctx, s, "made-while-away"); err != nil {
		t.Fatal(err)
	}

	ws := r.session()
	var mu sync.Mutex
	var made, destroyed, refused int
	hf.set(victim, slot.OpCreateObject, func() {
		mu.Lock()
		k := made + refused
		mu.Unlock()
		hctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		err := dataObject(hctx, ws, fmt.Sprintf("made-in-window-%d", k))
		var derr error = errors.New("nothing left to destroy")
		if k < doomed {
			derr = ws.DestroyObject(hctx, handles[k])
		}
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err == nil:
			made++
		case errors.Is(err, context.DeadlineExceeded):
			refused++ // held back by the barrier: the final pass runs
		default:
			t.Errorf("making an object during the catch-up: %v", err)
		}
		if derr == nil {
			destroyed++
		}
	})
	res, err := r.g.Recover(ctx, victim)
	hf.set("", "", nil)
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	t.Logf("catch-up: %d passes, copied %d, deleted %d, final pass under the barrier: %v; %d objects made and %d destroyed during it, %d held back",
		res.CatchUp.Passes, res.CatchUp.Copied, res.CatchUp.Deleted, res.CatchUp.Final, made, destroyed, refused)
	if !res.CatchUp.Final {
		t.Errorf("no final pass under the write barrier although objects changed during every pass")
	}
	if made < 3 || destroyed < 3 {
		t.Errorf("only %d objects made and %d destroyed during the catch-up: the window was not exercised", made, destroyed)
	}
	if refused == 0 {
		t.Errorf("no change was held back while the final pass ran")
	}
	if st := r.state(victim); st != member.Active {
		t.Fatalf("victim is %v", st)
	}
	want := inventory(t, direct(t, toks[0]))
	if got := inventory(t, direct(t, toks[2])); diff(want, got) != "[]" {
		t.Errorf("the recovered member differs from the others: %s", diff(want, got))
	}
	// What was destroyed stays destroyed: not copied back from the member
	// that was away.
	for _, tok := range toks {
		left := len(findLabelled(t, direct(t, tok), "doomed-"))
		if left != doomed-destroyed {
			t.Errorf("%s holds %d doomed objects, want %d (%d of %d were destroyed)", tok.Name, left, doomed-destroyed, destroyed, doomed)
		}
	}
	// And what is made after the activation reaches it as to any member.
	if err := dataObject(ctx, s, "after"); err != nil {
		t.Fatal(err)
	}
	if got := inventory(t, direct(t, toks[2])); diff(want, got) == "[]" || len(got) != len(want)+1 {
		t.Errorf("an object made after the recovery did not reach the member (%d objects there, %d before)", len(got), len(want))
	}
}
