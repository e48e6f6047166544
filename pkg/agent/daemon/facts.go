package daemon

import (
	"sync"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/group"
)

// facts is what the HA log already says of each member that every
// process would otherwise say again: operators read the log, and a fact
// is written once, where it is new (the agent, or the first process that
// reports it), not once per process that starts. It stays visible in
// listgroups: a failed member's state and last error, the kinds of key a
// member cannot hold (cannotHold in --json).
type facts struct {
	mu         sync.Mutex
	unholdable map[memberKey]string // the last keys_unholdable detail logged
}

// newsOf reports whether a process's event tells the log something new.
// A member_failed of a member the agent's own engine holds out of service
// is known (the agent logged its failure when it saw it); one the agent
// still holds in service is news (only that process saw it fail). A
// keys_unholdable is known when the log holds the same one for the member.
func (d *Daemon) newsOf(e agent.FleetEvent) bool {
	switch e.Event {
	case string(group.MemberFailed):
		d.mu.RLock()
		gr := d.groups[e.Group]
		d.mu.RUnlock()
		if gr == nil {
			return true
		}
		eng := gr.engine()
		return eng == nil || eng.Serving(e.Member)
	case string(group.KeysUnholdable):
		return d.facts.noteUnholdable(e.Group, e.Member, e.Detail)
	}
	return true
}

// noteUnholdable records a keys_unholdable about to be logged and reports
// whether it differs from the last one logged for the member.
func (f *facts) noteUnholdable(groupLabel, member, detail string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.unholdable == nil {
		f.unholdable = map[memberKey]string{}
	}
	k := memberKey{groupLabel, member}
	if last, ok := f.unholdable[k]; ok && last == detail {
		return false
	}
	f.unholdable[k] = detail
	return true
}
