// Package member is one member of an HA group: its physical slot, its state
// machine (active, standby, failed, recovering, removed), and the live
// figures the scheduler reads on every call (operations in flight, latency
// average, consecutive health failures) plus counters for status and
// metrics.
//
// Every method is safe for concurrent use. The figures read and written on
// the hot path are plain atomics; no call takes a lock.
package member

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hagroup/hagroup/pkg/slot"
)

// ErrIllegalTransition is wrapped by the error Transition returns when the
// move is not allowed from the member's current state.
var ErrIllegalTransition = errors.New("illegal member state transition")

// Config describes a member as configured.
type Config struct {
	// Name is the member's stable name, used in events, errors and metrics.
	Name string
	// Index is the member's place in the group's tables (0 to 63), fixed
	// while it is a member; a member added later may take the index of
	// one removed. The group's configured order (which decides the
	// primary) is kept by the group.
	Index int
	// Standby reports whether the member is configured as a standby.
	Standby bool
	// FailureThreshold is how many consecutive health failures fail the
	// member; values below 1 mean 1.
	FailureThreshold int
	// Epochs, when set, is the source of the member's epochs, shared by
	// every member of a group: an epoch then names one member's handles
	// uniquely, so a member that takes over the index of a removed one can
	// never match a handle cached for its predecessor. Nil: the member
	// counts its own epochs from 0.
	Epochs *atomic.Uint64
}

// Transition is the event emitted for every state change.
type Transition struct {
	Member string
	From   State
	To     State
	// Err is the reason for a move to Failed (nil otherwise, or when the
	// caller gave none).
	Err  error
	Time time.Time
}

// Outcome is what End concluded about one call.
type Outcome struct {
	// Class is the error class of the call (slot.ClassNone on success).
	Class slot.Class
	// Fail reports whether the call should fail the member: a timeout, or
	// the failure threshold reached by consecutive health failures.
	Fail bool
}

type errRecord struct {
	err  error
	time time.Time
}

// latencyShift sets the EWMA weight of a new sample to 1/8.
const latencyShift = 3

// Member is one member of a group. Create it with New.
type Member struct {
	cfg    Config
	notify func(Transition)

	state   atomic.Int32
	since   atomic.Int64 // unix nanoseconds of the last transition
	slot    atomic.Pointer[slot.Slot]
	epoch   atomic.Uint64
	standby atomic.Bool // configured as a standby (SetConfiguredStandby)
	missing atomic.Pointer[[]string]

	inFlight atomic.Int64
	pinned   atomic.Int64
	draining atomic.Bool
	drained  chan struct{}               // signalled (never closed) when the last call ends while draining
	latency  atomic.Int64                // EWMA of successful call latency, nanoseconds
	sampled  atomic.Int64                // unix nanoseconds of the last latency sample
	recent   [recentSamples]atomic.Int64 // the last answered calls' latencies, nanoseconds (P95)
	answered atomic.Uint64               // samples ever put in recent
	consec   atomic.Int32

	ops           atomic.Uint64
	errs          atomic.Uint64
	requestErrors atomic.Uint64
	failovers     atomic.Uint64
	replications  atomic.Uint64
	hedged        atomic.Uint64

	lastErr atomic.Pointer[errRecord]
}

// New returns a member in the initial state st. s may be nil only when st
// is Failed (the member's token could not be opened; cause says why).
// notify, if not nil, is called synchronously after every transition and
// must not block.
func New(cfg Config, s *slot.Slot, st State, cause error, notify func(Transition)) (*Member, error) {
	if cfg.Name == "" {
		return nil, errors.New("member: empty name")
	}
	if st < Active || st > Removed {
		return nil, fmt.Errorf("member %s: invalid initial state %v", cfg.Name, st)
	}
	if s == nil && st != Failed && st != Removed {
		return nil, fmt.Errorf("member %s: no slot for initial state %v", cfg.Name, st)
	}
	if cfg.FailureThreshold < 1 {
		cfg.FailureThreshold = 1
	}
	m := &Member{cfg: cfg, notify: notify, drained: make(chan struct{}, 1)}
	m.standby.Store(cfg.Standby)
	if cfg.Epochs != nil {
		m.epoch.Store(cfg.Epochs.Add(1))
	}
	m.state.Store(int32(st))
	m.since.Store(time.Now().UnixNano())
	if s != nil {
		m.slot.Store(s)
	}
	if st == Failed {
		m.countFailure(cause)
	}
	if cause != nil {
		m.lastErr.Store(&errRecord{err: cause, time: time.Now()})
	}
	return m, nil
}

