package recover

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/hagroup/hagroup/pkg/sync"
)

// SyncOptions tune Synchronize.
type SyncOptions struct {
	// Check only reports the differences; nothing is changed.
	Check bool
	// Prune deletes objects found on some members only, with no
	// tombstone, instead of copying them to the rest. DESTRUCTIVE: see
	// sync.PlanOptions.Prune.
	Prune bool
	// LockWait bounds how long a synchronisation (not a check) waits for
	// the recovery lock of a member that another recovery holds; 0 means
	// DefaultSyncLockWait. The caller's ctx may end the wait sooner.
	LockWait time.Duration
}

// DefaultSyncLockWait is how long a synchronisation waits, by default, for
// a member's recovery lock held by a recovery (in this process or
// another) before it gives up with ErrInProgress.
const DefaultSyncLockWait = time.Minute

// SyncReport is what Synchronize found and did.
type SyncReport struct {
	// Plan lists the differences: its actions and conflicts, and the
	// members it skipped because they did not answer.
	Plan *sync.Plan
	// Applied is the outcome of applying the plan; nil with Check or when
	// there was nothing to do.
	Applied *sync.ApplyResult
	// NotServing are the members left out because they are failed,
	// recovering or removed; they catch up when they recover.
	NotServing []string
	// Unreplicable are copies not attempted because the member copied to
	// or from lacks CKM_AES_KEY_WRAP_PAD (private and secret keys travel
	// wrapped under the domain key): differences that remain, and count
	// as out of sync. They are in Plan.Actions too.
	Unreplicable []sync.Action
	// HalfMadeRemoved counts the half-made objects (sync.ErrHalfMade)
	// the synchronisation deleted from serving members: left by creations
	// that failed there, and seen so for sync.HalfMadeSettle. A check
	// deletes none.
	HalfMadeRemoved int
}

// Synchronize compares the objects of the serving members (active and
// standby) and, unless opts.Check, makes them equal: copies what some
// lack, deletes what a tombstone says was destroyed, and leaves conflicts
// alone (they are in the report). A check's SyncReport.OutOfSync is the
// group's "in sync".
//
// A check (opts.Check) only lists: it takes no member's recovery lock and
// does not hold the group's write barrier, so it never keeps a member out
// of service nor delays key management, however often it runs (haagent
// runs one periodically). The price is that an object being replicated,
// destroyed or caught up while the check lists (by this process or
// another) may be reported as a difference that is gone a moment later.
//
// A synchronisation that applies holds the host-wide recovery lock of
// every member it compares, so no recovery of those members, in this
// process or another, runs at the same time, and the group's write
// barrier (Engine.HoldWrites), so no object is made, destroyed or changed
// through this process's group meanwhile; signing goes on. It never holds
// one member's lock while it waits for another's, and it waits for a lock
// held by a recovery at most opts.LockWait (DefaultSyncLockWait), then
// fails with an error wrapping ErrInProgress that names the holder.
//
// A synchronisation that applies then deletes the half-made objects its
// listing found on serving members (what a failed creation leaves on
// SoftHSM), once they have been seen so for sync.HalfMadeSettle: it
// waits for that, after it has let go of the locks and the barrier
// (see RemoveHalfMade). A check only notes them.
func (r *Recoverer) Synchronize(ctx context.Context, opts SyncOptions) (*SyncReport, error) {
	rep, members, err := r.synchronize(ctx, opts)
	if err != nil || opts.Check || len(members) == 0 {
		return rep, err
	}
	n, err := r.settleHalfMade(ctx, members)
	rep.HalfMadeRemoved = n
	if err != nil {
		return rep, fmt.Errorf("synchronize: %w", err)
	}
	return rep, nil
}

