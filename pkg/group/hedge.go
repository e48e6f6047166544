package group

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// Hedged requests (docs/DESIGN.md, "Hedged requests"). When the member
// running an attempt of a hedgeable plan (a single-part call with no state
// left on the member: sign, verify, encrypt, decrypt, digest, random) has
// not answered within the group's healthy p95, the same request goes to
// another member too, and exec takes the answers as they come. The first
// attempt runs on the caller's goroutine, which its slot brings back at
// the delay (slot.Late); the hedge runs on a goroutine of its own. When
// the hedge serves first, it overtakes the first attempt, whose session is
// abandoned as a timed-out call's is and closed once the module returns;
// a hedge that loses runs to its end, so that its session goes back to
// the pool with no operation active, and its answer is charged by the rule
// like any other.

// Hedge budget, in thousandths of a hedge: each hedgeable call earns
// hedgeEarn, a hedge spends hedgeCost, and at most hedgeBurst is saved up.
// Hedges are then at most 5 % of the calls over any long enough stretch
// of traffic, plus the burst.
const (
	hedgeCost  = 1000
	hedgeEarn  = hedgeCost * 5 / 100
	hedgeBurst = 3 * hedgeCost
)

// race runs one hedgeable request's attempts for exec: at most two in
// flight, each on its own member with its own handles.
type race struct {
	g       *Group
	p       plan
	fn      attempt
	delay   time.Duration // hedgeDelay, taken once per request
	answers chan outcome  // made at the first launch
	late    slot.Late     // the first attempt's, on a member that hands off
	running int
}

// hedgeDelayFor is the hedge delay for one hedgeable call, which earns
// its share of the budget: 0 when it runs without a race (hedging off, or
// no member measured well enough to say what is slow).
func (g *Group) hedgeDelayFor() time.Duration {
	if !g.settings.Hedge {
		return 0
	}
	g.earnHedge()
	return g.hedgeDelay()
}

// newRace returns the race for one hedgeable request of plan p.
func (g *Group) newRace(p plan, fn attempt, delay time.Duration) *race {
	return &race{g: g, p: p, fn: fn, delay: delay}
}

// pending reports whether an attempt started earlier has not been taken.
func (r *race) pending() bool { return r != nil && r.running > 0 }

// launch starts fn on m. The attempt runs to its end whatever the caller
// does (command_timeout bounds it): a PKCS#11 operation cut short would
// leave its session's operation state active. An answer that serves the
// request overtakes late, once it is there for wait to take.
func (r *race) launch(ctx context.Context, m *member.Member, late *slot.Late) {
	if r.answers == nil {
		r.answers = make(chan outcome, 2)
	}
	r.running++
	hs := make([]pkcs11.ObjectHandle, len(r.p.objs))
	ctx = context.WithoutCancel(ctx)
	go func() {
		o := r.g.try(ctx, r.p, m, hs, r.fn)
		r.answers <- o
		if late != nil && o.prep == nil && o.class == slot.ClassNone {
			late.Overtake()
		}
	}()
}

// start runs the request on m and, when m has not answered within the
// hedge delay and the budget allows, on the next member not in skip too. It returns the
// first answer; wait takes the other. On a member whose calls are handed
// off (all but dispatch inline), the attempt on m runs on the caller's
// goroutine, which its slot brings back at the delay to launch the hedge
// (slot.Late): a call answered in time costs no goroutine, channel or
// timer. hs is the caller's handles for m.
func (r *race) start(ctx context.Context, m *member.Member, hs []pkcs11.ObjectHandle, skip memberSet) (outcome, error) {
	if s := m.Slot(); s == nil || !s.HandsOff() {
		return r.startAside(ctx, m, skip)
	}
	r.late.After = r.delay
	r.late.Fire = func() { r.hedge(ctx, m, skip, &r.late) }
	o := r.g.try(slot.WithLate(ctx, &r.late), r.p, m, hs, r.fn)
	if errors.Is(o.err, slot.ErrOvertaken) || errors.Is(o.prep, slot.ErrOvertaken) {
		if back, deadline, ok := r.late.Overtaken(); ok {
			r.chargeIfHung(m, back, deadline)
		}
		return r.wait(ctx) // the hedge's answer, sent before it overtook
	}
	return o, nil
}

// chargeIfHung charges m, in the background, with a timeout if the call
// the hedge overtook on it has not returned (back) by its deadline: a hung
// member whose every call was hedged would otherwise never fail.
func (r *race) chargeIfHung(m *member.Member, back <-chan struct{}, deadline time.Time) {
	r.g.background(func() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		select {
		case <-back:
			return
		case <-t.C:
		}
		err := fmt.Errorf("member %s: %w: a call another member's answer overtook was still in the module at its deadline", m.Name(), slot.ErrTimeout)
		var v member.Verdict
		if v.Health(m, err, m.ChargeHealth(err)) {
			r.g.failMember(m, err)
		}
	})
}

