// Package group is the HA engine: several member tokens that hold the same
// keys, presented as one virtual slot.
//
// A Group spreads single-part work over its active members (least-busy,
// round-robin or primary-backup), retries an operation that fails on a
// member for a health reason on the next member so that the caller sees
// success while one member lives, pins multi-part operations to one member,
// keeps standby members idle until no active member is left, and creates
// keys on the primary (the first active member in configured order) and
// replicates them to every other member before returning.
//
// The API has the shape of PKCS#11 so that a C module can sit on it:
// virtual session and object handles are uints, stable for the life of the
// process; templates are []*pkcs11.Attribute; every error carries a CKR
// code (CodeOf). Go programs use the same engine, and Signer for a
// crypto.Signer that survives failovers.
//
// Rules the engine keeps, beyond the scheduling above:
//
//   - Health errors (device errors, lost sessions, a missing token) and
//     calls past command_timeout are charged to the member: it is failed
//     after failure_threshold of them in a row, or at once on a timeout.
//     CKR_GENERAL_ERROR and CKR_FUNCTION_FAILED are ambiguous (tokens also
//     return them for requests they dislike): a member is failed for one
//     only once another member has served the same request; when every
//     member says the same, the request is at fault and nobody is failed.
//   - Request errors are returned as they are, never charged; a wrong PIN
//     is tried on one member only.
//   - Multi-part operations (*Init, *Update, *Final) touch no member until
//     the first Update, are placed with failover up to that point, and are
//     pinned afterwards: if the member fails, the operation ends with
//     ErrMemberLost (CKR_DEVICE_ERROR). A PKCS#11 module answering a
//     length query (NULL output buffer) must keep the result of the one
//     call it makes: single-part calls end the operation.
//   - Object identity is CKA_CLASS + CKA_KEY_TYPE + CKA_ID + CKA_LABEL and
//     must be unique among token objects made through the group; two keys
//     under one identity (found by fingerprint) are reported
//     (ConflictFound) and never used.
//   - A key the application makes with CKA_EXTRACTABLE=false is made
//     physically extractable (the group must move it between members under
//     the domain key) with CKA_WRAP_WITH_TRUSTED=true when the domain key
//     is trusted; on the virtual slot a private or secret key with
//     CKA_WRAP_WITH_TRUSTED=true reads CKA_EXTRACTABLE=false and cannot be
//     wrapped (CKR_KEY_UNEXTRACTABLE), in this process and in any other.
//     With an untrusted domain key the promise holds in the process that
//     made the key only: install a trusted domain key.
//   - The application's PIN is kept, while logged in, only if a member
//     without its own PIN source needs it for recovery; it is zeroed on
//     Logout and Close.
//
// The engine never logs: it reports what happens through Options.Events.
// Every exported method is safe for concurrent use.
package group

import (
	"context"
	"errors"
	"fmt"
	gosync "sync"
	"sync/atomic"
	"time"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	hasync "github.com/hagroup/hagroup/pkg/sync"
	"github.com/miekg/pkcs11"
)

// Options are the parts of a group that do not come from the
// configuration file.
type Options struct {
	// Events receives every event; nil drops them.
	Events EventSink
	// Interceptor is passed into every member's slot.Spec (fault injection
	// in tests); nil in production.
	Interceptor slot.Interceptor
	// Tombstones records destroys; nil keeps them in a MemoryTombstones.
	Tombstones Tombstones
	// MaxSessions caps each member's session pool (0: pkg/slot's default).
	MaxSessions int
}