// Name returns the member's configured name.
func (m *Member) Name() string { return m.cfg.Name }

// Index returns the member's place in the group's tables (see Config.Index).
func (m *Member) Index() int { return m.cfg.Index }

// ConfiguredStandby reports whether the member is configured as a standby
// (it may be active now, promoted because no active member was left).
func (m *Member) ConfiguredStandby() bool { return m.standby.Load() }

// SetConfiguredStandby changes whether the member is configured as a
// standby. It does not change the state: the group decides whether the
// member is demoted or promoted.
func (m *Member) SetConfiguredStandby(standby bool) { m.standby.Store(standby) }

// SetMissingMechanisms records the mechanisms the group needs that the
// member's token does not offer (names such as "CKM_AES_KEY_WRAP_PAD"),
// and reports whether the set changed.
func (m *Member) SetMissingMechanisms(names []string) bool {
	names = append([]string(nil), names...)
	old := m.missing.Swap(&names)
	if old == nil {
		return len(names) > 0
	}
	if len(*old) != len(names) {
		return true
	}
	for i := range names {
		if (*old)[i] != names[i] {
			return true
		}
	}
	return false
}

// MissingMechanisms returns the mechanisms recorded by
// SetMissingMechanisms (nil when none).
func (m *Member) MissingMechanisms() []string {
	if p := m.missing.Load(); p != nil && len(*p) > 0 {
		return append([]string(nil), (*p)...)
	}
	return nil
}

// Lacks reports whether mechanism name was recorded as missing.
func (m *Member) Lacks(name string) bool {
	if p := m.missing.Load(); p != nil {
		for _, n := range *p {
			if n == name {
				return true
			}
		}
	}
	return false
}

// State returns the current state.
func (m *Member) State() State { return State(m.state.Load()) }

// Since returns when the member entered its current state.
func (m *Member) Since() time.Time { return time.Unix(0, m.since.Load()) }

// Slot returns the member's physical slot; nil while it has never been
// opened.
func (m *Member) Slot() *slot.Slot { return m.slot.Load() }

// SetSlot installs a (re-)opened slot and returns the previous one, which
// the caller closes if it is a different slot.
func (m *Member) SetSlot(s *slot.Slot) *slot.Slot { return m.slot.Swap(s) }

// Epoch is a number that changes whenever physical object handles the group
// cached for this member may have become stale (re-login, re-open,
// recovery). Cached handles carry the epoch they were found in.
func (m *Member) Epoch() uint64 { return m.epoch.Load() }

// BumpEpoch invalidates every physical handle cached for this member and
// returns the new epoch.
func (m *Member) BumpEpoch() uint64 {
	if m.cfg.Epochs == nil {
		return m.epoch.Add(1)
	}
	n := m.cfg.Epochs.Add(1) // larger than any epoch the member had
	m.epoch.Store(n)
	return n
}

// Transition moves the member to state to, emitting one Transition event.
// reason is recorded as the last error when to is Failed. It returns the
// previous state, or an error wrapping ErrIllegalTransition when the move
// is not legal from the current state (the state is then unchanged).
func (m *Member) Transition(to State, reason error) (State, error) {
	for {
		from := State(m.state.Load())
		if !CanTransition(from, to) {
			return from, fmt.Errorf("member %s: %v → %v: %w", m.cfg.Name, from, to, ErrIllegalTransition)
		}
		if m.state.CompareAndSwap(int32(from), int32(to)) {
			m.transitioned(from, to, reason)
			return from, nil
		}
	}
}