// startAside is start with m's attempt on a goroutine of its own, for a
// member whose calls run on their caller's (dispatch inline).
func (r *race) startAside(ctx context.Context, m *member.Member, skip memberSet) (outcome, error) {
	r.launch(ctx, m, nil)
	t := time.NewTimer(r.delay)
	select {
	case o := <-r.answers:
		t.Stop()
		r.running--
		return o, nil
	case <-ctx.Done():
		t.Stop()
		return outcome{}, ctx.Err()
	case <-t.C:
	}
	r.hedge(ctx, m, skip, nil)
	return r.wait(ctx)
}

// hedge sends the request late on m to the member the plan would try
// next (not m, nor one in skip) too, when the budget allows; an answer
// there overtakes late (nil: none to overtake).
func (r *race) hedge(ctx context.Context, m *member.Member, skip memberSet, late *slot.Late) {
	skip.add(m.Index())
	if h := r.g.nextFor(r.p, skip); h != nil && hedgeWorth(m, h, r.delay) && r.g.spendHedge(m, hedgeFloor(m, r.delay)) {
		r.launch(ctx, h, late)
	}
}

// wait returns the next answer.
func (r *race) wait(ctx context.Context) (outcome, error) {
	select {
	case o := <-r.answers:
		r.running--
		return o, nil
	case <-ctx.Done():
		return outcome{}, ctx.Err()
	}
}

// abandon leaves the attempts exec did not take to finish in the
// background, and charges their answers by the rule: served says whether
// another member served the request.
func (r *race) abandon(served bool) {
	if !r.pending() {
		return
	}
	n := r.running
	r.running = 0
	r.g.background(func() {
		for range n {
			o := <-r.answers
			if o.prep != nil || o.class != slot.ClassHealth {
				continue // (a look-up's error was charged by its own call)
			}
			var v member.Verdict
			if v.Health(o.m, o.err, o.fail) {
				r.g.failMember(o.m, o.err)
			}
			if served {
				v.Served(r.g.failMember)
				// Another member served what this one failed: the
				// request moved away from it, as exec counts a failover.
				o.m.AddFailover()
			}
		}
	})
}

// hedgeDelay is how long an attempt may go unanswered before it is
// hedged: the lowest p95 of the serving members, the group's healthy p95
// (a member's own p95 would let a member that became slow set its own
// deadline). 0: no member has answered enough calls to say, or there is
// no second member to hedge to.
func (g *Group) hedgeDelay() time.Duration {
	var d time.Duration
	n := 0
	for _, m := range g.view().members { // (not serving(): no allocation per call)
		if !m.State().Serving() || m.Slot() == nil {
			continue
		}
		n++
		if p := m.P95(); p > 0 && (d == 0 || p < d) {
			d = p
		}
	}
	if n < 2 {
		return 0
	}
	return d
}

// earnHedge adds one hedgeable call's share to the budget, up to
// hedgeBurst.
func (g *Group) earnHedge() {
	for {
		b := g.hedgeBudget.Load()
		if b >= hedgeBurst || g.hedgeBudget.CompareAndSwap(b, min(b+hedgeEarn, hedgeBurst)) {
			return
		}
	}
}

// knownSlow says whether m's own p95 is past twice the group's healthy
// one, delay: a member that became slow, not a healthy member's tail.
func knownSlow(m *member.Member, delay time.Duration) bool { return m.P95() > 2*delay }

// hedgeFloor is the budget a hedge of m's request must leave: none when m
// is known slow, one hedge otherwise. A call of a healthy member past the
// healthy p95 is the tail's noise, about 5 % of the calls by definition,
// which would otherwise spend the whole budget and leave nothing for a
// member that became slow: the reserve is for it.
func hedgeFloor(m *member.Member, delay time.Duration) int64 {
	if knownSlow(m, delay) {
		return 0
	}
	return hedgeCost
}

// hedgeWorth says whether a hedge of m's late request to h can be expected
// to answer first. Away from a member known slow, always. A healthy
// member's late call is the tail's noise, and a copy pays only on a member
// with nothing in flight, where it starts at once: on a busy one it may
// wait behind calls the member has queued, and in a group run at its
// capacity (every member busy) it would only take a slot from the next
// request (docs/BENCHMARKS.md, "Waits made in Go").
func hedgeWorth(m, h *member.Member, delay time.Duration) bool {
	return knownSlow(m, delay) || h.InFlight() == 0
}

// spendHedge takes one hedge from the budget, when that leaves at least
// floor in it, reporting whether it did, and counts it against slow (nil:
// the group's count alone).
func (g *Group) spendHedge(slow *member.Member, floor int64) bool {
	for {
		b := g.hedgeBudget.Load()
		if b < hedgeCost+floor {
			return false
		}
		if g.hedgeBudget.CompareAndSwap(b, b-hedgeCost) {
			g.hedges.Add(1)
			if slow != nil {
				slow.AddHedge()
			}
			return true
		}
	}
}

// Hedges returns how many requests were hedged (sent to a second member)
// since the group opened.
func (g *Group) Hedges() uint64 { return g.hedges.Load() }

// hedgeCounters are the group's hedging figures (fields of Group).
type hedgeCounters struct {
	hedgeBudget atomic.Int64  // thousandths of a hedge (see hedgeCost)
	hedges      atomic.Uint64 // requests hedged
}
