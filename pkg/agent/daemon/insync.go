package daemon

import (
	"context"
	"fmt"

	"github.com/hagroup/hagroup/pkg/agent"
)

// markSync sets every member's NeedsSync and OutOfSync in gs, and the
// group's NeedsSync, from a check of what the members hold now (a
// synchronize --check, agent.SyncReport.OutOfSync): never from a plan
// cached by a recovery or an earlier check, which another host's copies,
// destroys and duplicates make stale without this process seeing it. So
// listgroups, synchronize --check and the metric cannot disagree. A group
// that cannot be compared (not open, no member in service) is not in sync:
// every member needs synchronisation. The check is also recorded
// (recordSync), for the in_sync / out_of_sync events.
func (d *Daemon) markSync(ctx context.Context, gr *groupRun, eng Engine, gs *agent.GroupStatus) {
	var counts map[string]int
	var err error
	if eng == nil {
		err = fmt.Errorf("group %q is not open", gr.cfg.Label)
	} else {
		var rep agent.SyncReport
		rep, err = eng.Synchronize(withStatus(ctx), agent.SyncRequest{Group: gr.cfg.Label, Check: true})
		if err == nil {
			d.recordSync(gr, rep)
			counts = rep.OutOfSync()
		}
	}
	gs.NeedsSync = make([]string, 0, len(counts))
	for i := range gs.Members {
		m := &gs.Members[i]
		m.OutOfSync = counts[m.Name]
		m.NeedsSync = err != nil || m.OutOfSync > 0
		if m.NeedsSync {
			gs.NeedsSync = append(gs.NeedsSync, m.Name)
		}
	}
	if err != nil {
		d.log.Debug("compare members for status", "group", gr.cfg.Label, "error", err)
	}
}

type statusKey struct{}

// withStatus marks a check made for a status answer: a member out of
// service counts as out of sync without its token being opened to say by
// what (synchronize --check does open it), so a listgroups or a scrape
// never logs in to a failed member nor waits for a hung one. Which
// members are out of sync is the same either way.
func withStatus(ctx context.Context) context.Context {
	return context.WithValue(ctx, statusKey{}, true)
}

// forStatus reports whether ctx is a status answer's check (withStatus).
func forStatus(ctx context.Context) bool { return ctx.Value(statusKey{}) != nil }
