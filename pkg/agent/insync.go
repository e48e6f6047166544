package agent

import "time"

// SetSync sets every member's OutOfSync and NeedsSync, and the group's
// NeedsSync, ComparedAt, ComparedAgo and CompareError, from a comparison
// of the members started at at: counts per member
// (recover.SyncReport.OutOfSync, the one rule for "in sync", as pkg/ha's
// Group.OutOfSync returns them), or err when the members could not be
// compared, which leaves every member needing synchronisation (not in sync
// is the safe answer). haagent's listgroups and hactl's without haagent
// both set it so.
func (gs *GroupStatus) SetSync(at time.Time, counts map[string]int, err error) {
	gs.NeedsSync = make([]string, 0, len(counts))
	for i := range gs.Members {
		m := &gs.Members[i]
		m.OutOfSync = counts[m.Name]
		m.NeedsSync = err != nil || m.OutOfSync > 0
		if m.NeedsSync {
			gs.NeedsSync = append(gs.NeedsSync, m.Name)
		}
	}
	gs.ComparedAt, gs.ComparedAgo, gs.CompareError = time.Time{}, "", ""
	if !at.IsZero() {
		gs.ComparedAt, gs.ComparedAgo = at.UTC(), time.Since(at).Round(time.Second).String()
	}
	if err != nil {
		gs.CompareError = err.Error()
	}
}