// synchronize is Synchronize up to its removal of half-made objects; it
// returns the members it compared.
func (r *Recoverer) synchronize(ctx context.Context, opts SyncOptions) (*SyncReport, []sync.PlanMember, error) {
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return nil, nil, fmt.Errorf("synchronize: %w", ErrClosed)
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
		return rep, nil, errors.New("synchronize: no member in service")
	}
	if !opts.Check {
		wait := opts.LockWait
		if wait <= 0 {
			wait = DefaultSyncLockWait
		}
		unlock, err := r.lockMembers(ctx, names, wait)
		if err != nil {
			return rep, nil, fmt.Errorf("synchronize: %w", err)
		}
		defer unlock()
	}
	// Take the members that still serve (under the locks, for an apply),
	// those that can wrap keys first (a plan copies from the first
	// holder).
	var members []sync.PlanMember
	for _, name := range names {
		m, ok := r.eng.Member(name)
		if !ok || !m.State().Serving() || m.Slot() == nil {
			rep.NotServing = append(rep.NotServing, name)
			continue
		}
		members = append(members, sync.PlanMember{Name: name, Slot: m.Slot()})
	}
	if len(members) == 0 {
		return rep, nil, errors.New("synchronize: no member in service")
	}
	lacking := r.lacking()
	members = capableFirst(members, lacking)
	if !opts.Check {
		// Key management through this process's group waits while the
		// members are compared and changed: an object half-way through
		// its replication, or a destroy not yet recorded, would otherwise
		// look like a difference, and applying it would copy a destroyed
		// key back. A check changes nothing, so it holds nothing back.
		release, err := r.eng.HoldWrites(ctx)
		if err != nil {
			return rep, nil, fmt.Errorf("synchronize: %w", err)
		}
		defer release()
	}
	// The tombstones are read after the listing, and again after the
	// copies (see sync.PlanOptions.LoadTombstones): destroys through
	// another process's group are not held by this one's barrier.
	plan, err := sync.MakePlan(ctx, members, nil, sync.PlanOptions{Prune: opts.Prune, SkipUnreachable: true,
		LoadTombstones: r.loadTombstones})
	if err != nil {
		return rep, nil, fmt.Errorf("synchronize: %w", err)
	}
	rep.Plan = plan
	r.noteChecked(plan)
	r.observeHalfMade(plan, members)
	todo := *plan
	todo.Actions = append([]sync.Action(nil), plan.Actions...)
	rep.Unreplicable = splitUnreplicable(&todo, lacking, nil)
	if opts.Check || len(todo.Actions) == 0 {
		return rep, members, nil
	}
	res, err := r.repl.Apply(ctx, &todo)
	rep.Applied = res
	if res != nil {
		// A key that cannot cross to its member (sync.ErrCannotCross)
		// stays where it is: unreplicable, not a failure.
		failed := res.Failed[:0]
		var errs []error
		for i, f := range res.Failed {
			if errors.Is(f.Err, sync.ErrCannotCross) {
				rep.Unreplicable = append(rep.Unreplicable, f.Action)
				continue
			}
			failed = append(failed, f)
			errs = append(errs, &res.Failed[i])
		}
		res.Failed = failed
		err = errors.Join(errs...)
	}
	// What is left: conflicts, what cannot be replicated, what failed.
	after := &sync.Plan{Members: plan.Members, Conflicts: plan.Conflicts, Unreadable: plan.Unreadable,
		Actions: append([]sync.Action(nil), rep.Unreplicable...)}
	if res != nil {
		for _, f := range res.Failed {
			after.Actions = append(after.Actions, f.Action)
		}
	}
	r.noteChecked(after)
	if err != nil {
		return rep, members, fmt.Errorf("synchronize: %w", err)
	}
	return rep, members, nil
}

// lockMembers takes the host-wide recovery locks of the members names for
// a synchronisation, waiting at most wait (and as long as ctx allows) for
// those held by a recovery. It never holds a lock while it waits for
// another: it tries them all without waiting and, when one is busy, lets
// go of the rest and waits for that one alone. So a synchronisation
// waiting for one member's recovery keeps no other member's recovery out
// meanwhile (an automatic attempt only tries the lock, once an interval).
// Each wait is announced by a LockWaiting event, sent once the other locks
// are let go. The returned func releases every lock.
func (r *Recoverer) lockMembers(ctx context.Context, names []string, wait time.Duration) (func(), error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	sorted := append([]string(nil), names...)
	sort.Strings(sorted)
	held := map[string]func(){}
	releaseAll := func() {
		for name, unlock := range held {
			unlock()
			delete(held, name)
		}
	}
	for {
		var busy string
		var busyErr error
		for _, name := range sorted {
			if held[name] != nil {
				continue
			}
			unlock, err := r.lockMember(ctx, name, false)
			if errors.Is(err, ErrInProgress) {
				busy, busyErr = name, err
				break
			}
			if err != nil {
				releaseAll()
				return nil, err
			}
			held[name] = unlock
		}
		if busy == "" {
			return releaseAll, nil
		}
		releaseAll()
		r.emit(Event{Kind: LockWaiting, Member: busy, Err: busyErr})
		unlock, err := r.lockMember(ctx, busy, true)
		if err != nil {
			return nil, fmt.Errorf("waited up to %v for the recovery lock of member %s: %w", wait, busy, err)
		}
		held[busy] = unlock
	}
}

// noteChecked records, per member of p, that a plan listed it now, for
// Status.CheckedAt.
func (r *Recoverer) noteChecked(p *sync.Plan) {
	now := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, name := range p.Members {
		m := r.rec(name)
		m.checked = now
	}
}
