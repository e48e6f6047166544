// Package ha is an HA group as haagent and the PKCS#11 module run it: the
// engine (pkg/group), the automatic and manual recovery of its members
// (pkg/recover) and its tombstone journal (pkg/sync/tombstone), wired
// together once, with the group-level operations an operator asks for —
// Recover, Synchronize, Status — and hot membership changes — AddMember,
// RemoveMember, SetStandby, Update — that never drop the work of the
// members they do not touch.
//
// Why a package of its own: pkg/recover drives an engine through its small
// Engine interface (which *group.Group satisfies) and does not import
// pkg/group; pkg/group knows nothing of recovery loops, retry budgets or
// lock files. Each is tested alone (pkg/recover against a scripted engine
// and against real groups). Composing them inside either would make one
// import the other, and the arrow from recover to group (recovery drives
// the engine) and the one from group to recover (the group offers
// recovery) would close a cycle. So the composition lives above both, in
// this thin package, which owns no policy: it forwards the engine's
// member-failed events to the recoverer, opens the journal, and sequences
// the engine's primitives (AddMember leaves a member recovering; Admit
// catches it up and activates it under the write barrier).
//
// *Group holds its engine rather than embedding it, so that a
// membership change cannot reach the engine's primitive by accident (the
// engine's AddMember leaves a member recovering without catching it up):
// membership goes through *Group's methods, every other engine operation
// (sessions, login, signing, key management) through Engine.
package ha

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/fleet"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/recover"
	"github.com/hagroup/hagroup/pkg/slot"
	hasync "github.com/hagroup/hagroup/pkg/sync"
	"github.com/hagroup/hagroup/pkg/sync/state"
	"github.com/hagroup/hagroup/pkg/sync/tombstone"
	"github.com/hagroup/hagroup/pkg/tokenfacts"
)

// Options are what a Group needs besides its configuration.
type Options struct {
	// StateDir holds the tombstone journal and the recovery lock files,
	// in StateDir/<group serial>/, shared by the agent and every
	// application process on the host. Empty: tombstones are kept in
	// memory (a member that was away may bring back a key destroyed
	// before this process started) and only this process's own guard
	// keeps two recoveries of one member apart.
	StateDir string
	// Events receives the engine's events; nil drops them. It is called
	// as group.EventSink says (synchronously, must not block).
	Events group.EventSink
	// RecoveryEvents receives the recoverer's events; nil drops them.
	RecoveryEvents func(recover.Event)
	// Interceptor is passed to every member's slot (fault injection in
	// tests); nil in production.
	Interceptor slot.Interceptor
	// MaxSessions caps each member's session pool (0: pkg/slot's default).
	MaxSessions int
	// ThreadCallers: the calls come from C threads (libhapkcs11.so); see
	// slot.Spec.ThreadCallers.
	ThreadCallers bool
	// Clock drives the retry timers; nil: the real clock.
	Clock recover.Clock
	// AttemptTimeout bounds one recovery attempt; 0: recover's default.
	AttemptTimeout time.Duration
	// Report, when set, receives the group's member figures and events
	// for haagent (pkg/fleet); one Reporter serves every group of a
	// process. The agent itself leaves it nil.
	Report *fleet.Reporter
	// ReadOnly opens the group only to look at it (hactl listgroups
	// without haagent): no member is recovered or caught up — not
	// automatically, not at login, not by following the marks — so
	// nothing is written to a member but the group's own state a plan
	// spreads. Status and Synchronize with Check work as usual.
	ReadOnly bool
}

// Group is an open HA group with its recovery. Safe for concurrent use.
type Group struct {
	g       *group.Group
	rec     *recover.Recoverer
	journal *tombstone.Journal // nil: tombstones in memory
	tombErr error              // why the journal could not be opened

	unwatch  func() // stops reporting the group (Options.Report)
	unfollow func() // stops following the behind marks (followMarks)

	mu  sync.Mutex // serialises Update, AddMember, RemoveMember, SetStandby
	cfg config.Group
	set config.Settings
}

// sink forwards the engine's events and starts the recovery of a member
// that failed. The recoverer exists only once the group does: failures
// before that are picked up by Resume.
type sink struct {
	next   group.EventSink
	report *fleet.Reporter
	rec    atomic.Pointer[recover.Recoverer]
}

func (s *sink) Event(e group.Event) {
	if s.next != nil {
		s.next.Event(e)
	}
	s.report.GroupEvent(e)
	if e.Kind == group.MemberFailed {
		if r := s.rec.Load(); r != nil {
			r.MemberFailed(e.Member)
		}
	}
}