// CompareAndTransition moves the member from state from to state to only
// if it is in from now and the move is legal. It reports whether it moved
// (and so emitted the event); exactly one of several racing callers wins.
func (m *Member) CompareAndTransition(from, to State, reason error) bool {
	if !CanTransition(from, to) {
		return false
	}
	if !m.state.CompareAndSwap(int32(from), int32(to)) {
		return false
	}
	m.transitioned(from, to, reason)
	return true
}

// Fail moves an active, standby or recovering member to Failed and reports
// whether this call did so (false: it was already failed or removed, and no
// event was emitted).
func (m *Member) Fail(reason error) bool {
	for {
		from := State(m.state.Load())
		if !CanTransition(from, Failed) {
			return false
		}
		if m.state.CompareAndSwap(int32(from), int32(Failed)) {
			m.transitioned(from, Failed, reason)
			return true
		}
	}
}

// countFailure counts the health error a member is failed for, by
// whatever transition to Failed (its open, a call, a recovery attempt's
// re-open), unless one was counted since it last served: some paths find
// the error outside a call's accounting, and a member never leaves
// rotation unwell with no error counted. Only a health error the member
// answered counts (a *slot.Error of the health class, or a timeout); a
// failure for another reason (behind, a PIN refused before) counts none.
func (m *Member) countFailure(reason error) {
	var se *slot.Error
	answered := errors.As(reason, &se) || errors.Is(reason, slot.ErrTimeout)
	if answered && slot.ClassOf(reason) == slot.ClassHealth && m.consec.Load() == 0 {
		m.errs.Add(1)
		m.consec.Add(1)
	}
}

func (m *Member) transitioned(from, to State, reason error) {
	if to == Failed {
		m.countFailure(reason)
	}
	now := time.Now()
	m.since.Store(now.UnixNano())
	if to == Failed && reason != nil {
		m.lastErr.Store(&errRecord{err: reason, time: now})
	}
	if to == Active || to == Standby {
		if from == Recovering {
			m.consec.Store(0)
		}
	}
	if m.notify != nil {
		m.notify(Transition{Member: m.cfg.Name, From: from, To: to, Err: reason, Time: now})
	}
}

// Begin marks one call as in flight on the member and returns its start
// time for End.
func (m *Member) Begin() time.Time {
	m.inFlight.Add(1)
	return time.Now()
}

// callEnded wakes Drain when the last call or pinned operation ended.
func (m *Member) callEnded(left int64) {
	if left == 0 && m.draining.Load() {
		select {
		case m.drained <- struct{}{}:
		default:
		}
	}
}

// Pin counts one multi-part operation pinned to the member; Unpin ends it.
// Drain waits for pinned operations as for calls in flight.
func (m *Member) Pin() { m.pinned.Add(1) }

// Unpin ends an operation counted by Pin.
func (m *Member) Unpin() { m.callEnded(m.pinned.Add(-1)) }

// Drain marks the member as leaving and waits until no call is in flight
// on it and no multi-part operation is pinned to it, or ctx ends (then it
// returns ctx's error; the work still running is not interrupted). The
// caller has stopped giving the member new work before.
func (m *Member) Drain(ctx context.Context) error {
	m.draining.Store(true)
	for m.inFlight.Load() != 0 || m.pinned.Load() != 0 {
		select {
		case <-m.drained:
		case <-ctx.Done():
			return fmt.Errorf("member %s: draining: %d call(s) in flight, %d operation(s) pinned: %w",
				m.cfg.Name, m.inFlight.Load(), m.pinned.Load(), context.Cause(ctx))
		}
	}
	return nil
}