// Group is one HA group. Create it with Open; it is safe for concurrent
// use.
type Group struct {
	label, serial string
	settings      config.Settings
	policy        policy
	cfgMembers    []config.Member
	specs         []slot.Spec
	members       []*member.Member
	byName        map[string]*member.Member

	events     EventSink
	tombstones Tombstones
	rep        *hasync.Replicator

	rr   atomic.Uint64 // rotation for round-robin and least-busy ties
	gate gate

	loginMu  gosync.Mutex
	userType atomic.Int64 // -1: logged out; otherwise CKU_USER / CKU_SO
	appPIN   secret.PIN   // guarded by loginMu; zeroed on logout and close

	recoverMu  gosync.Mutex
	recovering map[string]bool // guarded by recoverMu

	sessMu   gosync.Mutex
	sessions map[SessionHandle]*Session
	nextSess atomic.Uint64

	objs objectTable

	closeOnce gosync.Once
}

// Open builds the group g with settings s. Every member's token is opened
// in parallel; a member whose token cannot be opened starts as failed (its
// error is kept in its status and a MemberFailed event is emitted), so a
// group opens even with members down, and recovery (ActivateMember) brings
// them in later. Open fails only on an unusable configuration or when ctx
// ends. Members are not logged in: call Login.
func Open(ctx context.Context, g config.Group, s config.Settings, opts Options) (*Group, error) {
	if g.Label == "" {
		return nil, errors.New("group: empty label")
	}
	if len(g.Members) == 0 {
		return nil, fmt.Errorf("group %s: no members", g.Label)
	}
	if len(g.Members) > 64 {
		return nil, fmt.Errorf("group %s: %d members, at most 64", g.Label, len(g.Members))
	}
	pol, err := parsePolicy(s.Policy)
	if err != nil {
		return nil, fmt.Errorf("group %s: %w", g.Label, err)
	}
	gr := &Group{
		label:      g.Label,
		serial:     g.Serial,
		settings:   s,
		policy:     pol,
		cfgMembers: append([]config.Member(nil), g.Members...),
		byName:     make(map[string]*member.Member),
		events:     opts.Events,
		tombstones: opts.Tombstones,
		rep:        &hasync.Replicator{GroupSerial: g.Serial},
		sessions:   make(map[SessionHandle]*Session),
		recovering: make(map[string]bool),
	}
	gr.userType.Store(-1)
	gr.gate.init()
	gr.objs.init(len(g.Members))
	if gr.tombstones == nil {
		gr.tombstones = &MemoryTombstones{}
	}
	for _, m := range g.Members {
		if m.Name == "" {
			return nil, fmt.Errorf("group %s: member with empty name", g.Label)
		}
		if _, dup := gr.byName[m.Name]; dup {
			return nil, fmt.Errorf("group %s: member %s listed twice", g.Label, m.Name)
		}
		gr.byName[m.Name] = nil
		gr.specs = append(gr.specs, slot.Spec{
			Name:           m.Name,
			Module:         m.Module,
			ModuleEnv:      m.ModuleEnv,
			TokenLabel:     m.TokenLabel,
			TokenSerial:    m.TokenSerial,
			URI:            m.URI,
			CommandTimeout: s.CommandTimeout,
			KeygenTimeout:  s.KeygenTimeout,
			MaxSessions:    opts.MaxSessions,
			Interceptor:    opts.Interceptor,
		})
	}

	slots := make([]*slot.Slot, len(gr.specs))
	errs := make([]error, len(gr.specs))
	var wg gosync.WaitGroup
	for i, spec := range gr.specs {
		wg.Go(func() { slots[i], errs[i] = slot.Open(ctx, spec) })
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		for _, s := range slots {
			if s != nil {
				s.Close()
			}
		}
		return nil, fmt.Errorf("group %s: open: %w", g.Label, err)
	}
	var failed []*member.Member
	for i, cm := range g.Members {
		st := member.Active
		if cm.Standby {
			st = member.Standby
		}
		var cause error
		if errs[i] != nil {
			st, cause = member.Failed, errs[i]
		}
		m, err := member.New(member.Config{
			Name:             cm.Name,
			Index:            i,
			Standby:          cm.Standby,
			FailureThreshold: s.FailureThreshold,
		}, slots[i], st, cause, gr.onTransition)
		if err != nil {
			gr.closeSlots()
			return nil, fmt.Errorf("group %s: %w", g.Label, err)
		}
		gr.members = append(gr.members, m)
		gr.byName[cm.Name] = m
		if cause != nil {
			failed = append(failed, m)
		}
	}
	for _, m := range failed {
		err, t := m.LastError()
		gr.emit(Event{Kind: MemberFailed, Time: t, Member: m.Name(), To: member.Failed, Err: err})
	}
	gr.ensureActive()
	return gr, nil
}