// Open opens group g with settings s: its members (one that is down
// starts failed and is recovered later), its tombstone journal, and its
// recoverer, which starts on the members failed now. Members are not
// logged in: call Login with the application's PIN, or LoginConfigured
// (the members' own PIN sources, for the agent). The engine and the
// recoverer share one set of PIN marks in the state directory (see
// recover.PINBlocks). Open fails on an unusable configuration or when
// ctx ends; a journal that cannot be opened is not fatal (see
// TombstoneError).
func Open(ctx context.Context, g config.Group, s config.Settings, opts Options) (*Group, error) {
	h := &Group{cfg: cloneGroup(g), set: s}
	snk := &sink{next: opts.Events, report: opts.Report}
	gopts := group.Options{Events: snk, Interceptor: opts.Interceptor, MaxSessions: opts.MaxSessions, ThreadCallers: opts.ThreadCallers}
	stateDir := opts.StateDir
	gopts.StoreLocks = storeLocks(stateDir, g.Serial)
	var tombs recover.TombstoneSource
	if stateDir != "" {
		j, err := tombstone.Open(stateDir, g.Serial, tombstone.Options{Horizon: s.TombstoneHorizon})
		if err != nil {
			h.tombErr = fmt.Errorf("group %s: tombstones kept in memory: %w", g.Label, err)
			stateDir = ""
		} else {
			h.journal = j
		}
	}
	var local tombstone.Local = h.journal
	if h.journal == nil {
		local = &tombstone.Memory{}
	}
	// The tombstones live on the members too, for every process on every
	// host (DESIGN.md, "Group state on the members").
	shared := tombstone.NewShared(local, g.Serial, tombstone.SharedOptions{
		Horizon: s.TombstoneHorizon,
		OnError: func(m string, err error) {
			kind := group.TombstoneFailed
			if errors.Is(err, tombstone.ErrStalled) {
				kind = group.TombstoneStalled
			}
			snk.Event(group.Event{Kind: kind, Time: time.Now(), Member: m, Err: err})
		},
	})
	gopts.Tombstones, tombs = shared, shared
	if stateDir != "" {
		// What the members' tokens were tried for, for every process on
		// the host (a per-task tool would try them at every start).
		gopts.Facts = tokenfacts.Open(filepath.Join(stateDir, g.Serial), 0)
	}
	// One set of PIN marks for the engine (which consults it before every
	// login it makes by itself) and the recoverer (before every automatic
	// attempt), in the state directory every process on the host shares.
	blocks, err := recover.NewPINBlocks(stateDir, g.Serial, 0)
	if err != nil {
		h.closeJournal()
		return nil, fmt.Errorf("group %s: %w", g.Label, err)
	}
	gopts.PINGuard = blocks
	// A member a login finds behind is caught up before the login returns,
	// not an interval later: most processes (per-task tools) end sooner.
	// The login waits one command_timeout at most; a catch-up not done by
	// then goes on as automatic recovery.
	if opts.ReadOnly {
		s.Retries = 0 // recovery only when asked, and nobody asks
	}
	gopts.CatchUp = func(ctx context.Context, names []string) {
		if opts.ReadOnly {
			return
		}
		if r := snk.rec.Load(); r != nil {
			ctx, cancel := context.WithTimeout(ctx, s.CommandTimeout)
			defer cancel()
			catchUp(ctx, r, names)
		}
	}
	gr, err := group.Open(ctx, g, s, gopts)
	if err != nil {
		h.closeJournal()
		return nil, err
	}
	h.g = gr
	shared.SetMembers(gr.StateSlots)
	rec, err := recover.New(recover.Options{
		Engine:         gr,
		StateDir:       stateDir,
		Interval:       s.Interval,
		Retries:        s.Retries,
		AttemptTimeout: opts.AttemptTimeout,
		Tombstones:     tombs,
		Events:         reportRecovery(opts.Report, g.Label, opts.RecoveryEvents),
		Clock:          opts.Clock,
		PINBlocks:      blocks,
	})
	if err != nil {
		gr.Close()
		h.closeJournal()
		return nil, fmt.Errorf("group %s: recovery: %w", g.Label, err)
	}
	h.rec = rec
	snk.rec.Store(rec)
	rec.Resume()
	h.unwatch = opts.Report.Watch(gr)
	if !opts.ReadOnly {
		h.unfollow = h.followMarks(s.Interval, s.CommandTimeout)
	}
	return h, nil
}

