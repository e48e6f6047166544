package group

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group/vtable"
	"github.com/hagroup/hagroup/pkg/member"
)

type policy int

const (
	leastBusy policy = iota
	roundRobin
	primaryBackup
)

// policyNames are the policies' names in the configuration, by policy.
var policyNames = []string{leastBusy: config.PolicyLeastBusy, roundRobin: config.PolicyRoundRobin, primaryBackup: config.PolicyPrimaryBackup}

func parsePolicy(s string) (policy, error) {
	if s == "" {
		return leastBusy, nil
	}
	if i := slices.Index(policyNames, s); i >= 0 {
		return policy(i), nil
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
func (g *Group) pick(skip memberSet) *member.Member { return g.pickFor(nil, skip) }

// pickFor is pick for a call on object o (nil: none). Under the least-busy
// policy it prefers a member where o's handle is known (Cached): on any
// other the object is first searched for, which on most makes visits
// every object of the token and costs far more than the call. A member
// where it is not known is chosen when every member where it is known has
// calls in flight and that one has none, so concurrent calls still spread
// (and learn the handle there) while one caller's calls do not scan. A
// slow member where alone the handle is known is left through a hedge
// (hedge.go: late against the fastest member's p95), which learns the
// handle on another member; among members where it is known the least
// busy wins.
// Latency alone cannot say it: a member's average holds the search that
// found the object.
func (g *Group) pickFor(o *vtable.Object, skip memberSet) *member.Member {
	for range 2 {
		if m, anyActive := g.pickActive(o, skip); m != nil || anyActive {
			return m
		}
		g.ensureActive()
	}
	return nil
}

func (g *Group) pickActive(o *vtable.Object, skip memberSet) (*member.Member, bool) {
	ms := g.view().members
	n := len(ms)
	p := policy(g.policy.Load())
	start := 0 // primary-backup: the first active member in order
	if p != primaryBackup {
		start = int(g.rr.Add(1) % uint64(n))
	}
	switch {
	case p == primaryBackup || p == roundRobin:
		anyActive := false
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
	case o == nil:
		return leastBusyOf(ms, start, skip, nil)
	}
	known := func(m *member.Member) bool { _, ok := o.Cached(m); return ok }
	best, _ := leastBusyOf(ms, start, skip, known)
	if best != nil && best.InFlight() > 0 {
		idle := func(m *member.Member) bool { return m.InFlight() == 0 && !known(m) }
		if other, _ := leastBusyOf(ms, start, skip, idle); other != nil {
			return other, true
		}
	}
	if best != nil {
		return best, true
	}
	return leastBusyOf(ms, start, skip, nil)
}

// leastBusyOf returns the active member not in skip, and for which keep
// (nil: any) holds, with the fewest calls in flight weighted by its recent
// latency, so a slow or far member gets proportionally less; and whether
// any member is active. The scan starts at start, so that ties rotate. A
// lone candidate is not scored (no clock read on the hot path).
func leastBusyOf(ms []*member.Member, start int, skip memberSet, keep func(*member.Member) bool) (*member.Member, bool) {
	n := len(ms)
	anyActive := false
	var now int64
	var best *member.Member
	bestScore := math.MaxFloat64
	for i := range n {
		m := ms[(start+i)%n]
		if m.State() != member.Active {
			continue
		}
		anyActive = true
		if skip.has(m.Index()) || keep != nil && !keep(m) {
			continue
		}
		if best == nil {
			best = m
			continue
		}
		if now == 0 {
			now = time.Now().UnixNano()
			bestScore = busyScore(best, now)
		}
		if score := busyScore(m, now); score < bestScore {
			best, bestScore = m, score
		}
	}
	return best, anyActive
}

// busyScore is a member's calls in flight (plus this one) weighted by its
// recent latency: lower is better. A member never measured yet (new, or
// added since) takes one call at a time until its first call ends: its
// floor latency would otherwise make it the best score whatever its load,
// and a slow new member would draw every concurrent call at once.
func busyScore(m *member.Member, now int64) float64 {
	if !m.Measured() && m.InFlight() > 0 {
		return math.Inf(1)
	}
	lat := float64(m.DecayedLatency(now))
	if lat < minLatency {
		lat = minLatency
	}
	return float64(m.InFlight()+1) * lat
}
