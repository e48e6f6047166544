// Package recover brings failed members of an HA group back into rotation,
// automatically and on an operator's request.
//
// A failed member is retried every interval (any value of at least one
// second), retries times (-1: without limit, 0: never automatically); after
// the last attempt it stays failed until a manual Recover. One attempt:
//
//  1. re-opens the member: its own module context is re-initialised (a
//     killed remote token answers CKR_DEVICE_ERROR until then), the token
//     is found again by label, serial or URI (slot IDs change), and the
//     member logs in again;
//  2. catches up: the objects of the member and of every serving member are
//     listed once each and joined (sync.MakePlan); what the member missed
//     is copied to it, what was destroyed through the group while it was
//     away (a tombstone) is destroyed on it, what only it holds is copied
//     to the others; conflicts (one identity, two key materials) keep it
//     out of rotation and are reported with both fingerprints. The
//     tombstones are read after the listing and again after the copies,
//     so an object destroyed through the group (in any process) during
//     the catch-up is not copied back, and a copy whose object is
//     destroyed meanwhile is skipped (CatchUp.Vanished). Objects a member
//     lists but will not describe (CatchUp.Unreadable) are reported and
//     left alone;
//  3. returns it to rotation as active or standby, only after the catch-up
//     applied cleanly — the way a reintegrated strongSwan node activates
//     its segments only after all state has been exchanged. The return
//     happens under the group's write barrier (Engine.HoldWrites): if any
//     object was made, destroyed or changed through the group since the
//     catch-up's last listing (Engine.WriteMark moved), one more plan and
//     apply runs first while key management waits, so nothing created
//     between the last plan and the activation is missed. Signing and the
//     other operations are not held.
//
// Keys that must travel wrapped under the domain key (private and secret
// keys) cannot reach or leave a member whose token lacks
// CKM_AES_KEY_WRAP_PAD (one served by p11-kit 0.24, for one). Such copies
// are left out of the catch-up (CatchUp.Unreplicable) instead of failing
// it: the member returns to rotation and is reported out of sync by them
// (SyncReport.OutOfSync of a check). Members that can wrap are preferred as
// the source of a copy.
//
// Admit brings in a member just added to the group (group.AddMember
// leaves it recovering): the same catch-up and activation, without the
// re-open.
//
// Attempts run on the recoverer's own goroutines, never on an
// application's call. At most one attempt per member runs at a time: in
// the process (a second caller joins the running attempt) and on the host
// (an exclusive flock on state_dir/<group serial>/<member>.recover.lock,
// which the agent and every application process take), so a manual
// recovery and the auto-recovery never work on one member together — the
// race the Luna documentation warns corrupts keys.
//
// A member whose token refused its PIN (CKR_PIN_INCORRECT, _LOCKED,
// _EXPIRED) — at an attempt's login, or at any login the engine made by
// itself — is marked in state_dir/<group serial>/<member>.pinblock
// (PINBlocks): no automatic attempt is made on it, in any process sharing
// the state directory, until a manual Recover clears the mark and tries
// once. A real HSM locks its user out after a few wrong PINs; offering
// the same wrong one at every interval would.
//
// Each attempt and its outcome is an Event.
package recover

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hagroup/hagroup/internal/filelock"
	"github.com/hagroup/hagroup/internal/tokenquirk"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	hasync "github.com/hagroup/hagroup/pkg/sync"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/hagroup/hagroup/pkg/sync/tombstone"
	"github.com/miekg/pkcs11"
)

// Errors, usable with errors.Is.
var (
	// ErrInProgress: another attempt to recover the member is running in
	// another process on this host (or was still running when the caller's
	// context ended).
	ErrInProgress = errors.New("recovery in progress")
	// ErrNotFailed: the member is not failed (it is serving, being
	// recovered by someone else in this process, or removed).
	ErrNotFailed = errors.New("member is not failed")
	// ErrClosed: the Recoverer is closed.
	ErrClosed = errors.New("recoverer closed")
	// ErrCreationInFlight: the member alone holds an object that a
	// creation running in another process of this host may be making
	// (sync.Plan.InFlight); the attempt is made again once it returned.
	ErrCreationInFlight = errors.New("a creation of an object the member alone holds is running in another process")
)

// MinInterval is the shortest retry interval accepted.
const MinInterval = time.Second

// DefaultAttemptTimeout bounds one attempt when Options.AttemptTimeout is
// 0. Catching up thousands of objects takes a while; the calls inside an
// attempt have their own, shorter deadlines.
const DefaultAttemptTimeout = 10 * time.Minute

// maxPasses bounds the plan/apply rounds of one catch-up: objects made or
// destroyed through the group while the member catches up are picked up by
// the next round.
const maxPasses = 3

// Engine is the part of the HA engine a Recoverer drives, one group's
// worth. *group.Group satisfies it as it is. Every method must be safe for
// concurrent use.
type Engine interface {
	// Serial returns the group's serial, which names its state directory.
	Serial() string
	// Members returns a snapshot of every member, in configured order.
	Members() []member.Snapshot
	// Member returns the named member.
	Member(name string) (*member.Member, bool)
	// Reconnect moves a failed member to recovering (out of rotation),
	// re-opens its token (re-initialising the module context if the
	// member owns it, finding the token again by label, serial or URI),
	// logs it in as the group is, and drops the physical handles cached
	// for it. It returns the member's slot. On error the member is failed
	// again.
	Reconnect(ctx context.Context, name string) (*slot.Slot, error)
	// ActivateMember returns a recovering member to rotation, as active
	// or standby as configured. The Recoverer calls it while it holds
	// the write barrier.
	ActivateMember(ctx context.Context, name string) error
	// FailMember moves the member to failed with the reason (nothing if
	// it is failed already).
	FailMember(name string, reason error) error
	// WriteMark returns a number that moves whenever an object is made,
	// destroyed or changed through the group.
	WriteMark() uint64
	// HoldWrites holds back object creation, destruction and attribute
	// changes through the group (waiting, bounded by ctx, for those in
	// progress) until release is called.
	HoldWrites(ctx context.Context) (release func(), err error)
	// Replicator returns the engine's replicator, which the Recoverer
	// copies with too: one copy at a time into each member token, one
	// audit of each member's domain key, a weak key reported once.
	Replicator() *hasync.Replicator
}

