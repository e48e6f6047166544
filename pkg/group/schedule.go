package group

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

type policy int

const (
	leastBusy policy = iota
	roundRobin
	primaryBackup
)

func parsePolicy(s string) (policy, error) {
	switch s {
	case "", config.PolicyLeastBusy:
		return leastBusy, nil
	case config.PolicyRoundRobin:
		return roundRobin, nil
	case config.PolicyPrimaryBackup:
		return primaryBackup, nil
	}
	return 0, fmt.Errorf("unknown policy %q (want %s, %s or %s)", s, config.PolicyLeastBusy, config.PolicyRoundRobin, config.PolicyPrimaryBackup)
}

// memberSet is a set of member indexes (a group has at most 64 members).
type memberSet uint64

func (s memberSet) has(i int) bool          { return s&(1<<uint(i)) != 0 }
func (s *memberSet) add(i int)              { *s |= 1 << uint(i) }
func (s memberSet) without(i int) memberSet { return s &^ (1 << uint(i)) }

// minLatency keeps a member with no latency sample yet from scoring zero
// whatever its load.
const minLatency = 1000 // ns

// pick chooses the member for the next single-part call among the active
// members not in skip, per the group's policy. When no member is active at
// all it promotes the standbys first. It returns nil when every candidate
// is in skip or none serves. pick reads only atomics.
func (g *Group) pick(skip memberSet) *member.Member {
	for range 2 {
		if m, anyActive := g.pickActive(skip); m != nil || anyActive {
			return m
		}
		g.ensureActive()
	}
	return nil
}

func (g *Group) pickActive(skip memberSet) (*member.Member, bool) {
	ms := g.view().members
	n := len(ms)
	anyActive := false
	switch policy(g.policy.Load()) {
	case primaryBackup:
		for _, m := range ms {
			if m.State() != member.Active {
				continue
			}
			anyActive = true
			if !skip.has(m.Index()) {
				return m, true
			}
		}
		return nil, anyActive
	case roundRobin:
		start := int(g.rr.Add(1) % uint64(n))
		for i := range n {
			m := ms[(start+i)%n]
			if m.State() != member.Active {
				continue
			}
			anyActive = true
			if !skip.has(m.Index()) {
				return m, true
			}
		}
		return nil, anyActive
	default:
		// Least busy: the fewest calls in flight, weighted by the recent
		// latency, so a slow or far member gets proportionally less. The
		// scan starts at a rotating offset so that ties rotate.
		start := int(g.rr.Add(1) % uint64(n))
		now := time.Now().UnixNano()
		var best *member.Member
		bestScore := math.MaxFloat64
		for i := range n {
			m := ms[(start+i)%n]
			if m.State() != member.Active {
				continue
			}
			anyActive = true
			if skip.has(m.Index()) {
				continue
			}
			lat := float64(m.DecayedLatency(now))
			if lat < minLatency {
				lat = minLatency
			}
			score := float64(m.InFlight()+1) * lat
			if score < bestScore {
				best, bestScore = m, score
			}
		}
		return best, anyActive
	}
}

// call runs one call on m with in-flight and latency accounting, and
// charges a health failure to m (failing it at the threshold or on a
// timeout). A call the caller's context cut short is not charged.
func (g *Group) call(ctx context.Context, m *member.Member, fn func() error) (slot.Class, error) {
	class, fail, err := g.measure(ctx, m, fn)
	if fail {
		g.failMember(m, err)
	}
	return class, err
}

// measure is call without the failing: it reports whether the call should
// fail m, for callers that decide later (see run).
func (g *Group) measure(ctx context.Context, m *member.Member, fn func() error) (slot.Class, bool, error) {
	start := m.Begin()
	err := fn()
	if err != nil && ctx.Err() != nil {
		m.End(start, nil) // not the member's fault
		return slot.ClassRequest, false, err
	}
	out := m.End(start, err)
	class := out.Class
	if (class == slot.ClassLogin || class == slot.ClassRequest) && g.lostLogin(err) {
		// The member forgot our login (token restarted under us): it is
		// unwell, not the request.
		class = slot.ClassHealth
		out.Fail = m.ChargeHealth(err)
	}
	return class, class == slot.ClassHealth && out.Fail, err
}

// ambiguous is slot.Ambiguous: a member is failed for such an error only
// once another member has served the same request; if every member says
// the same, the request is wrong and nobody is failed.
func ambiguous(err error) bool { return slot.Ambiguous(err) }

// lostLogin reports whether err says a member is not logged in while the
// group is.
func (g *Group) lostLogin(err error) bool {
	return g.userType.Load() >= 0 && slot.CodeOf(err) == pkcs11.CKR_USER_NOT_LOGGED_IN
}

