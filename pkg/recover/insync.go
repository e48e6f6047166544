package recover

// OutOfSync returns, per member, how many differences of the report
// concern it: its plan actions (unreplicable copies included), the
// conflicts it holds a version in, the objects it would not describe, and
// one for a member that was not compared (out of service, or its listing
// failed), whose content is unknown. It is the one rule for "in sync": a
// member is in sync exactly when it has no count here, and the group when
// no member has. pkg/ha's Status, synchronize --check (haagent's
// inSync), listgroups' NEEDS SYNC and the hagroup_objects_out_of_sync
// metric all apply it to a check of what the members hold now.
func (s *SyncReport) OutOfSync() map[string]int {
	counts := map[string]int{}
	for _, name := range s.NotServing {
		counts[name] = 1
	}
	if s.Plan == nil {
		return counts
	}
	for name := range s.Plan.Skipped {
		counts[name] = 1
	}
	for _, name := range s.Plan.Members {
		if n := s.Plan.OutOfSync(name); n > 0 {
			counts[name] += n
		}
	}
	return counts
}

// InSync reports whether every member was compared and held what the
// others hold (before any apply): no member has a count in OutOfSync.
// Unreplicable differences count, and so do objects a member would not
// describe (Plan.Unreadable), since what they hold is unknown.
func (s *SyncReport) InSync() bool {
	return s.Plan != nil && len(s.OutOfSync()) == 0
}