// wrapMechanism is the name a member's snapshot lists in
// MissingMechanisms when its token cannot wrap or unwrap keys the way
// replication needs (group.MechWrapPad).
const wrapMechanism = "CKM_AES_KEY_WRAP_PAD"

// TombstoneSource gives the group's tombstones. *tombstone.Journal
// implements it.
type TombstoneSource interface {
	Snapshot(ctx context.Context) (*tombstone.Set, error)
}

// CatchUpFunc brings self up to date with peers; see Options.CatchUp.
type CatchUpFunc func(ctx context.Context, self hasync.PlanMember, peers []hasync.PlanMember) (CatchUp, error)

// CatchUp says what the catch-up of one attempt did.
type CatchUp struct {
	// Passes is the number of plan/apply rounds.
	Passes int
	// Copied and Deleted count the actions carried out on any member.
	Copied, Deleted int
	// Skipped are peers left out of the plan because they did not answer.
	Skipped map[string]error
	// PeerErrors are failed actions on peers (copies of objects only the
	// recovering member held). They do not keep the member out: the peer
	// is the one in trouble, and catches up when it recovers.
	PeerErrors []hasync.ActionError
	// OtherConflicts are conflicts among the peers that do not involve the
	// recovering member; they are reported, and do not keep it out.
	OtherConflicts []hasync.Conflict
	// Unreplicable are the copies left out because the member copied to
	// or from lacks CKM_AES_KEY_WRAP_PAD (private and secret keys travel
	// wrapped). They do not keep the member out; it is out of sync by
	// them.
	Unreplicable []hasync.Action
	// Unreadable are the objects, on the member or its peers, that the
	// last pass's listing found but could not read (see
	// sync.Unreadable): never copied nor counted as conflicts, they do
	// not keep the member out; they are reported, and count as out of
	// sync for the member holding them.
	Unreadable []hasync.Unreadable
	// Final reports whether a last pass ran under the write barrier
	// because objects changed through the group during the catch-up.
	Final bool

	// Vanished counts the copies not made, or taken back, because the
	// object was destroyed while it was being copied.
	Vanished int

	mark      uint64 // Engine.WriteMark before the last listing
	converged bool   // the last pass found nothing left for the member
}

// ConflictError says that the recovering member holds an object whose
// identity another member holds with different key material. The member
// stays out of rotation until an operator resolves it.
type ConflictError struct {
	Member    string
	Conflicts []hasync.Conflict
}

func (e *ConflictError) Error() string {
	parts := make([]string, len(e.Conflicts))
	for i, c := range e.Conflicts {
		parts[i] = c.String()
	}
	return fmt.Sprintf("member %s kept out of rotation: %d conflicting object(s): %s",
		e.Member, len(e.Conflicts), strings.Join(parts, "; "))
}

// Unwrap makes errors.Is(err, object.ErrConflict) true.
func (e *ConflictError) Unwrap() error { return object.ErrConflict }

// Options configure a Recoverer.
type Options struct {
	// Engine is the group to recover members of. Required.
	Engine Engine
	// StateDir is the agent's state directory; the cross-process lock
	// files live in StateDir/<group serial>/. Empty: only the in-process
	// guard (for programs without a state directory; two processes could
	// then recover one member at once).
	StateDir string
	// Interval between automatic attempts on a member; at least
	// MinInterval.
	Interval time.Duration
	// Retries is the number of automatic attempts after a member fails:
	// -1 without limit, 0 none.
	Retries int
	// AttemptTimeout bounds one attempt; 0 means DefaultAttemptTimeout.
	AttemptTimeout time.Duration
	// Tombstones are honoured by the catch-up; nil: none (every object
	// found on some members only is copied to the rest).
	Tombstones TombstoneSource
	// Events receives every event, synchronously, without the Recoverer's
	// lock held; it must not block. Nil: events are dropped.
	Events func(Event)
	// Clock drives the retry timers; nil means RealClock.
	Clock Clock
	// CatchUp replaces the catch-up step, including the final pass under
	// the write barrier (the activation still happens under it); nil
	// means the sync plan (MakePlan + Apply, repeated until nothing is
	// left for the member, and once more under the barrier if objects
	// changed meanwhile).
	CatchUp CatchUpFunc
	// LockPerm is the mode of lock files created; 0 means 0660.
	LockPerm os.FileMode
	// PINBlocks holds the members' PIN marks (see ErrPINBlocked); give
	// the group the same one as its group.PINGuard. Nil: the Recoverer
	// makes its own, in StateDir (in memory without one).
	PINBlocks *PINBlocks
}