// errAbsent says a member does not hold the object (not its fault).
var errAbsent = errors.New("object not on this member")

// attempt is one try of a single-part operation on one member, with the
// physical handles of the objects it names already resolved.
type attempt func(ctx context.Context, m *member.Member, s *slot.Slot, hs []pkcs11.ObjectHandle) error

// run executes a single-part operation with transparent failover: on a
// member chosen by the scheduler, with objs resolved to that member's
// physical handles. A health failure (or a timeout) moves it to the next
// member; a request or login error is returned as it is; a member that
// does not hold the object is skipped without charge. The caller sees
// success while one member that holds the objects lives.
func (g *Group) run(ctx context.Context, op string, objs []*vobject, fn attempt) error {
	return g.runAvoiding(ctx, op, objs, 0, fn)
}

// runAvoiding is run that tries the members in avoid only when no other
// member can serve.
func (g *Group) runAvoiding(ctx context.Context, op string, objs []*vobject, avoid memberSet, fn attempt) error {
	if err := g.gate.enter(); err != nil {
		return err
	}
	defer g.gate.leave()
	for _, o := range objs {
		if err := o.usable(); err != nil {
			return wrap(err.(*Error), op, "", nil)
		}
	}
	var skip memberSet
	var lastHealth error
	absent, retriedAbsent := false, false
	staleRetried := memberSet(0)
	type suspect struct {
		m    *member.Member
		err  error
		fail bool
	}
	var suspects []suspect
	clearErrs := 0 // health errors that are surely the member's
	hs := make([]pkcs11.ObjectHandle, len(objs))
	for {
		if err := ctx.Err(); err != nil {
			return opErr(op, "", err)
		}
		m := g.pick(skip | avoid)
		if m == nil && avoid != 0 {
			avoid = 0
			continue
		}
		if m == nil {
			if absent && lastHealth == nil && !retriedAbsent {
				// Every live member said "not here" from its cache: look
				// again once, in case another process replicated it since.
				retriedAbsent = true
				for _, o := range objs {
					o.forgetAbsent()
				}
				skip, absent = 0, false
				continue
			}
			break
		}
		s := m.Slot()
		var err error
		for i, o := range objs {
			if hs[i], err = g.resolve(ctx, o, m); err != nil {
				break
			}
		}
		if err != nil {
			skip.add(m.Index())
			switch {
			case errors.Is(err, errAbsent):
				absent = true
				continue
			case errors.Is(err, ErrConflict):
				return wrap(ErrConflict, op, m.Name(), err)
			case slot.ClassOf(err) == slot.ClassHealth && ctx.Err() == nil:
				lastHealth = err
				m.AddFailover()
				continue
			}
			return opErr(op, m.Name(), err)
		}
		class, fail, err := g.measure(ctx, m, func() error { return fn(ctx, m, s, hs) })
		switch class {
		case slot.ClassNone:
			for _, sm := range suspects {
				if sm.fail {
					g.failMember(sm.m, sm.err)
				}
			}
			return nil
		case slot.ClassHealth:
			if ambiguous(err) {
				suspects = append(suspects, suspect{m, err, fail})
			} else {
				clearErrs++
				if fail {
					g.failMember(m, err)
				}
			}
			lastHealth = err
			m.AddFailover()
			skip.add(m.Index())
			continue
		}
		if len(objs) > 0 && isHandleError(err) && !staleRetried.has(m.Index()) {
			// The cached physical handle went stale (re-login, object
			// replaced): find it again once.
			staleRetried.add(m.Index())
			for _, o := range objs {
				o.forget(m.Index())
			}
			continue
		}
		return opErr(op, m.Name(), err)
	}
	if len(suspects) > 0 && clearErrs == 0 {
		// Every member that answered refused the request the same
		// ambiguous way: it is the request, not the members.
		return opErr(op, "", lastHealth)
	}
	for _, sm := range suspects {
		if sm.fail {
			g.failMember(sm.m, sm.err)
		}
	}
	if lastHealth == nil && absent {
		if len(objs) > 0 && objs[0].isKey() {
			return wrap(ErrKeyHandle, op, "", errors.New("no live member holds the object"))
		}
		return wrap(ErrObjectHandle, op, "", errors.New("no live member holds the object"))
	}
	return wrap(ErrNoMember, op, "", lastHealth)
}

func isHandleError(err error) bool {
	switch slot.CodeOf(err) {
	case pkcs11.CKR_OBJECT_HANDLE_INVALID, pkcs11.CKR_KEY_HANDLE_INVALID,
		pkcs11.CKR_WRAPPING_KEY_HANDLE_INVALID, pkcs11.CKR_UNWRAPPING_KEY_HANDLE_INVALID:
		return true
	}
	return false
}