func cloneGroup(g config.Group) config.Group {
	g.Members = slices.Clone(g.Members)
	return g
}

// Engine returns the group's engine, for sessions, login, key operations
// and the members' figures. Change membership through h (AddMember,
// RemoveMember, SetStandby, Update), which catches a member up before it
// takes work; the engine's methods of those names are the primitives h
// sequences.
func (h *Group) Engine() *group.Group { return h.g }

// TombstoneError says why the tombstone journal could not be opened in
// the state directory (tombstones are then kept in memory); nil when it
// was, or when no state directory was given.
func (h *Group) TombstoneError() error { return h.tombErr }

// Recoverer returns the group's recoverer.
func (h *Group) Recoverer() *recover.Recoverer { return h.rec }

// Recover recovers member name now: a failed member, including one whose
// automatic attempts ran out (see recover.Recoverer.Recover).
func (h *Group) Recover(ctx context.Context, name string) (recover.Result, error) {
	if _, ok := h.g.Member(name); !ok {
		return recover.Result{Member: name, Manual: true}, fmt.Errorf("group %s: recover member %q: %w", h.g.Label(), name, group.ErrUnknownMember)
	}
	return h.rec.Recover(ctx, name)
}

// Synchronize compares the serving members and, unless opts.Check, makes
// them equal (see recover.Recoverer.Synchronize). opts.Prune is
// destructive. A synchronisation that made every serving member equal
// clears the behind marks naming them that it read before it listed them
// (DESIGN.md, "Group state on the members").
func (h *Group) Synchronize(ctx context.Context, opts recover.SyncOptions) (*recover.SyncReport, error) {
	var marks []state.Mark
	if !opts.Check {
		marks = h.g.BehindMarks(ctx)
	}
	rep, err := h.rec.Synchronize(ctx, opts)
	if err == nil && len(marks) > 0 && madeEqual(rep) {
		h.g.ClearBehindMarks(ctx, marks)
	}
	return rep, err
}

// madeEqual reports whether a synchronisation left every serving member
// holding the same objects: every member listed, nothing unreadable,
// unreplicable, in conflict or failed.
func madeEqual(rep *recover.SyncReport) bool {
	p := rep.Plan
	return p != nil && len(p.Skipped) == 0 && len(p.Unreadable) == 0 && len(p.Conflicts) == 0 &&
		len(rep.Unreplicable) == 0 && (rep.Applied == nil || len(rep.Applied.Failed) == 0)
}

// Status is a snapshot of the group with the recovery state of each
// member.
type Status struct {
	group.Summary
	// TombstonesInMemory reports that destroys are not journalled on disk
	// (TombstoneError says why).
	TombstonesInMemory bool `json:"tombstones_in_memory"`
	// SyncError says why the members could not be compared now (no
	// member in service, say): every member then needs synchronisation.
	SyncError string         `json:"sync_error,omitempty"`
	Members   []MemberStatus `json:"members"`
}

// OutOfSync reports whether some member needs synchronisation: it
// differs from the others, or the members could not be compared.
func (s Status) OutOfSync() bool {
	return slices.ContainsFunc(s.Members, func(m MemberStatus) bool { return m.NeedsSync })
}

// MemberStatus is one member: the engine's figures (state, since when,
// work, health errors, missing mechanisms) and its recovery.
type MemberStatus struct {
	member.Snapshot
	Primary bool `json:"primary"`
	// Recovering reports whether a recovery attempt runs now (in this
	// process).
	Recovering bool `json:"recovering"`
	// AutoRecovery reports whether automatic attempts are scheduled.
	AutoRecovery bool `json:"auto_recovery"`
	// GaveUp reports whether the automatic attempts ran out: the member
	// stays failed until a manual Recover.
	GaveUp bool `json:"gave_up"`
	// PINBlocked reports whether the member's token refused its PIN: no
	// process sharing the state directory logs it in or recovers it
	// automatically until a manual Recover. PINBlockedReason says why.
	PINBlocked       bool   `json:"pin_blocked"`
	PINBlockedReason string `json:"pin_blocked_reason,omitempty"`
	// Attempts made in the current (or last) episode of automatic
	// recovery, and AttemptsLeft (-1: without limit).
	Attempts     int       `json:"attempts"`
	AttemptsLeft int       `json:"attempts_left"`
	LastAttempt  time.Time `json:"last_attempt,omitzero"`
	NextAttempt  time.Time `json:"next_attempt,omitzero"`
	// LastAttemptError is why the last attempt failed ("" after a
	// success).
	LastAttemptError string    `json:"last_attempt_error,omitempty"`
	LastRecovered    time.Time `json:"last_recovered,omitzero"`
	// OutOfSync is how many objects the member lacks, holds in excess,
	// holds in conflict or will not describe, by a comparison of what the
	// members hold now (recover.SyncReport.OutOfSync, the rule haagent's
	// listgroups, synchronize --check and metric apply): never a cached
	// plan, which other processes and hosts make stale. A member out of
	// service counts 1: what it holds is unknown. NeedsSync is OutOfSync
	// > 0, or the members could not be compared (Status.SyncError).
	OutOfSync int  `json:"out_of_sync"`
	NeedsSync bool `json:"needs_sync"`
	// CheckedAt is when a plan (a recovery or Synchronize) last listed it.
	CheckedAt time.Time `json:"checked_at,omitzero"`
	// Conflicts involving the member found by its last recovery attempt.
	Conflicts []hasync.Conflict `json:"conflicts,omitempty"`
	// Unreplicated are keys made since the member was last caught up
	// that it could not receive (it lacks CKM_AES_KEY_WRAP_PAD).
	Unreplicated []group.Unreplicated `json:"unreplicated,omitempty"`
}

