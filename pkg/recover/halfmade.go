package recover

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync"
	"github.com/miekg/pkcs11"
)

// HalfMadeRemoved: RemoveHalfMade (or a synchronisation) deleted Deleted
// objects an interrupted creation had left on a serving member.
const HalfMadeRemoved EventKind = "half_made_removed"

// leftovers remembers, per member, the half-made objects (sync.ErrHalfMade)
// this process's plans listed there, and since when. A handle names one
// object only within one module context and login epoch, so a member
// whose slot or epoch changed starts afresh. Guarded by Recoverer.mu.
type leftovers map[string]*memberLeftovers

type memberLeftovers struct {
	slot  *slot.Slot
	epoch uint64
	since map[pkcs11.ObjectHandle]time.Time
}

// observe records what plan p listed: for each member it listed, the
// half-made objects now there keep the time they were first seen, new
// ones get now, and those no longer listed are forgotten (finished,
// deleted, or their handle now names a complete object).
func (l leftovers) observe(p *sync.Plan, slots map[string]*slot.Slot, now time.Time) {
	for _, name := range p.Members {
		s := slots[name]
		if s == nil {
			continue
		}
		old := l[name]
		if old != nil && (old.slot != s || old.epoch != s.Epoch()) {
			old = nil
		}
		cur := &memberLeftovers{slot: s, epoch: s.Epoch(), since: map[pkcs11.ObjectHandle]time.Time{}}
		for _, u := range p.UnreadableOn(name) {
			if !errors.Is(u.Err, sync.ErrHalfMade) {
				continue
			}
			at := now
			if old != nil {
				if t, ok := old.since[u.Handle]; ok {
					at = t
				}
			}
			cur.since[u.Handle] = at
		}
		if len(cur.since) == 0 {
			delete(l, name)
			continue
		}
		l[name] = cur
	}
}

// due returns, per member, the handles seen half-made for HalfMadeSettle
// at now.
func (l leftovers) due(now time.Time) map[string][]pkcs11.ObjectHandle {
	out := map[string][]pkcs11.ObjectHandle{}
	for name, m := range l {
		for h, since := range m.since {
			if !now.Before(since.Add(sync.HalfMadeSettle)) {
				out[name] = append(out[name], h)
			}
		}
	}
	return out
}

// last returns when the last object seen so far becomes due (zero: none
// is seen).
func (l leftovers) last() time.Time {
	var out time.Time
	for _, m := range l {
		for _, since := range m.since {
			if at := since.Add(sync.HalfMadeSettle); at.After(out) {
				out = at
			}
		}
	}
	return out
}

// observeHalfMade records the half-made objects plan p listed (see
// leftovers.observe).
func (r *Recoverer) observeHalfMade(p *sync.Plan, members []sync.PlanMember) {
	slots := map[string]*slot.Slot{}
	for _, m := range members {
		slots[m.Name] = m.Slot
	}
	now := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.halfMade.observe(p, slots, now)
}

// RemoveHalfMade deletes the half-made objects (sync.ErrHalfMade) that
// this process's plans (synchronisations and checks) have seen on a
// member that still serves, under the same handle, for at least
// sync.HalfMadeSettle, and returns how many it deleted. Each is read
// again just before: one whose creation finished meanwhile is left alone.
// A failed creation leaves such an object on SoftHSM 2.6.1 whichever
// member it ran on, and no catch-up comes for a member that never fails;
// the wait keeps a creation under way on another host safe (see
// HalfMadeSettle). It costs nothing while no plan has seen one; haagent
// and every long-lived process call it each recovery interval.
func (r *Recoverer) RemoveHalfMade(ctx context.Context) (int, error) {
	r.mu.Lock()
	due := r.halfMade.due(r.clock.Now())
	type work struct {
		name  string
		s     *slot.Slot
		epoch uint64
		hs    []pkcs11.ObjectHandle
	}
	var todo []work
	for name, hs := range due {
		m := r.halfMade[name]
		todo = append(todo, work{name, m.slot, m.epoch, hs})
	}
	r.mu.Unlock()
	removed := 0
	var errs []error
	for _, w := range todo {
		n, done, err := r.removeOn(ctx, w.name, w.s, w.epoch, w.hs)
		removed += n
		if err != nil {
			errs = append(errs, err)
		}
		r.forgetHalfMade(w.name, w.s, done)
		if n > 0 {
			r.emit(Event{Kind: HalfMadeRemoved, Time: r.clock.Now(), Member: w.name, Deleted: n})
		}
	}
	return removed, errors.Join(errs...)
}

// removeOn deletes the half-made objects hs on member name, if it still
// serves on slot s in login epoch epoch (the handles name what was seen),
// and returns how many it deleted and which handles are settled (deleted,
// gone, complete now, or no longer valid).
func (r *Recoverer) removeOn(ctx context.Context, name string, s *slot.Slot, epoch uint64, hs []pkcs11.ObjectHandle) (int, []pkcs11.ObjectHandle, error) {
	m, ok := r.eng.Member(name)
	if !ok || !m.State().Serving() || m.Slot() != s || s.Epoch() != epoch {
		return 0, hs, nil // out of service (its catch-up deletes them), or the handles are stale
	}
	n := 0
	var done []pkcs11.ObjectHandle
	var errs []error
	for _, h := range hs {
		gone, err := sync.DestroyHalfMade(ctx, s, h)
		if err != nil {
			errs = append(errs, fmt.Errorf("remove a half-made object: %w", err))
			continue
		}
		if gone {
			n++
		}
		done = append(done, h)
	}
	return n, done, errors.Join(errs...)
}

// forgetHalfMade drops the handles hs of member name (on slot s).
func (r *Recoverer) forgetHalfMade(name string, s *slot.Slot, hs []pkcs11.ObjectHandle) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.halfMade[name]
	if m == nil || m.slot != s {
		return
	}
	for _, h := range hs {
		delete(m.since, h)
	}
	if len(m.since) == 0 {
		delete(r.halfMade, name)
	}
}

// settleHalfMade is the end of a synchronisation that applies: it waits
// (as long as ctx allows) until every half-made object its plan saw has
// been seen for sync.HalfMadeSettle, lists the members again, and
// removes those still half-made. A one-shot process (hactl without an
// agent) has no earlier sighting, so it waits here once; haagent has
// usually seen them long before. Objects first seen in the second
// listing are left to a later call.
func (r *Recoverer) settleHalfMade(ctx context.Context, members []sync.PlanMember) (int, error) {
	removed, err := r.RemoveHalfMade(ctx)
	if err != nil {
		return removed, err
	}
	r.mu.Lock()
	last := r.halfMade.last()
	r.mu.Unlock()
	if last.IsZero() {
		return removed, nil
	}
	t := r.clock.NewTimer(last.Sub(r.clock.Now()))
	select {
	case <-ctx.Done():
		t.Stop()
		return removed, ctx.Err()
	case <-t.C():
	}
	// Listed again: a sighting stands only while the object stays.
	plan, err := sync.MakePlan(ctx, members, nil, sync.PlanOptions{SkipUnreachable: true})
	if err != nil {
		return removed, err
	}
	r.observeHalfMade(plan, members)
	n, err := r.RemoveHalfMade(ctx)
	return removed + n, err
}