// Label returns the virtual token's label.
func (g *Group) Label() string { return g.label }

// Serial returns the virtual token's serial number.
func (g *Group) Serial() string { return g.serial }

// Settings returns the group's effective settings.
func (g *Group) Settings() config.Settings { return g.settings }

// Members returns a snapshot of every member, in configured order.
func (g *Group) Members() []member.Snapshot {
	out := make([]member.Snapshot, len(g.members))
	for i, m := range g.members {
		out[i] = m.Snapshot()
	}
	return out
}

// Member returns the named member, for the recovery loop and the agent.
func (g *Group) Member(name string) (*member.Member, bool) {
	m, ok := g.byName[name]
	return m, ok && m != nil
}

// Status is a snapshot of the whole group.
type Status struct {
	Label    string            `json:"label"`
	Serial   string            `json:"serial"`
	Policy   string            `json:"policy"`
	LoggedIn bool              `json:"logged_in"`
	Primary  string            `json:"primary,omitempty"` // empty when no member is active
	Active   int               `json:"active"`
	Standby  int               `json:"standby"`
	Failed   int               `json:"failed"` // failed or recovering
	Sessions int               `json:"sessions"`
	Members  []member.Snapshot `json:"members"`
}

// Degraded reports whether some member is not serving (failed, recovering
// or removed).
func (s Status) Degraded() bool { return s.Failed > 0 }

// Down reports whether no member can take work.
func (s Status) Down() bool { return s.Active == 0 && s.Standby == 0 }

// Status returns a snapshot of the group.
func (g *Group) Status() Status {
	st := Status{Label: g.label, Serial: g.serial, Policy: g.settings.Policy, LoggedIn: g.userType.Load() >= 0}
	if st.Policy == "" {
		st.Policy = config.DefaultPolicy
	}
	st.Members = g.Members()
	for _, m := range st.Members {
		switch m.State {
		case member.Active:
			st.Active++
			if st.Primary == "" {
				st.Primary = m.Name
			}
		case member.Standby:
			st.Standby++
		case member.Failed, member.Recovering:
			st.Failed++
		}
	}
	g.sessMu.Lock()
	st.Sessions = len(g.sessions)
	g.sessMu.Unlock()
	return st
}

// Close closes every virtual session, waits for the operations in flight
// to end (a call hung in a member ends at its command_timeout), zeroes the
// kept PIN and closes every member's token. Calls after Close return
// ErrClosed. Close is idempotent.
func (g *Group) Close() error {
	g.closeOnce.Do(func() {
		g.gate.close()
		g.sessMu.Lock()
		sessions := make([]*Session, 0, len(g.sessions))
		for _, s := range g.sessions {
			sessions = append(sessions, s)
		}
		g.sessMu.Unlock()
		for _, s := range sessions {
			s.close()
		}
		g.loginMu.Lock()
		g.appPIN.Zero()
		g.appPIN = secret.PIN{}
		g.userType.Store(-1)
		g.loginMu.Unlock()
		g.closeSlots()
	})
	return nil
}

func (g *Group) closeSlots() {
	for _, m := range g.members {
		if s := m.Slot(); s != nil {
			s.Close()
		}
	}
}

// gate lets Close wait for the operations in flight without a lock on the
// hot path.
type gate struct {
	n      atomic.Int64
	closed atomic.Bool
	once   gosync.Once
	idle   chan struct{}
}

func (g *gate) init() { g.idle = make(chan struct{}) }

func (g *gate) enter() error {
	g.n.Add(1)
	if g.closed.Load() {
		g.leave()
		return ErrClosed
	}
	return nil
}