// Result is the outcome of one attempt.
type Result struct {
	Member string
	// Manual reports whether the attempt was a manual Recover or an
	// Admit.
	Manual bool
	// Admitted reports whether the attempt was an Admit (a member just
	// added).
	Admitted bool
	// Joined reports whether the caller joined an attempt that was
	// already running in this process instead of starting one.
	Joined bool
	// Attempt is the number of an automatic attempt in its episode (1 for
	// the first attempt after the failure); 0 for a manual one.
	Attempt  int
	CatchUp  CatchUp
	Duration time.Duration
}

// Status is the recovery state of one member.
type Status struct {
	Member string
	// InProgress reports whether an attempt is running in this process.
	InProgress bool
	// Auto reports whether automatic attempts are scheduled.
	Auto bool
	// GaveUp reports whether the automatic attempts ran out; the member
	// stays failed until a manual Recover.
	GaveUp bool
	// Attempts made in the current (or last) episode of automatic
	// recovery.
	Attempts int
	// AttemptsLeft of the episode; -1 without limit.
	AttemptsLeft int
	// LastAttempt is when the last attempt (automatic or manual) began.
	LastAttempt time.Time
	// LastError is the cause of the last failed attempt; nil after a
	// success.
	LastError error
	// LastRecovered is when the member last came back.
	LastRecovered time.Time
	// PINBlocked reports whether the member's token refused its PIN:
	// no automatic attempt is made, in any process sharing the state
	// directory, until a manual Recover. PINBlock says when and why.
	PINBlocked bool
	PINBlock   PINBlock
	// NextAttempt is when the next automatic attempt is due (zero when
	// none is scheduled).
	NextAttempt time.Time
	// Conflicts found by the last attempt that involve the member.
	Conflicts []hasync.Conflict
	// CheckedAt is the last time a plan (a recovery attempt or
	// Synchronize) listed the member. How far it is out of sync is never
	// cached: SyncReport.OutOfSync of a check made now says.
	CheckedAt time.Time
}

// Recoverer runs the recovery of one group's members. Its methods are safe
// for concurrent use.
type Recoverer struct {
	eng     Engine
	blocks  *PINBlocks
	clock   Clock
	repl    *hasync.Replicator
	opts    Options
	catchUp CatchUpFunc

	base   context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	interval time.Duration
	retries  int
	members  map[string]*memberRec
	halfMade leftovers
	closed   bool
}

type memberRec struct {
	name string

	// All below guarded by Recoverer.mu.
	gen          uint64 // episode generation: a loop of an older one exits
	episode      bool   // automatic attempts are scheduled
	gaveUp       bool
	attempts     int
	attemptsLeft int
	lastAttempt  time.Time
	lastErr      error
	lastOK       time.Time
	next         time.Time
	conflicts    []hasync.Conflict
	checked      time.Time // when a plan last listed the member
	flight       *flight
	kick         chan struct{} // re-arms the loop's timer (interval changed)
	blockSeen    bool          // PINBlocked was reported for the mark there is now
}

// flight is one attempt running; callers that join wait for done.
type flight struct {
	done chan struct{}
	out  outcome
}

type outcome struct {
	res     Result
	err     error
	counted bool // an attempt ran against the member
	stop    bool // the episode is over (recovered, not failed, or gave up)
}

// New returns a Recoverer for opts.Engine's group. Then call Resume, and
// MemberFailed whenever a member fails (from the group's member-failed
// event); Recover for a manual recovery; Close when done.
func New(opts Options) (*Recoverer, error) {
	if opts.Engine == nil {
		return nil, errors.New("recover: no engine")
	}
	if err := checkPolicy(opts.Interval, opts.Retries); err != nil {
		return nil, err
	}
	serial := opts.Engine.Serial()
	if opts.StateDir != "" {
		if err := checkName("group serial", serial); err != nil {
			return nil, err
		}
	}
	if opts.AttemptTimeout <= 0 {
		opts.AttemptTimeout = DefaultAttemptTimeout
	}
	if opts.LockPerm == 0 {
		opts.LockPerm = 0o660
	}
	if opts.PINBlocks == nil {
		b, err := NewPINBlocks(opts.StateDir, serial, opts.LockPerm)
		if err != nil {
			return nil, err
		}
		opts.PINBlocks = b
	}
	r := &Recoverer{
		eng:      opts.Engine,
		blocks:   opts.PINBlocks,
		clock:    opts.Clock,
		repl:     opts.Engine.Replicator(),
		opts:     opts,
		catchUp:  opts.CatchUp,
		interval: opts.Interval,
		retries:  opts.Retries,
		members:  map[string]*memberRec{},
		halfMade: leftovers{},
	}
	if r.clock == nil {
		r.clock = RealClock{}
	}
	if r.catchUp == nil {
		r.catchUp = r.planCatchUp
	}
	r.base, r.cancel = context.WithCancel(context.Background())
	return r, nil
}

func checkPolicy(interval time.Duration, retries int) error {
	if interval < MinInterval {
		return fmt.Errorf("recover: interval %v is shorter than the minimum %v", interval, MinInterval)
	}
	if retries < -1 {
		return fmt.Errorf("recover: retries %d: want -1 (unlimited), 0 (off) or a positive count", retries)
	}
	return nil
}

func checkName(what, s string) error {
	if s == "" || s == "." || s == ".." || strings.ContainsAny(s, "/\x00") {
		return fmt.Errorf("recover: %s %q cannot name a file", what, s)
	}
	return nil
}

// rec returns the record of member name, creating it. r.mu must be held.
func (r *Recoverer) rec(name string) *memberRec {
	m := r.members[name]
	if m == nil {
		m = &memberRec{name: name, attemptsLeft: r.retries, kick: make(chan struct{}, 1)}
		r.members[name] = m
	}
	return m
}