// End records the result of a call started with Begin: it counts the
// operation, updates the latency average, and charges health failures.
// Request and login errors (slot.ClassRequest, slot.ClassLogin) are never
// charged: they prove the member answers, so they also end a run of
// consecutive health failures. A timeout (slot.ErrTimeout) fails at once;
// other health errors fail when FailureThreshold of them come in a row.
// End does not change the state: the caller fails the member when
// Outcome.Fail is set, so that it can say why in the event.
func (m *Member) End(start time.Time, err error) Outcome {
	m.callEnded(m.inFlight.Add(-1))
	class := slot.ClassOf(err)
	switch class {
	case slot.ClassNone:
		m.ops.Add(1)
		m.consec.Store(0)
		m.observeSince(start)
		return Outcome{Class: class}
	case slot.ClassRequest, slot.ClassLogin:
		m.ops.Add(1)
		m.requestErrors.Add(1)
		m.consec.Store(0)
		m.observeSince(start)
		return Outcome{Class: class}
	default:
		return Outcome{Class: slot.ClassHealth, Fail: m.ChargeHealth(err)}
	}
}

// ChargeHealth counts one health failure outside Begin/End (for example a
// failed session open) and reports whether the member should now be failed.
func (m *Member) ChargeHealth(err error) bool {
	m.errs.Add(1)
	m.lastErr.Store(&errRecord{err: err, time: time.Now()})
	n := m.consec.Add(1)
	return errors.Is(err, slot.ErrTimeout) || int(n) >= m.cfg.FailureThreshold
}

// observeSince counts a call that started at start and ended now: one
// clock read for the sample and its time (the hot path).
func (m *Member) observeSince(start time.Time) {
	now := time.Now()
	m.observeAt(now.Sub(start), now)
}

// observeAt counts a latency sample d taken at now. A sample of a call
// that began more than LatencyHalfLife after the last sample replaces the
// average instead of moving it by an eighth: the scheduler has been
// weighing the member by the faded average since, and one bad sample
// (an early call under load, a slow moment) would otherwise be
// reinstated at every pick and starve a fast member for good.
func (m *Member) observeAt(d time.Duration, now time.Time) {
	if d <= 0 {
		d = 1
	}
	sample := int64(d)
	m.recent[(m.answered.Add(1)-1)%recentSamples].Store(sample)
	began := now.UnixNano() - sample
	for {
		old := m.latency.Load()
		next := sample
		if old != 0 && began-m.sampled.Load() <= int64(LatencyHalfLife) {
			next = old + (sample-old)>>latencyShift
			if next <= 0 {
				next = 1
			}
		}
		if m.latency.CompareAndSwap(old, next) {
			m.sampled.Store(now.UnixNano())
			return
		}
	}
}

// LatencyHalfLife is how fast the latency average of a member that gets no
// work fades: it halves for every LatencyHalfLife without a sample. A
// member that was slow once (or is slow) therefore gets an occasional call
// that measures it again, instead of being starved by one bad sample.
const LatencyHalfLife = 50 * time.Millisecond

// DecayedLatency returns Latency faded by the time since the last sample
// (see LatencyHalfLife), as the scheduler weighs it. now is UnixNano.
// It does not fade while a call is in flight: that call is the new
// measurement, and a member slower than LatencyHalfLife would otherwise
// look faster the longer its calls take, and draw more of them.
func (m *Member) DecayedLatency(now int64) time.Duration {
	lat := m.latency.Load()
	if m.inFlight.Load() > 0 {
		return time.Duration(lat)
	}
	if age := now - m.sampled.Load(); age > int64(LatencyHalfLife) {
		lat >>= min(age/int64(LatencyHalfLife), 62)
	}
	return time.Duration(lat)
}

// recentSamples is how many answered calls P95 looks at: a few seconds of
// a member's traffic, so that it follows a member that slows down.
const recentSamples = 32

// minP95Samples is how many answers P95 wants before it says anything.
const minP95Samples = 16

