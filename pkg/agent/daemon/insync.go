package daemon

import (
	"context"
	"fmt"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/recover"
)

// markSync sets every member's NeedsSync and OutOfSync in gs, and the
// group's NeedsSync and ComparedAt, from a comparison of what the members
// hold (Engine.OutOfSync: recover.SyncReport.OutOfSync, the rule
// synchronize --check and pkg/ha's Status apply too): the agent's last,
// unless it is older than compareTTL or compareNow asks for one made now.
// So listgroups and the metric say what synchronize --check said then,
// with its age, and never from a comparison older than the bound. A group
// that cannot be compared (not open, no member in service) is not in
// sync: every member needs synchronisation.
func (d *Daemon) markSync(ctx context.Context, gr *groupRun, eng Engine, gs *agent.GroupStatus, compareNow bool) {
	var c comparison
	if eng == nil {
		c.err = fmt.Errorf("group %q is not open", gr.cfg.Label)
	} else {
		notBefore := time.Now()
		if !compareNow {
			notBefore = notBefore.Add(-compareTTL(gr.set))
		}
		c = d.compare(ctx, gr, eng, notBefore)
	}
	gs.SetSync(c.at, c.counts, c.err)
}

// pokeOn asks for a comparison after an event that can change what the
// members hold or which of them serve, the agent's engine's or a
// reporting process's. Routine successes (an object that reached every
// member, a recovery attempt under way) and the comparison's own events
// do not.
func (d *Daemon) pokeOn(e agent.Event) {
	switch e.Event {
	case string(group.ObjectReplicated), string(group.ObjectDestroyed), string(group.MemberRecovering),
		string(recover.AttemptStarted), string(recover.LockWaiting), "in_sync", "out_of_sync":
		return
	}
	d.mu.RLock()
	gr := d.groups[e.Group]
	d.mu.RUnlock()
	if gr != nil && gr.recheck != nil {
		gr.pokeCheck()
	}
}