func (r *Recoverer) emit(e Event) {
	if r.opts.Events == nil {
		return
	}
	if e.Time.IsZero() {
		e.Time = r.clock.Now()
	}
	r.opts.Events(e)
}

// MemberFailed starts automatic recovery of member name: the first attempt
// one interval from now, then one per interval, Retries times. It does
// nothing when automatic recovery is off (Retries 0), when attempts for
// the member are already scheduled (a failure during an attempt does not
// restart the count), or when they ran out (a manual Recover is needed).
// Call it from the group's member-failed event; it does not block.
func (r *Recoverer) MemberFailed(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	m := r.rec(name)
	if m.episode || m.gaveUp || r.retries == 0 {
		return
	}
	r.startEpisodeLocked(m)
}

// startEpisodeLocked schedules automatic attempts for m with a fresh
// budget. r.mu must be held.
func (r *Recoverer) startEpisodeLocked(m *memberRec) {
	m.gen++
	m.episode = true
	m.gaveUp = false
	m.attempts = 0
	m.attemptsLeft = r.retries
	r.wg.Add(1)
	go r.loop(m, m.gen)
}

// loop runs the automatic attempts of one episode.
func (r *Recoverer) loop(m *memberRec, gen uint64) {
	defer r.wg.Done()
	for {
		r.mu.Lock()
		if r.closed || m.gen != gen || !m.episode {
			r.mu.Unlock()
			return
		}
		d := r.interval
		m.next = r.clock.Now().Add(d)
		kick := m.kick
		r.mu.Unlock()

		t := r.clock.NewTimer(d)
		select {
		case <-t.C():
		case <-kick:
			t.Stop()
			continue
		case <-r.base.Done():
			t.Stop()
			return
		}
		if r.autoAttempt(m, gen) {
			return
		}
	}
}

// autoAttempt makes one scheduled attempt and reports whether the episode
// is over.
func (r *Recoverer) autoAttempt(m *memberRec, gen uint64) bool {
	r.mu.Lock()
	if r.closed || m.gen != gen || !m.episode {
		r.mu.Unlock()
		return true
	}
	if m.flight != nil {
		// A manual attempt is running; it decides. This tick is not an
		// attempt and costs nothing.
		r.mu.Unlock()
		return false
	}
	fl := &flight{done: make(chan struct{})}
	m.flight = fl
	m.next = time.Time{}
	r.mu.Unlock()

	ctx, cancel := context.WithTimeout(r.base, r.opts.AttemptTimeout)
	out := r.run(ctx, m, gen, false, false)
	cancel()
	return r.finish(m, fl, gen, false, out)
}

// Resume starts automatic recovery of every member failed now. Call it
// once after New: members that failed while the group opened reported it
// before the Recoverer existed.
func (r *Recoverer) Resume() {
	for _, snap := range r.eng.Members() {
		if snap.State == member.Failed {
			r.MemberFailed(snap.Name)
		}
	}
}

// Recover makes an attempt to recover member name now, whether automatic
// attempts are scheduled, ran out, or are off. If an attempt on the member
// is already running in this process, Recover waits for it and returns its
// outcome (Result.Joined). If one is running in another process on the
// host, Recover waits for it to end and then makes its own attempt, as
// long as ctx allows; when ctx ends first, the error wraps ErrInProgress.
// A member that is not failed gives an error wrapping ErrNotFailed.
//
// A successful Recover ends the automatic attempts of the episode; a
// failed one leaves them as they were.
func (r *Recoverer) Recover(ctx context.Context, name string) (Result, error) {
	return r.manual(ctx, name, false)
}

// Admit catches up member name, just added to the group and left
// recovering by group.AddMember, and returns it to rotation (see the
// package documentation). It runs under the member's host-wide lock, like
// a manual Recover, and joins an attempt already running in this process.
// A member that is not recovering gives an error wrapping ErrNotFailed.
// On failure the member is failed, and automatic recovery takes it from
// there.
func (r *Recoverer) Admit(ctx context.Context, name string) (Result, error) {
	return r.manual(ctx, name, true)
}

func (r *Recoverer) manual(ctx context.Context, name string, admit bool) (Result, error) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return Result{Member: name, Manual: true}, fmt.Errorf("recover member %s: %w", name, ErrClosed)
	}
	m := r.rec(name)
	if fl := m.flight; fl != nil {
		r.mu.Unlock()
		select {
		case <-fl.done:
			res := fl.out.res
			res.Joined = true
			return res, fl.out.err
		case <-ctx.Done():
			return Result{Member: name, Manual: true, Joined: true},
				fmt.Errorf("recover member %s: %w: waiting for the running attempt: %w", name, ErrInProgress, context.Cause(ctx))
		}
	}
	fl := &flight{done: make(chan struct{})}
	m.flight = fl
	gen := m.gen
	r.wg.Add(1)
	r.mu.Unlock()
	defer r.wg.Done()

	ctx, cancel := context.WithTimeout(ctx, r.opts.AttemptTimeout)
	defer cancel()
	stop := context.AfterFunc(r.base, cancel) // Close cancels manual attempts too
	defer stop()
	out := r.run(ctx, m, gen, true, admit)
	r.finish(m, fl, gen, true, out)
	return out.res, out.err
}