// P95 returns the 95th percentile latency of the member's last answered
// calls (up to recentSamples), 0 before minP95Samples of them.
func (m *Member) P95() time.Duration {
	n := min(m.answered.Load(), recentSamples)
	if n < minP95Samples {
		return 0
	}
	// The p95 of n <= 32 samples is the largest (n < 20) or the second
	// largest: a scan, not a sort, on the hot path.
	var first, second int64
	for i := range n {
		v := m.recent[i].Load()
		switch {
		case v > first:
			first, second = v, first
		case v > second:
			second = v
		}
	}
	if n < 20 {
		return time.Duration(first)
	}
	return time.Duration(second)
}

// Measured reports whether a call of the member has ended yet, so that its
// latency is a measurement.
func (m *Member) Measured() bool { return m.latency.Load() != 0 }

// InFlight returns the number of calls in flight on the member.
func (m *Member) InFlight() int64 { return m.inFlight.Load() }

// Latency returns the exponentially weighted average latency of the
// member's recent answered calls (0 until the first one).
func (m *Member) Latency() time.Duration { return time.Duration(m.latency.Load()) }

// ConsecutiveFailures returns the current run of health failures.
func (m *Member) ConsecutiveFailures() int { return int(m.consec.Load()) }

// AddFailover counts one operation moved away from this member.
func (m *Member) AddFailover() { m.failovers.Add(1) }

// AddHedge counts one request of this member's that was also sent to
// another member because this one was slow to answer (a hedge).
func (m *Member) AddHedge() { m.hedged.Add(1) }

// AddReplication counts one object replicated to this member.
func (m *Member) AddReplication() { m.replications.Add(1) }

// LastError returns the last health error recorded and when (nil, zero
// time when there is none).
func (m *Member) LastError() (error, time.Time) {
	r := m.lastErr.Load()
	if r == nil {
		return nil, time.Time{}
	}
	return r.err, r.time
}

// Snapshot is a point-in-time copy of a member's state and figures, for
// status output, metrics and the agent's wire types.
type Snapshot struct {
	Name                string        `json:"name"`
	Index               int           `json:"index"`
	State               State         `json:"state"`
	ConfiguredStandby   bool          `json:"configured_standby"`
	Since               time.Time     `json:"since"`
	InFlight            int64         `json:"in_flight"`
	Latency             time.Duration `json:"latency_ns"`
	ConsecutiveFailures int           `json:"consecutive_failures"`
	Ops                 uint64        `json:"ops"`
	Errors              uint64        `json:"errors"`
	RequestErrors       uint64        `json:"request_errors"`
	Failovers           uint64        `json:"failovers"`
	Replications        uint64        `json:"replications"`
	// Hedges counts this member's requests also sent to another member
	// because it was slow to answer.
	Hedges        uint64    `json:"hedges,omitempty"`
	LastError     string    `json:"last_error,omitempty"`
	LastErrorTime time.Time `json:"last_error_time,omitzero"`
	Epoch         uint64    `json:"epoch"`
	// MissingMechanisms the group needs and the member lacks (see
	// SetMissingMechanisms).
	MissingMechanisms []string `json:"missing_mechanisms,omitempty"`
}

// Snapshot returns the member's current figures. Fields are read one by
// one, so a snapshot taken under load is consistent per field, not as a
// whole.
func (m *Member) Snapshot() Snapshot {
	s := Snapshot{
		Name:                m.cfg.Name,
		Index:               m.cfg.Index,
		State:               m.State(),
		ConfiguredStandby:   m.ConfiguredStandby(),
		Since:               m.Since(),
		InFlight:            m.InFlight(),
		Latency:             m.Latency(),
		ConsecutiveFailures: m.ConsecutiveFailures(),
		Ops:                 m.ops.Load(),
		Errors:              m.errs.Load(),
		RequestErrors:       m.requestErrors.Load(),
		Failovers:           m.failovers.Load(),
		Replications:        m.replications.Load(),
		Hedges:              m.hedged.Load(),
		Epoch:               m.Epoch(),
		MissingMechanisms:   m.MissingMechanisms(),
	}
	if err, t := m.LastError(); err != nil {
		s.LastError = err.Error()
		s.LastErrorTime = t
	}
	return s
}
