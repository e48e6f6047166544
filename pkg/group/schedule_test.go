package group

import (
	"math"
	"testing"
	"time"
)

// A member never measured takes one call at a time: before, its floor
// latency (1 µs) made it the best score with any number of calls in flight,
// so a slow new member drew every concurrent call until its first answer.
func TestUnmeasuredMemberTakesOneCallAtATime(t *testing.T) {
	busy := bareMember(t, "busy", 0)
	for range 3 {
		busy.End(busy.Begin(), nil) // measured: a few µs or less
	}
	for range 8 {
		busy.Begin()
	}
	fresh := bareMember(t, "fresh", 1)
	now := time.Now().UnixNano()

	if b, f := busyScore(busy, now), busyScore(fresh, now); f >= b {
		t.Errorf("an idle unmeasured member scores %v against %v for a measured one with 8 calls in flight: want it chosen for its first call", f, b)
	}
	start := fresh.Begin()
	if b, f := busyScore(busy, now), busyScore(fresh, now); f <= b {
		t.Errorf("an unmeasured member with its first call in flight scores %v against %v for a measured one with 8 in flight: want it passed over until that call ends", f, b)
	}
	fresh.End(start, nil)
	fresh.Begin()
	if f := busyScore(fresh, now); math.IsInf(f, 1) {
		t.Errorf("once measured, a member with a call in flight still scores %v: want its latency to weigh it again", f)
	}
}