// run makes one attempt on m under the member's host-wide lock: a
// recovery of a failed member, or with admit the admission of a new one.
func (r *Recoverer) run(ctx context.Context, m *memberRec, gen uint64, manual, admit bool) outcome {
	out := outcome{res: Result{Member: m.name, Manual: manual, Admitted: admit}}
	unlock, err := r.lockMember(ctx, m.name, manual)
	if err != nil {
		out.err = err
		if errors.Is(err, ErrInProgress) && !manual {
			r.emit(Event{Kind: AttemptSkipped, Member: m.name, Err: err})
		}
		return out
	}
	defer unlock()

	// Only a failed member is recovered. Checked under the host lock, so
	// a member another attempt has just brought back costs nothing.
	mem, ok := r.eng.Member(m.name)
	if !ok {
		out.err = fmt.Errorf("recover member %s: no such member", m.name)
		out.stop = true
		return out
	}
	if st := mem.State(); !admit && st != member.Failed {
		out.err = fmt.Errorf("recover member %s: it is %v: %w", m.name, st, ErrNotFailed)
		out.stop = true
		return out
	} else if admit && st != member.Recovering {
		out.err = fmt.Errorf("admit member %s: it is %v, not recovering: %w", m.name, st, ErrNotFailed)
		out.stop = true
		return out
	}
	if err := r.checkPINBlock(m, manual); err != nil {
		out.err = fmt.Errorf("recover member %s: %w", m.name, err)
		return out
	}
	out.counted = true
	start := r.clock.Now()
	r.mu.Lock()
	if !manual && m.gen == gen && m.episode {
		m.attempts++
		if m.attemptsLeft > 0 {
			m.attemptsLeft--
		}
		out.res.Attempt = m.attempts
	}
	m.lastAttempt = start
	left := m.attemptsLeft
	if manual && !m.episode {
		left = 0
	}
	r.mu.Unlock()
	r.emit(Event{Kind: AttemptStarted, Time: start, Member: m.name, Attempt: out.res.Attempt, AttemptsLeft: left, Manual: manual})

	var cu CatchUp
	if admit {
		cu, err = r.catchUpAndActivate(ctx, m.name, mem.Slot())
	} else {
		cu, err = r.attempt(ctx, m.name)
	}
	out.res.CatchUp = cu
	out.res.Duration = r.clock.Now().Sub(start)
	if err != nil {
		out.err = fmt.Errorf("recover %s: %w", memberOf(m.name, err), err)
		r.eng.FailMember(m.name, out.err)
		var ce *ConflictError
		if errors.As(err, &ce) {
			r.emit(Event{Kind: ConflictFound, Member: m.name, Attempt: out.res.Attempt, Manual: manual, Conflicts: ce.Conflicts, Err: err})
		}
		if slot.PINRefused(err) {
			r.notePINRefused(m, out.err)
		}
		return out
	}
	out.stop = true
	return out
}

// checkPINBlock is the PIN mark's rule, checked under the member's host
// lock before every attempt: a manual attempt clears the mark (the
// operator says the PIN source is fixed) and goes on; an automatic one is
// not made while the mark is there, whichever process made it, and costs
// no attempt. The first automatic attempt held back by a mark reports it
// (PINBlocked).
func (r *Recoverer) checkPINBlock(m *memberRec, manual bool) error {
	if manual {
		r.mu.Lock()
		m.blockSeen = false
		r.mu.Unlock()
		return r.blocks.Clear(m.name)
	}
	mk, ok := r.blocks.Get(m.name)
	r.mu.Lock()
	report := ok && !m.blockSeen
	m.blockSeen = ok
	r.mu.Unlock()
	if !ok {
		return nil
	}
	err := mk.err(m.name)
	if report {
		r.emit(Event{Kind: PINBlocked, Member: m.name, Err: err})
	}
	return err
}

// notePINRefused marks member m after its attempt's login was refused
// (the engine's guard has usually marked it already) and reports it.
func (r *Recoverer) notePINRefused(m *memberRec, err error) {
	if _, ok := r.blocks.Get(m.name); !ok {
		r.blocks.Mark(m.name, err) // an unwritable mark still holds in this process
	}
	r.mu.Lock()
	m.blockSeen = true
	r.mu.Unlock()
	r.emit(Event{Kind: PINBlocked, Member: m.name, Err: err})
}

// memberOf names member name for an error's prefix, unless err names it
// already (see slot.NamesMember).
func memberOf(name string, err error) string {
	if slot.NamesMember(err, name) {
		return "attempt"
	}
	return "member " + name
}

// attempt re-opens, catches up and activates member name.
func (r *Recoverer) attempt(ctx context.Context, name string) (CatchUp, error) {
	s, err := r.eng.Reconnect(ctx, name)
	if err != nil {
		return CatchUp{}, fmt.Errorf("re-open token: %w", err)
	}
	return r.catchUpAndActivate(ctx, name, s)
}

// catchUpAndActivate catches member name (open on s) up with the serving
// members and returns it to rotation under the write barrier, after one
// more pass if objects changed through the group since the last listing.
func (r *Recoverer) catchUpAndActivate(ctx context.Context, name string, s *slot.Slot) (CatchUp, error) {
	self := hasync.PlanMember{Name: name, Slot: s}
	cu, err := r.catchUp(ctx, self, r.peers(name))
	if err != nil {
		return cu, err
	}
	release, err := r.eng.HoldWrites(ctx)
	if err != nil {
		return cu, fmt.Errorf("hold key management for the final catch-up: %w", err)
	}
	defer release()
	if r.opts.CatchUp == nil && (!cu.converged || r.eng.WriteMark() != cu.mark) {
		fin, err := r.planPasses(ctx, self, r.peers(name), 1, true)
		cu.Passes += fin.Passes
		cu.Copied += fin.Copied
		cu.Deleted += fin.Deleted
		cu.Vanished += fin.Vanished
		cu.Skipped, cu.PeerErrors, cu.OtherConflicts, cu.Unreplicable = fin.Skipped, fin.PeerErrors, fin.OtherConflicts, fin.Unreplicable
		cu.Unreadable = fin.Unreadable
		cu.Final = true
		if err != nil {
			return cu, fmt.Errorf("final catch-up: %w", err)
		}
	}
	if err := r.eng.ActivateMember(ctx, name); err != nil {
		return cu, fmt.Errorf("return to rotation: %w", err)
	}
	return cu, nil
}

