package daemon

import (
	"context"
	"fmt"

	"github.com/hagroup/hagroup/pkg/agent"
)

// markSync sets every member's NeedsSync and OutOfSync in gs, and the
// group's NeedsSync, from a comparison of what the members hold now
// (Engine.OutOfSync: recover.SyncReport.OutOfSync, the rule synchronize
// --check and pkg/ha's Status apply too): never from a plan cached by a
// recovery or an earlier check, which another host's copies, destroys and
// duplicates make stale without this process seeing it. So listgroups,
// synchronize --check and the metric cannot disagree. A group that cannot
// be compared (not open, no member in service) is not in sync: every
// member needs synchronisation. The comparison is also recorded
// (recordSync), for the in_sync / out_of_sync events.
func (d *Daemon) markSync(ctx context.Context, gr *groupRun, eng Engine, gs *agent.GroupStatus) {
	var counts map[string]int
	var err error
	if eng == nil {
		err = fmt.Errorf("group %q is not open", gr.cfg.Label)
	} else if counts, err = eng.OutOfSync(ctx); err == nil {
		d.recordSync(gr, counts)
	}
	gs.SetSync(counts, err)
	if err != nil {
		d.log.Debug("compare members for status", "group", gr.cfg.Label, "error", err)
	}
}
