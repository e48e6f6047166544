package agent

// OutOfSync returns, per member, how many of the report's differences
// concern it. It is the one rule for "in sync": a member is in sync
// exactly when it has no count here, and a group when no member has
// (SyncReport.InSync). listgroups' NEEDS SYNC, synchronize --check and the
// hagroup_objects_out_of_sync metric all come from it, applied to a check
// of what the members hold now.
func (r SyncReport) OutOfSync() map[string]int {
	counts := map[string]int{}
	for _, d := range r.Differences {
		for _, m := range d.Members {
			counts[m]++
		}
	}
	return counts
}