// lacking returns the members that cannot wrap or unwrap replicated keys.
func (r *Recoverer) lacking() map[string]bool {
	out := map[string]bool{}
	for _, snap := range r.eng.Members() {
		for _, mech := range snap.MissingMechanisms {
			if mech == wrapMechanism && !r.byPairs(snap.Name) {
				out[snap.Name] = true
			}
		}
	}
	return out
}

// byPairs reports whether member name's make carries keys by the ways its
// pairs proved although it lacks the wrap mechanism (the opencryptoki soft
// token): its copies are tried, and a key no way carries is left out as
// it fails (hasync.ErrCannotCross).
func (r *Recoverer) byPairs(name string) bool {
	m, ok := r.eng.Member(name)
	if !ok || m.Slot() == nil {
		return false
	}
	t := m.Slot().Token()
	return tokenquirk.CarriesKeysByPairOnly(t.Manufacturer, t.Model)
}

// capableFirst orders members so that those that can wrap keys come
// first: a plan copies from the first holder it lists.
func capableFirst(members []hasync.PlanMember, lacking map[string]bool) []hasync.PlanMember {
	out := make([]hasync.PlanMember, 0, len(members))
	for _, m := range members {
		if !lacking[m.Name] {
			out = append(out, m)
		}
	}
	for _, m := range members {
		if lacking[m.Name] {
			out = append(out, m)
		}
	}
	return out
}

// splitUnreplicable takes out of p the copies of wrapped objects (private
// and secret keys) to or from a member in lacking, and those a copy found
// cannot cross to their member (crossKey in cannotCross), with the public
// halves of the private keys among them, and returns them.
func splitUnreplicable(p *hasync.Plan, lacking, cannotCross map[string]bool) []hasync.Action {
	if len(lacking) == 0 && len(cannotCross) == 0 {
		return nil
	}
	var keep, out []hasync.Action
	halfOut := map[string]bool{} // private halves left out: their public halves stay out too
	for _, a := range p.Actions {
		c := a.Identity.Class
		wrapped := c == pkcs11.CKO_PRIVATE_KEY || c == pkcs11.CKO_SECRET_KEY
		if a.Kind == hasync.Copy && wrapped && (lacking[a.Member] || lacking[a.Source] || cannotCross[crossKey(a)]) {
			out = append(out, a)
			if c == pkcs11.CKO_PRIVATE_KEY {
				halfOut[a.PairKey()] = true
			}
			continue
		}
		keep = append(keep, a)
	}
	// A public half is never copied without its private half: a member
	// that seems to hold the key would be sent work on it.
	kept := keep[:0]
	for _, a := range keep {
		if a.Kind == hasync.Copy && a.Identity.Class == pkcs11.CKO_PUBLIC_KEY && halfOut[a.PairKey()] {
			out = append(out, a)
			continue
		}
		kept = append(kept, a)
	}
	keep = kept
	p.Actions = keep
	return out
}

// crossKey names a copy for the keys that cannot cross to its member.
func crossKey(a hasync.Action) string { return a.Member + "\x00" + a.Identity.String() }

// peers returns the serving members other than name, with their slots, in
// configured order: the members a recovering one catches up with.
func (r *Recoverer) peers(name string) []hasync.PlanMember {
	var out []hasync.PlanMember
	for _, snap := range r.eng.Members() {
		if snap.Name == name || !snap.State.Serving() {
			continue
		}
		m, ok := r.eng.Member(snap.Name)
		if !ok {
			continue
		}
		if s := m.Slot(); s != nil && m.State().Serving() {
			out = append(out, hasync.PlanMember{Name: snap.Name, Slot: s})
		}
	}
	return out
}

// finish records the outcome of an attempt, wakes those who joined it and
// emits the outcome events. It reports whether the episode gen is over.
func (r *Recoverer) finish(m *memberRec, fl *flight, gen uint64, manual bool, out outcome) bool {
	var events []Event
	r.mu.Lock()
	stop := out.stop
	if out.counted {
		now := r.clock.Now()
		m.lastErr = out.err
		var ce *ConflictError
		if errors.As(out.err, &ce) {
			m.conflicts = ce.Conflicts
		} else {
			m.conflicts = nil
		}
		if out.err == nil {
			m.lastOK = now
			m.gaveUp = false
			m.episode = false
			m.next = time.Time{}
			m.gen++ // a loop still waiting for its timer exits
			if mem, ok := r.eng.Member(m.name); ok && mem.State() == member.Failed && r.retries != 0 && !r.closed {
				r.startEpisodeLocked(m) // it failed again before this success was recorded: its MemberFailed found the episode still running
			}
			events = append(events, Event{Kind: Recovered, Time: now, Member: m.name, Attempt: out.res.Attempt,
				Manual: manual, Copied: out.res.CatchUp.Copied, Deleted: out.res.CatchUp.Deleted, Duration: out.res.Duration,
				Unreadable: out.res.CatchUp.Unreadable})
		} else {
			left := m.attemptsLeft
			if manual && !m.episode {
				left = 0
			}
			events = append(events, Event{Kind: AttemptFailed, Time: now, Member: m.name, Attempt: out.res.Attempt,
				AttemptsLeft: left, Manual: manual, Err: out.err, Duration: out.res.Duration})
			if !manual && m.gen == gen && m.episode && m.attemptsLeft == 0 {
				m.gaveUp = true
				m.episode = false
				m.next = time.Time{}
				stop = true
				events = append(events, Event{Kind: GaveUp, Time: now, Member: m.name, Attempt: m.attempts, Err: out.err})
			}
		}
	}
	if stop && !manual && m.gen == gen {
		m.episode = false
		m.next = time.Time{}
	}
	m.flight = nil
	fl.out = out
	close(fl.done)
	r.mu.Unlock()
	for _, e := range events {
		r.emit(e)
	}
	return stop
}