// Status returns the group and its members' recovery, with how far each
// member is out of sync by a comparison of what the members hold now
// (OutOfSync): one listing of every serving member, so it costs what a
// synchronize --check costs. Snapshot is the same without the comparison.
func (h *Group) Status(ctx context.Context) Status {
	st := h.Snapshot()
	counts, err := h.OutOfSync(ctx)
	if err != nil {
		st.SyncError = err.Error()
	}
	for i := range st.Members {
		ms := &st.Members[i]
		ms.OutOfSync = counts[ms.Name]
		ms.NeedsSync = err != nil || ms.OutOfSync > 0
	}
	return st
}

// OutOfSync compares the members now (a synchronize --check) and returns,
// per member, how many differences concern it (recover.SyncReport's
// OutOfSync: the one rule for "in sync"); a member in sync has no entry.
// It fails when the members cannot be compared: none is in service.
func (h *Group) OutOfSync(ctx context.Context) (map[string]int, error) {
	serving := false
	for _, s := range h.g.Members() {
		serving = serving || s.State.Serving()
	}
	if !serving {
		return nil, fmt.Errorf("group %s: no member in service to compare", h.g.Label())
	}
	rep, err := h.rec.Synchronize(ctx, recover.SyncOptions{Check: true})
	if rep == nil || rep.Plan == nil {
		if err == nil {
			err = errors.New("no plan")
		}
		return nil, fmt.Errorf("group %s: compare the members: %w", h.g.Label(), err)
	}
	return rep.OutOfSync(), nil
}

// Snapshot returns the group and its members' recovery as this process
// knows them, without comparing the members: OutOfSync and NeedsSync are
// not set (Status sets them).
func (h *Group) Snapshot() Status {
	gs := h.g.Status()
	st := Status{Summary: gs.Summary, TombstonesInMemory: h.journal == nil}
	for _, snap := range gs.Members {
		rs := h.rec.Status(snap.Name)
		ms := MemberStatus{
			Snapshot:      snap,
			Primary:       snap.Name == gs.Primary,
			Recovering:    rs.InProgress,
			AutoRecovery:  rs.Auto,
			GaveUp:        rs.GaveUp,
			PINBlocked:    rs.PINBlocked,
			Attempts:      rs.Attempts,
			AttemptsLeft:  rs.AttemptsLeft,
			LastAttempt:   rs.LastAttempt,
			NextAttempt:   rs.NextAttempt,
			LastRecovered: rs.LastRecovered,
			CheckedAt:     rs.CheckedAt,
			Conflicts:     rs.Conflicts,
			Unreplicated:  h.g.Unreplicated(snap.Name),
		}
		if rs.LastError != nil {
			ms.LastAttemptError = rs.LastError.Error()
		}
		if rs.PINBlocked {
			ms.PINBlockedReason = rs.PINBlock.Reason
		}
		st.Members = append(st.Members, ms)
	}
	return st
}

// AddMember adds member mc to the running group and brings it into
// rotation: its token is opened and logged in, every object the group
// holds is copied to it (and what tombstones say was destroyed is removed
// from it), and only then does it take work — under the write barrier, so
// that no key made meanwhile is missed. The members already there keep
// working throughout. If the member cannot be brought in now, it stays in
// the group as failed, automatic recovery takes it from there, and the
// error says why.
func (h *Group) AddMember(ctx context.Context, mc config.Member) (recover.Result, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.addMember(ctx, mc)
}

