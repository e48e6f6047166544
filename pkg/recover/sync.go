package recover

import (
	"context"
	"errors"
	"fmt"
	"sort"

	hasync "github.com/hagroup/hagroup/pkg/sync"
)

// SyncOptions tune Synchronize.
type SyncOptions struct {
	// Check only reports the differences; nothing is changed.
	Check bool
	// Prune deletes objects found on some members only, with no
	// tombstone, instead of copying them to the rest. DESTRUCTIVE: see
	// sync.PlanOptions.Prune.
	Prune bool
}

// SyncReport is what Synchronize found and did.
type SyncReport struct {
	// Plan lists the differences: its actions and conflicts, and the
	// members it skipped because they did not answer.
	Plan *hasync.Plan
	// Applied is the outcome of applying the plan; nil with Check or when
	// there was nothing to do.
	Applied *hasync.ApplyResult
	// NotServing are the members left out because they are failed,
	// recovering or removed; they catch up when they recover.
	NotServing []string
	// Unreplicable are copies not attempted because the member copied to
	// or from lacks CKM_AES_KEY_WRAP_PAD (private and secret keys travel
	// wrapped under the domain key): differences that remain, and count
	// as out of sync. They are in Plan.Actions too.
	Unreplicable []hasync.Action
}

// InSync reports whether the serving members were equal (before any
// apply) and every member was compared. Unreplicable differences count,
// and so do objects a member would not describe (Plan.Unreadable), since
// what they hold is unknown.
func (s *SyncReport) InSync() bool {
	return s.Plan != nil && s.Plan.Empty() && len(s.Plan.Unreadable) == 0 && len(s.Plan.Skipped) == 0 && len(s.NotServing) == 0
}

// Synchronize compares the objects of the serving members (active and
// standby) and, unless opts.Check, makes them equal: copies what some
// lack, deletes what a tombstone says was destroyed, and leaves conflicts
// alone (they are in the report). It holds the host-wide recovery lock of
// every member it compares, so no recovery of those members, in this
// process or another, runs at the same time, and the group's write
// barrier (Engine.HoldWrites), so no object is made, destroyed or changed
// through this process's group meanwhile; signing goes on. The report's
// Plan also feeds Status.OutOfSync.
func (r *Recoverer) Synchronize(ctx context.Context, opts SyncOptions) (*SyncReport, error) {
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("synchronize: %w", ErrClosed)
	}
	rep := &SyncReport{}
	var names []string
	for _, snap := range r.eng.Members() {
		if snap.State.Serving() {
			names = append(names, snap.Name)
		} else {
			rep.NotServing = append(rep.NotServing, snap.Name)
		}
	}
	if len(names) == 0 {
		return rep, errors.New("synchronize: no member in service")
	}
	// Lock in name order, so two synchronisations cannot deadlock.
	sorted := append([]string(nil), names...)
	sort.Strings(sorted)
	for _, name := range sorted {
		unlock, err := r.lockMember(ctx, name, true)
		if err != nil {
			return rep, fmt.Errorf("synchronize: %w", err)
		}
		defer unlock()
	}
	// Under the locks, take the members that still serve, those that can
	// wrap keys first (a plan copies from the first holder).
	var members []hasync.PlanMember
	for _, name := range names {
		m, ok := r.eng.Member(name)
		if !ok || !m.State().Serving() || m.Slot() == nil {
			rep.NotServing = append(rep.NotServing, name)
			continue
		}
		members = append(members, hasync.PlanMember{Name: name, Slot: m.Slot()})
	}
	if len(members) == 0 {
		return rep, errors.New("synchronize: no member in service")
	}
	lacking := r.lacking()
	members = capableFirst(members, lacking)
	// Key management through this process's group waits while the
	// members are compared and changed: an object half-way through its
	// replication, or a destroy not yet recorded, would otherwise look
	// like a difference, and applying it would copy a destroyed key back.
	release, err := r.eng.HoldWrites(ctx)
	if err != nil {
		return rep, fmt.Errorf("synchronize: %w", err)
	}
	defer release()
	// The tombstones are read after the listing, and again after the
	// copies (see sync.PlanOptions.LoadTombstones): destroys through
	// another process's group are not held by this one's barrier.
	plan, err := hasync.MakePlan(ctx, members, nil, hasync.PlanOptions{Prune: opts.Prune, SkipUnreachable: true,
		LoadTombstones: r.loadTombstones})
	if err != nil {
		return rep, fmt.Errorf("synchronize: %w", err)
	}
	rep.Plan = plan
	r.noteOutOfSync(plan)
	todo := *plan
	todo.Actions = append([]hasync.Action(nil), plan.Actions...)
	rep.Unreplicable = splitUnreplicable(&todo, lacking)
	if opts.Check || len(todo.Actions) == 0 {
		return rep, nil
	}
	res, err := r.repl.Apply(ctx, &todo)
	rep.Applied = res
	// What is left: conflicts, what cannot be replicated, what failed.
	after := &hasync.Plan{Members: plan.Members, Conflicts: plan.Conflicts, Unreadable: plan.Unreadable,
		Actions: append([]hasync.Action(nil), rep.Unreplicable...)}
	if res != nil {
		for _, f := range res.Failed {
			after.Actions = append(after.Actions, f.Action)
		}
	}
	r.noteOutOfSync(after)
	if err != nil {
		return rep, fmt.Errorf("synchronize: %w", err)
	}
	return rep, nil
}

// noteOutOfSync records, per member of p, how many objects it is out of
// sync by, for Status.
func (r *Recoverer) noteOutOfSync(p *hasync.Plan) {
	now := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, name := range p.Members {
		m := r.rec(name)
		m.outOfSync = p.OutOfSync(name)
		m.checked = now
	}
}