// planCatchUp is the default catch-up: plan and apply, again, until
// nothing is left for the member (at most maxPasses rounds; a member
// still behind then is finished by the final pass under the write
// barrier).
func (r *Recoverer) planCatchUp(ctx context.Context, self hasync.PlanMember, peers []hasync.PlanMember) (CatchUp, error) {
	return r.planPasses(ctx, self, peers, maxPasses, false)
}

// loadTombstones reads the tombstones for a plan (nil without a source).
func (r *Recoverer) loadTombstones(ctx context.Context) (hasync.Tombstones, error) {
	if r.opts.Tombstones == nil {
		return nil, nil
	}
	set, err := r.opts.Tombstones.Snapshot(ctx)
	if err != nil {
		// Without the tombstones a destroyed key could come back.
		return nil, err
	}
	return set, nil
}

// planPasses runs up to max plan/apply rounds for self. With final (the
// write barrier is held, nothing changes through the group) one clean
// apply is enough.
func (r *Recoverer) planPasses(ctx context.Context, self hasync.PlanMember, peers []hasync.PlanMember, max int, final bool) (CatchUp, error) {
	var cu CatchUp
	lacking := r.lacking()
	cannotCross := map[string]bool{}
	members := capableFirst(append([]hasync.PlanMember{self}, peers...), lacking)
	opts := hasync.PlanOptions{
		SkipUnreachable: true,
		// Read after the listing, and again after the copies: a destroy
		// through the group during the listing (in this process or
		// another) has its object missing from the listing, and its
		// tombstone, read before, would be missing too, so the object
		// would be copied back from the member that was away.
		LoadTombstones: r.loadTombstones,
		// What a creation that died with it left there is destroyed,
		// not spread (tombstone.Tombstone.Intent).
		Returning: self.Name,
	}
	for cu.Passes < max {
		cu.Passes++
		// The mark before the listing: a destroy or create through this
		// process's group that finishes after it moves it, and then
		// another pass runs (under the write barrier at the latest).
		cu.mark = r.eng.WriteMark()
		plan, err := hasync.MakePlan(ctx, members, nil, opts)
		if err != nil {
			return cu, fmt.Errorf("catch up: %w", err)
		}
		if err := plan.Skipped[self.Name]; err != nil {
			return cu, fmt.Errorf("catch up: list objects: %w", err)
		}
		if len(plan.InFlight) > 0 {
			return cu, fmt.Errorf("catch up: %w: %v", ErrCreationInFlight, plan.InFlight)
		}
		cu.Skipped = plan.Skipped
		cu.Unreadable = plan.Unreadable
		r.observeHalfMade(plan, members)
		if cu.Passes == 1 {
			r.noteChecked(plan)
		}
		if cs := plan.ConflictsOf(self.Name); len(cs) > 0 {
			return cu, &ConflictError{Member: self.Name, Conflicts: cs}
		}
		cu.OtherConflicts = plan.Conflicts
		cu.Unreplicable = splitUnreplicable(plan, lacking, cannotCross)
		left := &hasync.Plan{Members: plan.Members, Conflicts: plan.Conflicts, Unreadable: plan.Unreadable, Actions: cu.Unreplicable}
		mine := plan.For(self.Name)
		if len(plan.Actions) == 0 || (cu.Passes > 1 && len(mine) == 0) {
			cu.converged = true
			r.noteChecked(left)
			return cu, nil
		}
		res, _ := r.repl.Apply(ctx, plan)
		cu.PeerErrors = cu.PeerErrors[:0]
		for _, a := range res.Done {
			if a.Kind == hasync.Copy {
				cu.Copied++
			} else {
				cu.Deleted++
			}
		}
		cu.Vanished += len(res.Vanished)
		var failed []error
		crossed := false
		for i, f := range res.Failed {
			if f.Action.Member == self.Name && errors.Is(f.Err, hasync.ErrCannotCross) {
				// The key stays where it is: left out from the next pass on,
				// and reported (CatchUp.Unreplicable).
				cannotCross[crossKey(f.Action)] = true
				crossed = true
				continue
			}
			if f.Action.Member == self.Name {
				failed = append(failed, &res.Failed[i])
			} else {
				cu.PeerErrors = append(cu.PeerErrors, f)
			}
		}
		if len(failed) > 0 {
			return cu, fmt.Errorf("catch up: %w", errors.Join(failed...))
		}
		if crossed {
			continue
		}
		if len(res.Vanished) > 0 && !final {
			// Objects were destroyed while they were copied, perhaps by
			// another process whose tombstones are still to come: look
			// again.
			continue
		}
		if len(mine) == 0 {
			cu.converged = true // it only gave
			r.noteChecked(left)
			return cu, nil
		}
		// Another host catching it up at the same moment moves no mark
		// here and may leave a second copy that both hosts' re-checks
		// missed: the member itself is listed again (not its peers, which
		// serve applications: on SoftHSM a read can spoil an object being
		// written), and a copy held twice means one more pass.
		twice, err := holdsTwice(ctx, self)
		if err != nil {
			return cu, fmt.Errorf("catch up: list objects again: %w", err)
		}
		if !twice && (final || r.eng.WriteMark() == cu.mark) {
			// What it had to take is applied and nothing changed through
			// the group since the listing; under the barrier nothing can
			// have.
			cu.converged = true
			r.noteChecked(left)
			return cu, nil
		}
	}
	if final {
		return cu, fmt.Errorf("catch up: objects were still changing after %d rounds", max)
	}
	return cu, nil // not converged: the final pass under the barrier finishes it
}