func (h *Group) addMember(ctx context.Context, mc config.Member) (recover.Result, error) {
	if err := h.g.AddMember(ctx, mc); err != nil {
		if _, in := h.g.Member(mc.Name); in {
			h.noteMember(mc)
		}
		return recover.Result{Member: mc.Name, Manual: true, Admitted: true}, err
	}
	h.noteMember(mc)
	res, err := h.rec.Admit(ctx, mc.Name)
	if err != nil {
		return res, fmt.Errorf("group %s: member %s added but not in rotation yet (automatic recovery retries it): %w", h.g.Label(), mc.Name, err)
	}
	return res, nil
}

// noteMember records mc in the group's configuration copy.
func (h *Group) noteMember(mc config.Member) {
	if cm, ok := h.cfg.Member(mc.Name); ok {
		*cm = mc
		return
	}
	h.cfg.Members = append(h.cfg.Members, mc)
}

// RemoveMember takes member name out of the running group once the work
// in flight on it has ended (see group.Group.RemoveMember); its automatic
// recovery stops.
func (h *Group) RemoveMember(ctx context.Context, name string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.removeMember(ctx, name)
}

func (h *Group) removeMember(ctx context.Context, name string) error {
	if err := h.g.RemoveMember(ctx, name); err != nil {
		return err
	}
	h.rec.Forget(name)
	h.cfg.RemoveMember(name)
	return nil
}

// SetStandby makes member name a standby or an active member (see
// group.Group.SetStandby).
func (h *Group) SetStandby(name string, standby bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.g.SetStandby(name, standby); err != nil {
		return err
	}
	if cm, ok := h.cfg.Member(name); ok {
		cm.Standby = standby
	}
	return nil
}

// ErrReopen is returned by Update for a change the running group cannot
// take: a new serial, command_timeout, keygen_timeout, failure_threshold
// or tombstone_horizon. Close the group and open it again.
var ErrReopen = errors.New("change needs the group reopened")