func (g *gate) leave() {
	if g.n.Add(-1) == 0 && g.closed.Load() {
		g.once.Do(func() { close(g.idle) })
	}
}

func (g *gate) close() {
	g.closed.Store(true)
	if g.n.Load() == 0 {
		return
	}
	<-g.idle
}

// FailMember drops the named member from rotation (for the agent's health
// probe and for operators). reason is recorded and reported in the
// MemberFailed event. Failing a failed member does nothing.
func (g *Group) FailMember(name string, reason error) error {
	m, ok := g.Member(name)
	if !ok {
		return wrap(ErrUnknownMember, "FailMember", name, nil)
	}
	if reason == nil {
		reason = errors.New("failed by request")
	}
	g.failMember(m, reason)
	return nil
}

func (g *Group) failMember(m *member.Member, reason error) {
	if m.Fail(reason) {
		g.ensureActive()
	}
}

// ensureActive promotes every standby at once when no active member is
// left.
func (g *Group) ensureActive() {
	for _, m := range g.members {
		if m.State() == member.Active {
			return
		}
	}
	for _, m := range g.members {
		m.CompareAndTransition(member.Standby, member.Active, nil)
	}
}

// demoteStandbys returns promoted standbys to standby once a configured
// active member serves again.
func (g *Group) demoteStandbys() {
	for _, m := range g.members {
		if !m.ConfiguredStandby() && m.State() == member.Active {
			for _, s := range g.members {
				if s.ConfiguredStandby() {
					s.CompareAndTransition(member.Active, member.Standby, nil)
				}
			}
			return
		}
	}
}

// Reconnect starts the recovery of a failed member: it moves it to
// recovering (out of rotation), re-opens or re-initialises its token, logs
// it in if the group is logged in (with its own PIN, or the application's
// PIN the group keeps while logged in), and drops every physical handle
// cached for it. It returns the member's slot so that the recovery task
// can resynchronise its objects before ActivateMember returns it to
// rotation. On error the member is failed again. Two recoveries of one
// member never run at once: a second concurrent call gets an error.
func (g *Group) Reconnect(ctx context.Context, name string) (*slot.Slot, error) {
	if err := g.gate.enter(); err != nil {
		return nil, err
	}
	defer g.gate.leave()
	m, ok := g.Member(name)
	if !ok {
		return nil, wrap(ErrUnknownMember, "Reconnect", name, nil)
	}
	if !g.claimRecovery(name) {
		return nil, &Error{Code: pkcs11.CKR_FUNCTION_FAILED, Op: "Reconnect", Member: name, msg: "recovery already running"}
	}
	defer g.releaseRecovery(name)
	return g.reconnect(ctx, m)
}

func (g *Group) claimRecovery(name string) bool {
	g.recoverMu.Lock()
	defer g.recoverMu.Unlock()
	if g.recovering[name] {
		return false
	}
	g.recovering[name] = true
	return true
}

func (g *Group) releaseRecovery(name string) {
	g.recoverMu.Lock()
	delete(g.recovering, name)
	g.recoverMu.Unlock()
}

func (g *Group) reconnect(ctx context.Context, m *member.Member) (*slot.Slot, error) {
	switch st := m.State(); st {
	case member.Failed:
		if _, err := m.Transition(member.Recovering, nil); err != nil {
			return nil, opErr("Reconnect", m.Name(), err)
		}
	case member.Recovering:
	default:
		return nil, &Error{Code: pkcs11.CKR_FUNCTION_FAILED, Op: "Reconnect", Member: m.Name(), msg: "member is " + st.String() + ", not failed"}
	}
	s, err := g.reopen(ctx, m)
	if err != nil {
		m.CompareAndTransition(member.Recovering, member.Failed, err)
		return nil, opErr("Reconnect", m.Name(), err)
	}
	return s, nil
}