// holdsTwice reports whether the member holds some object (identity and
// fingerprint) more than once.
func holdsTwice(ctx context.Context, m hasync.PlanMember) (bool, error) {
	l, err := hasync.Scan(ctx, m.Slot)
	if err != nil {
		return false, err
	}
	seen := map[string]bool{}
	for _, o := range l.Objects {
		if !o.Token || o.Fingerprint == nil {
			continue
		}
		k := o.Identity.Key() + "\x00" + string(o.Fingerprint)
		if seen[k] {
			return true, nil
		}
		seen[k] = true
	}
	return false, nil
}

// lockMember takes the host-wide lock of member name. Without wait it
// fails at once with ErrInProgress when another process holds it.
func (r *Recoverer) lockMember(ctx context.Context, name string, wait bool) (func(), error) {
	if r.opts.StateDir == "" {
		return func() {}, nil
	}
	if err := checkName("member name", name); err != nil {
		return nil, err
	}
	dir := filepath.Join(r.opts.StateDir, r.eng.Serial())
	if err := os.MkdirAll(dir, r.opts.LockPerm|(r.opts.LockPerm&0o444)>>2); err != nil {
		return nil, fmt.Errorf("recover member %s: %w", name, err)
	}
	path := filepath.Join(dir, name+".recover.lock")
	var f *os.File
	var err error
	if wait {
		f, err = filelock.Lock(ctx, path, r.opts.LockPerm)
	} else {
		f, err = filelock.TryLock(path, r.opts.LockPerm)
	}
	if err != nil {
		if errors.Is(err, filelock.ErrBusy) || ctx.Err() != nil {
			holder := "another process"
			if b, rerr := os.ReadFile(path); rerr == nil && len(strings.TrimSpace(string(b))) > 0 {
				holder = "process " + strings.TrimSpace(string(b))
			}
			if errors.Is(err, filelock.ErrBusy) {
				return nil, fmt.Errorf("recover member %s: %w in %s", name, ErrInProgress, holder)
			}
			return nil, fmt.Errorf("recover member %s: %w in %s: %w", name, ErrInProgress, holder, err)
		}
		return nil, fmt.Errorf("recover member %s: %w", name, err)
	}
	// Say who holds it, for the message of whoever waits.
	if f.Truncate(0) == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() {
		f.Truncate(0)
		f.Close()
	}, nil
}

// Status returns the recovery state of member name.
func (r *Recoverer) Status(name string) Status {
	mk, blocked := r.blocks.Get(name)
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.members[name]
	if m == nil {
		return Status{Member: name, AttemptsLeft: r.retries, PINBlocked: blocked, PINBlock: mk}
	}
	return Status{
		Member:        name,
		InProgress:    m.flight != nil,
		Auto:          m.episode,
		GaveUp:        m.gaveUp,
		Attempts:      m.attempts,
		AttemptsLeft:  m.attemptsLeft,
		LastAttempt:   m.lastAttempt,
		LastError:     m.lastErr,
		LastRecovered: m.lastOK,
		PINBlocked:    blocked,
		PINBlock:      mk,
		NextAttempt:   m.next,
		Conflicts:     m.conflicts,
		CheckedAt:     m.checked,
	}
}

// Reconfigure changes the interval and the retry count. Scheduled attempts
// are re-timed from now; members failed now (including those whose
// attempts ran out) get a fresh budget of retries, or with 0 no more
// automatic attempts; members in service show the new budget.
func (r *Recoverer) Reconfigure(interval time.Duration, retries int) error {
	if err := checkPolicy(interval, retries); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.interval, r.retries = interval, retries
	for _, m := range r.members {
		switch {
		case m.episode && retries == 0:
			m.episode = false
			m.next = time.Time{}
			m.gen++
			m.attemptsLeft = 0
		case m.episode:
			m.attempts = 0
			m.attemptsLeft = retries
			select {
			case m.kick <- struct{}{}:
			default:
			}
		case m.gaveUp && retries != 0 && !r.closed:
			r.startEpisodeLocked(m)
		case !m.gaveUp:
			// In service: the budget its next failure starts with.
			m.attemptsLeft = retries
		}
	}
	return nil
}

// Forget drops member name (it left the group): its automatic attempts
// stop. An attempt running now runs to its end.
func (r *Recoverer) Forget(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m := r.members[name]; m != nil {
		m.episode = false
		m.gen++
		delete(r.members, name)
	}
}

// Close stops the automatic attempts, cancels the attempts running (which
// fail the member again) and waits for them to end.
func (r *Recoverer) Close() error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.cancel()
	r.wg.Wait()
	return nil
}