// Update brings the running group to configuration g with settings s
// without disturbing what did not change: members added (caught up before
// they take work), removed (after their work in flight ended), changed
// (token, module or PIN source: removed and added again) or moved to or
// from standby; the configured order; the policy, recovery mode, retry
// count and interval. It returns one line per change. A change it cannot
// make in place gives ErrReopen before anything is changed. A member
// that cannot be brought in now stays in the group as failed (its line
// says so) and is recovered automatically. Lines read "member: event
// (detail)" with the events member_added, member_removed, member_changed,
// member_standby and member_active, or "setting: value".
func (h *Group) Update(ctx context.Context, g config.Group, s config.Settings) ([]string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if g.Label != h.cfg.Label || g.Serial != h.cfg.Serial {
		return nil, fmt.Errorf("group %s: label or serial changed: %w", h.g.Label(), ErrReopen)
	}
	old := h.set
	fixed := old
	fixed.Policy, fixed.RecoveryMode, fixed.Retries, fixed.Interval = s.Policy, s.RecoveryMode, s.Retries, s.Interval
	fixed.ProbeInterval, fixed.Only = s.ProbeInterval, s.Only // not the engine's
	if fixed != s {
		return nil, fmt.Errorf("group %s: command_timeout, keygen_timeout, failure_threshold or tombstone_horizon changed: %w", h.g.Label(), ErrReopen)
	}
	if len(g.Members) == 0 {
		return nil, fmt.Errorf("group %s: no members", h.g.Label())
	}
	want := map[string]config.Member{}
	for _, m := range g.Members {
		want[m.Name] = m
	}
	var stay, changed, gone []config.Member
	for _, om := range h.cfg.Members {
		nm, keep := want[om.Name]
		switch {
		case !keep:
			gone = append(gone, om)
		case !sameToken(om, nm):
			changed = append(changed, nm)
		default:
			stay = append(stay, nm)
		}
	}
	if len(stay) == 0 {
		// Nothing running would survive: reopening loses nothing.
		return nil, fmt.Errorf("group %s: no member is kept as it was: %w", h.g.Label(), ErrReopen)
	}
	var lines []string
	if s.Policy != old.Policy {
		if err := h.g.SetPolicy(s.Policy); err != nil {
			return lines, err
		}
		lines = append(lines, "policy: "+h.g.Status().Policy)
	}
	if s.RecoveryMode != old.RecoveryMode {
		if err := h.g.SetRecoveryMode(s.RecoveryMode); err != nil {
			return lines, err
		}
		lines = append(lines, "recovery_mode: "+h.g.RecoveryMode())
	}
	if s.Retries != old.Retries || s.Interval != old.Interval {
		if err := h.rec.Reconfigure(s.Interval, s.Retries); err != nil {
			return lines, fmt.Errorf("group %s: %w", h.g.Label(), err)
		}
		lines = append(lines, fmt.Sprintf("recovery: retries %d, interval %v", s.Retries, s.Interval))
	}
	h.set = s

	for _, nm := range stay {
		if om, _ := h.cfg.Member(nm.Name); om.Standby == nm.Standby {
			continue
		}
		if err := h.g.SetStandby(nm.Name, nm.Standby); err != nil {
			return lines, err
		}
		h.noteMember(nm)
		if nm.Standby {
			lines = append(lines, nm.Name+": member_standby (designated standby)")
		} else {
			lines = append(lines, nm.Name+": member_active (returned from standby)")
		}
	}
	// A changed member leaves before its new self opens the token; new
	// members join before the removed ones leave, so the group never
	// shrinks more than it must.
	for _, nm := range changed {
		if err := h.removeMember(ctx, nm.Name); err != nil {
			return lines, err
		}
	}
	for _, nm := range g.Members {
		_, had := h.g.Member(nm.Name)
		isChanged := slices.ContainsFunc(changed, func(m config.Member) bool { return m.Name == nm.Name })
		if had && !isChanged {
			continue
		}
		event := "member_added"
		if isChanged {
			event = "member_changed"
		}
		res, err := h.addMember(ctx, nm)
		switch {
		case err != nil:
			if _, in := h.g.Member(nm.Name); !in {
				return lines, err
			}
			lines = append(lines, fmt.Sprintf("%s: %s (not in rotation yet: %v)", nm.Name, event, err))
		default:
			lines = append(lines, fmt.Sprintf("%s: %s (caught up: copied %d, deleted %d)", nm.Name, event, res.CatchUp.Copied, res.CatchUp.Deleted))
		}
	}
	for _, om := range gone {
		if err := h.removeMember(ctx, om.Name); err != nil {
			return lines, err
		}
		lines = append(lines, om.Name+": member_removed (its work in flight ended)")
	}
	order := make([]string, len(g.Members))
	for i, m := range g.Members {
		order[i] = m.Name
	}
	if !slices.Equal(order, h.names()) {
		if err := h.g.SetOrder(order); err != nil {
			return lines, err
		}
		lines = append(lines, "order: "+strings.Join(order, ", "))
	}
	h.cfg = cloneGroup(g)
	return lines, nil
}

// names returns the members' names in configured order.
func (h *Group) names() []string {
	var out []string
	for _, m := range h.g.Members() {
		out = append(out, m.Name)
	}
	return out
}

// sameToken reports whether two configurations of a member name the same
// token the same way (everything but the standby flag).
func sameToken(a, b config.Member) bool {
	a.Standby, b.Standby = false, false
	return reflect.DeepEqual(a, b)
}

// Close stops recovery, closes the group (waiting for the work in flight)
// and the journal.
func (h *Group) Close() error {
	if h.unfollow != nil {
		h.unfollow()
	}
	if h.unwatch != nil {
		h.unwatch()
	}
	errs := []error{h.rec.Close(), h.g.Close()}
	errs = append(errs, h.closeJournal())
	return errors.Join(errs...)
}

func (h *Group) closeJournal() error {
	if h.journal == nil {
		return nil
	}
	return h.journal.Close()
}

// catchUp recovers the named members at once, in parallel, each bounded
// by the recovery's own attempt timeout; one that fails stays failed, and
// automatic recovery goes on with it.
func catchUp(ctx context.Context, r *recover.Recoverer, names []string) {
	var wg sync.WaitGroup
	for _, name := range names {
		wg.Go(func() { _, _ = r.Recover(ctx, name) })
	}
	wg.Wait()
}

// storeLocks is the directory of group serial's store locks in stateDir
// (group.Options.StoreLocks), beside its recovery locks, made as the
// recoverer makes it; "" without a state directory, or when it cannot be
// made (each process then reads the list before a change alone).
func storeLocks(stateDir, serial string) string {
	if stateDir == "" {
		return ""
	}
	dir := filepath.Join(stateDir, serial)
	if err := os.MkdirAll(dir, 0o770); err != nil {
		return ""
	}
	return dir
}