func (g *Group) reopen(ctx context.Context, m *member.Member) (*slot.Slot, error) {
	s := m.Slot()
	if s == nil {
		ns, err := slot.Open(ctx, g.specs[m.Index()])
		if err != nil {
			return nil, err
		}
		if old := m.SetSlot(ns); old != nil && old != ns {
			old.Close()
		}
		s = ns
	} else if err := s.Reinit(ctx); err != nil {
		return nil, err
	}
	m.BumpEpoch()
	g.dropPhysicalSessions(m)
	g.loginMu.Lock()
	defer g.loginMu.Unlock()
	if ut := g.userType.Load(); ut >= 0 {
		if err := g.loginMember(ctx, m, uint(ut), g.appPIN); err != nil {
			if slot.ClassOf(err) == slot.ClassLogin && !g.ownPIN(m, uint(ut)) {
				// The kept PIN is refused here: stop offering it, so that
				// recovery retries cannot lock the member out. The member
				// comes back after the application logs in again.
				g.appPIN.Zero()
				g.appPIN = secret.PIN{}
			}
			return nil, err
		}
		m.BumpEpoch()
	}
	return s, nil
}

// ActivateMember returns a member to rotation: a failed member is first
// reconnected (see Reconnect); a recovering one goes straight back. A
// configured standby returns as standby while an active member serves
// (as active otherwise); a configured active member returning demotes any
// promoted standbys. The MemberRecovered event says which.
func (g *Group) ActivateMember(ctx context.Context, name string) error {
	if err := g.gate.enter(); err != nil {
		return err
	}
	defer g.gate.leave()
	m, ok := g.Member(name)
	if !ok {
		return wrap(ErrUnknownMember, "ActivateMember", name, nil)
	}
	if !g.claimRecovery(name) {
		return &Error{Code: pkcs11.CKR_FUNCTION_FAILED, Op: "ActivateMember", Member: name, msg: "recovery already running"}
	}
	defer g.releaseRecovery(name)
	if m.State() == member.Failed {
		if _, err := g.reconnect(ctx, m); err != nil {
			return err
		}
	}
	if m.State() != member.Recovering {
		return &Error{Code: pkcs11.CKR_FUNCTION_FAILED, Op: "ActivateMember", Member: name, msg: "member is " + m.State().String()}
	}
	to := member.Active
	if m.ConfiguredStandby() && g.anyActive() {
		to = member.Standby
	}
	if !m.CompareAndTransition(member.Recovering, to, nil) {
		return &Error{Code: pkcs11.CKR_FUNCTION_FAILED, Op: "ActivateMember", Member: name, msg: "member changed state during recovery (now " + m.State().String() + ")"}
	}
	if !m.ConfiguredStandby() {
		g.demoteStandbys()
	}
	return nil
}

func (g *Group) anyActive() bool {
	for _, m := range g.members {
		if m.State() == member.Active {
			return true
		}
	}
	return false
}

// serving returns the members in configured order that hold current
// objects (active or standby) and have a slot.
func (g *Group) serving() []*member.Member {
	out := make([]*member.Member, 0, len(g.members))
	for _, m := range g.members {
		if m.State().Serving() && m.Slot() != nil {
			out = append(out, m)
		}
	}
	return out
}

// primary returns the first active member in configured order, promoting
// standbys if none is left; nil when no member serves.
func (g *Group) primary() *member.Member {
	for range 2 {
		for _, m := range g.members {
			if m.State() == member.Active && m.Slot() != nil {
				return m
			}
		}
		g.ensureActive()
	}
	return nil
}

// Primary returns the name of the current primary ("" when no member is
// active).
func (g *Group) Primary() string {
	for _, m := range g.members {
		if m.State() == member.Active {
			return m.Name()
		}
	}
	return ""
}

// commandDeadline is the longest a single call may take before the group
// gives up on it; used to bound group-level waits.
func (g *Group) commandDeadline() time.Duration {
	if g.settings.CommandTimeout > 0 {
		return g.settings.CommandTimeout
	}
	return config.DefaultCommandTimeout
}
