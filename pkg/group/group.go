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
// code (CodeOf). Go programs use the same engine, and pkg/group/signer
// for a crypto.Signer that survives failovers.
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
//   - Operations (Session.Init, then Do: single-part, or Updates and a
//     Final) send their Init to a member when the application makes it,
//     so that its refusal is the Init's, unless the same Init was accepted
//     since the last change (initproof.go). Until an Update was accepted
//     they fail over by sending the Init again to the next member;
//     afterwards they are pinned: if the member fails, the operation ends
//     with ErrMemberLost (CKR_DEVICE_ERROR). Session.Do keeps the output of
//     a length query or a short buffer for the next call, as PKCS#11 says.
//   - Object identity is CKA_CLASS + CKA_KEY_TYPE + CKA_ID + CKA_LABEL and
//     must be unique among token objects made through the group; two keys
//     under one identity (found by fingerprint) are reported
//     (ConflictFound) and never used.
//   - A private or secret key made through the group is sensitive and
//     physically extractable on every member (the group must move it
//     between members under the domain key), with CKA_WRAP_WITH_TRUSTED
//     when the domain key is trusted unless the application made it
//     extractable (a template without CKA_EXTRACTABLE takes SoftHSM's
//     default, false). On the virtual slot a private or secret key whose
//     copies all carry CKA_WRAP_WITH_TRUSTED reads CKA_EXTRACTABLE=false
//     and cannot be wrapped (CKR_KEY_UNEXTRACTABLE), in this process and
//     in any other, and every private or secret key is sensitive; its
//     attributes read alike from every member (see keyprot.go).
//     With an untrusted domain key the promise holds in the process that
//     made the key only: install a trusted domain key.
//   - The application's PIN is kept, while logged in, only if a member
//     without its own PIN source needs it for recovery; it is zeroed on
//     Logout and Close.
//
// Membership changes while the group runs (AddMember, RemoveMember,
// SetStandby, SetOrder): the membership is replaced whole, so the hot path
// reads it with one atomic load and never waits for a change. A member
// added joins as recovering — no work, no replicated objects — until the
// caller has caught it up and activates it (pkg/recover's Admit; pkg/ha
// does both); a member removed takes no new work at once and is closed
// once the calls in flight on it and the multi-part operations pinned to
// it have ended.
//
// What every process on every host must agree on is kept on the members
// (groupstate.go, pkg/sync/state's state.go and marker.go): a change made
// while a member is out of rotation leaves, on every serving member, a
// mark that the member missed it, and a process that logs in keeps every
// member so marked out of rotation until it is caught up.
//
// Object creation, destruction and attribute changes pass a write barrier
// (HoldWrites) and move a mark (WriteMark). Recovery holds the barrier for
// its final catch-up and the activation, so an object made between its
// last listing and the member's return is not missed; signing and the
// other operations never wait for it.
//
// When the last serving member fails, operations fail with
// CKR_DEVICE_ERROR (GroupDown event). With recovery_mode activeBasic every
// virtual session is lost (CKR_SESSION_HANDLE_INVALID) and so is the
// login: once a member is back the application opens new sessions and
// logs in again. With activeEnhanced sessions and login are kept, the
// recovered member is logged in with the kept PIN, and the same session
// handles work again (session objects and pinned multi-part operations do
// not survive).
//
// Private and secret keys travel between members wrapped with
// CKM_AES_KEY_WRAP_PAD. A member whose token does not offer it (one served
// by p11-kit 0.24, whose RPC cannot carry it) is reported once
// (MechanismMissing) and stays in service, its health not charged for it;
// but an object made through the group must be on every serving member
// (Luna's promise), so while it serves with another member a creation of a
// private or secret key fails cleanly (CreationRefused; nothing is made)
// and the mechanisms that generate them are not offered. The same holds
// for a key type a member's token will not wrap (SoftHSM 2.6: EdDSA), as
// probed when it joins (capability.go).
//
// The engine never logs: it reports what happens through Options.Events.
// Every exported method is safe for concurrent use.
package group

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hagroup/hagroup/internal/gate"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group/login"
	"github.com/hagroup/hagroup/pkg/group/opstate"
	"github.com/hagroup/hagroup/pkg/group/vtable"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/dispatch"
	hasync "github.com/hagroup/hagroup/pkg/sync"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/hagroup/hagroup/pkg/sync/tombstone"
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
	// Tombstones records destroys; nil keeps them in a tombstone.Memory.
	Tombstones Tombstones
	// MaxSessions caps each member's session pool (0: pkg/slot's default).
	MaxSessions int
	// ThreadCallers: the calls come from C threads (libhapkcs11.so); see
	// slot.Spec.ThreadCallers.
	ThreadCallers bool
	// StoreLocks is the directory of the members' store locks, shared by
	// every process of this host that opens the group
	// (slot.Spec.StoreLock: DIR/<member>.store.lock); "": none.
	StoreLocks string
	// PINGuard keeps members whose token refused their PIN from being
	// offered one again; nil: no guard beyond this process's own refusal.
	PINGuard PINGuard
	// CatchUp, when set, catches up the named members before Login
	// returns (not LoginConfigured): they were failed at the login because another member marks
	// them behind (DESIGN.md, "Group state on the members"). A process that
	// lives shorter than the recovery interval (a per-task tool) would
	// otherwise keep them out for good and mark them again.
	CatchUp func(ctx context.Context, names []string)
	// Facts keeps what members' tokens were found to do (what they can
	// wrap, that they refuse the domain key's trial copies) for the next
	// process on the host (pkg/tokenfacts); nil: each process tries them.
	Facts hasync.Facts
}

// PINGuard remembers the members whose token refused the PIN the engine
// logged them in with (pkg/recover's PINBlocks keeps it in the state
// directory, for every process on the host). Its methods must be safe for
// concurrent use and must not block for long.
type PINGuard interface {
	// Blocked returns why member must not be logged in by the engine, or
	// nil.
	Blocked(member string) error
	// Refused records that member's token refused the PIN the engine
	// logged it in with (slot.PINRefused(err)).
	Refused(member string, err error)
}

// Group is one HA group. Create it with Open; it is safe for concurrent
// use.
type Group struct {
	label, serial string
	settings      config.Settings
	policy        atomic.Int32 // a policy
	enhanced      atomic.Bool  // recovery_mode = activeEnhanced
	opts          Options

	// roster is the membership now; replaced whole under memberMu.
	roster   atomic.Pointer[roster]
	memberMu sync.Mutex
	retiring memberSet     // indexes of removed members still draining; guarded by memberMu
	epochs   atomic.Uint64 // epoch source shared by every member
	// unfolded are the members (a memberSet) that refused an attribute a
	// fingerprint needs in a read readVerifying folded it into: a token
	// then answers each attribute of the read on its own (pkg/slot), so
	// their handles are checked apart from the read.
	unfolded atomic.Uint64
	width    atomic.Int64              // 1 + the highest member index in use
	caps     sync.Map                  // member name → hasync.WrapCapability (capability.go)
	mechs    sync.Map                  // member name → []uint, its token's mechanisms (capability.go)
	pairs    sync.Map                  // pairKey(source, target) → hasync.PairWays (capability.go)
	model    atomic.Pointer[[2]string] // token manufacturer and model last reported (TokenInfo)

	events     EventSink
	tombstones Tombstones
	rep        *hasync.Replicator

	rr   atomic.Uint64 // rotation for round-robin and least-busy ties
	gate *gate.Gate

	// writes is the write barrier: object creation, destruction and
	// attribute changes pass it; HoldWrites closes it.
	writes    gate.Barrier
	writeMark atomic.Uint64

	logins *login.State // who is logged in, the kept PIN, the members' login rules

	recoverMu  sync.Mutex
	recovering map[string]bool // guarded by recoverMu

	probeMu sync.Mutex
	doubted map[*member.Member]bool // last probe answered ambiguously (Probe); guarded by probeMu

	sessMu   sync.Mutex
	sessions map[SessionHandle]*Session
	nextSess atomic.Uint64
	// sessGen changes when every member failed in activeBasic: sessions
	// opened before are lost.
	sessGen atomic.Uint64
	down    atomic.Bool // every member is down (the outage was handled)

	bgMu     sync.Mutex
	bgClosed bool // guarded by bgMu
	bg       sync.WaitGroup

	skipMu  sync.Mutex
	skipped map[string]map[string]skippedObject // member → identity key → what it lacks
	changes atomic.Uint64                       // objects made, destroyed or changed

	objs   *vtable.Table
	proofs opstate.Proofs[proofKey] // Inits the members accepted (initproof.go)

	marks *marks // behind marks on the members (groupstate.go)

	hedgeCounters // hedge.go

	closeOnce sync.Once
}

// Open builds the group g with settings s. Every member's token is opened
// in parallel; a member whose token cannot be opened starts as failed (its
// error is kept in its status and a MemberFailed event is emitted), so a
// group opens even with members down, and recovery (ActivateMember) brings
// them in later. Open fails only on an unusable configuration or when ctx
// ends. Members are not logged in: call Login or LoginConfigured.
func Open(ctx context.Context, g config.Group, s config.Settings, opts Options) (*Group, error) {
	if g.Label == "" {
		return nil, errors.New("group: empty label")
	}
	if len(g.Members) == 0 {
		return nil, fmt.Errorf("group %s: no members", g.Label)
	}
	if len(g.Members) > MaxMembers {
		return nil, fmt.Errorf("group %s: %d members, at most %d", g.Label, len(g.Members), MaxMembers)
	}
	pol, err := parsePolicy(s.Policy)
	if err != nil {
		return nil, fmt.Errorf("group %s: %w", g.Label, err)
	}
	enhanced, err := parseRecoveryMode(s.RecoveryMode)
	if err != nil {
		return nil, fmt.Errorf("group %s: %w", g.Label, err)
	}
	gr := &Group{
		label:      g.Label,
		serial:     g.Serial,
		settings:   s,
		opts:       opts,
		events:     opts.Events,
		tombstones: opts.Tombstones,
		rep:        &hasync.Replicator{GroupSerial: g.Serial, Facts: opts.Facts},
		sessions:   make(map[SessionHandle]*Session),
		recovering: make(map[string]bool),
		skipped:    make(map[string]map[string]skippedObject),
		marks:      newMarks(),
	}
	gr.rep.PairWay = gr.pairWay
	gr.rep.OnWeakDomainKey = func(e *domainkey.WeakError) {
		gr.emit(Event{Kind: DomainKeyWeak, Member: e.Member, Err: e})
	}
	gr.policy.Store(int32(pol))
	gr.enhanced.Store(enhanced)
	gr.logins = login.New(opts.PINGuard, login.Members{OwnPIN: gr.ownPIN, Login: gr.loginAs, Fail: gr.failMember})
	gr.gate = gate.New(ErrClosed)
	gr.objs = vtable.New(func() int { return int(gr.width.Load()) })
	if gr.tombstones == nil {
		gr.tombstones = &tombstone.Memory{}
	}
	seen := map[string]bool{}
	specs := make([]slot.Spec, len(g.Members))
	for i, m := range g.Members {
		if err := checkMemberConfig(m); err != nil {
			return nil, fmt.Errorf("group %s: %w", g.Label, err)
		}
		if seen[m.Name] {
			return nil, fmt.Errorf("group %s: member %s listed twice", g.Label, m.Name)
		}
		seen[m.Name] = true
		specs[i] = gr.spec(m)
	}

	slots := make([]*slot.Slot, len(specs))
	errs := make([]error, len(specs))
	var wg sync.WaitGroup
	for i, spec := range specs {
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
	r := &roster{byName: map[string]*member.Member{}, cfg: map[int]config.Member{}, spec: map[int]slot.Spec{}}
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
		m, err := member.New(gr.memberConfig(cm, i), slots[i], st, cause, gr.onTransition)
		if err != nil {
			for _, s := range slots {
				if s != nil {
					s.Close()
				}
			}
			return nil, fmt.Errorf("group %s: %w", g.Label, err)
		}
		r.add(m, cm, specs[i])
		if cause != nil {
			failed = append(failed, m)
		}
	}
	gr.roster.Store(r)
	gr.width.Store(int64(len(g.Members)))
	for _, m := range failed {
		err, t := m.LastError()
		gr.emit(Event{Kind: MemberFailed, Time: t, Member: m.Name(), To: member.Failed, Err: err})
	}
	var mwg sync.WaitGroup
	for _, m := range r.members {
		if m.Slot() != nil {
			// A failure is charged to the member (see call); it is
			// checked again when the member is re-opened.
			mwg.Go(func() { _ = gr.checkMechanisms(ctx, m) })
		}
	}
	mwg.Wait()
	gr.ensureActive()
	return gr, nil
}

// checkMemberConfig refuses a member the group cannot hold.
func checkMemberConfig(m config.Member) error {
	if m.Name == "" {
		return errors.New("member with empty name")
	}
	return nil
}

// spec is the slot.Spec of member m under the group's settings.
func (g *Group) spec(m config.Member) slot.Spec {
	spec := member.SlotSpec(m, g.settings)
	spec.MaxSessions = g.opts.MaxSessions
	spec.Interceptor = g.opts.Interceptor
	spec.ThreadCallers = g.opts.ThreadCallers
	if g.opts.StoreLocks != "" {
		spec.StoreLock = filepath.Join(g.opts.StoreLocks, m.Name+".store.lock")
	}
	return spec
}

func (g *Group) memberConfig(cm config.Member, index int) member.Config {
	return member.Config{
		Name:             cm.Name,
		Index:            index,
		Standby:          cm.Standby,
		FailureThreshold: g.settings.FailureThreshold,
		Epochs:           &g.epochs,
	}
}

// Label returns the virtual token's label.
func (g *Group) Label() string { return g.label }

// Serial returns the virtual token's serial number.
func (g *Group) Serial() string { return g.serial }

// Replicator returns the replicator the group copies objects with, for
// pkg/recover to copy with the same one: it admits one copy at a time
// into each member token (SoftHSM refuses some made from two threads at
// once), audits each member's domain key once per login epoch and
// reports a weak one as DomainKeyWeak.
func (g *Group) Replicator() *hasync.Replicator { return g.rep }

// Members returns a snapshot of every member, in configured order.
func (g *Group) Members() []member.Snapshot {
	ms := g.view().members
	out := make([]member.Snapshot, len(ms))
	for i, m := range ms {
		out[i] = m.Snapshot()
	}
	return out
}

// Member returns the named member, for the recovery loop and the agent.
func (g *Group) Member(name string) (*member.Member, bool) {
	m, ok := g.view().byName[name]
	return m, ok && m != nil
}

// Status is a snapshot of the whole group.
type Status struct {
	Summary
	Members []member.Snapshot `json:"members"`
}

// Summary is the group as a whole, without its members: the part of its
// status pkg/ha's Status shares.
type Summary struct {
	Label  string `json:"label"`
	Serial string `json:"serial"`
	Policy string `json:"policy"`
	// RecoveryMode is activeBasic or activeEnhanced.
	RecoveryMode string `json:"recovery_mode"`
	LoggedIn     bool   `json:"logged_in"`
	Primary      string `json:"primary,omitempty"` // empty when no member is active
	Active       int    `json:"active"`
	Standby      int    `json:"standby"`
	Failed       int    `json:"failed"` // failed or recovering
	Sessions     int    `json:"sessions"`
}

// Degraded reports whether some member is not serving (failed, recovering
// or removed).
func (s Summary) Degraded() bool { return s.Failed > 0 }

// Status returns a snapshot of the group.
func (g *Group) Status() Status {
	st := Status{Summary: Summary{Label: g.label, Serial: g.serial, Policy: g.policyName(), RecoveryMode: g.RecoveryMode()}}
	_, st.LoggedIn = g.LoggedIn()
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
		g.gate.Close()
		g.CloseAllSessions()
		g.logins.Lock()
		g.logins.Clear()
		g.logins.Unlock()
		g.bgMu.Lock()
		g.bgClosed = true
		g.bgMu.Unlock()
		g.bg.Wait()
		g.memberMu.Lock()
		g.closeSlots()
		g.memberMu.Unlock()
	})
	return nil
}

// closeSlots closes every member's token. memberMu held.
func (g *Group) closeSlots() {
	for _, m := range g.view().members {
		if s := m.Slot(); s != nil {
			s.Close()
		}
	}
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
		g.checkOutage()
	}
}

// ensureActive promotes every standby at once when no active member is
// left.
func (g *Group) ensureActive() {
	ms := g.view().members
	for _, m := range ms {
		if m.State() == member.Active {
			return
		}
	}
	for _, m := range ms {
		m.CompareAndTransition(member.Standby, member.Active, nil)
	}
}

// demoteStandbys returns promoted standbys to standby once a configured
// active member serves again.
func (g *Group) demoteStandbys() {
	ms := g.view().members
	for _, m := range ms {
		if !m.ConfiguredStandby() && m.State() == member.Active {
			for _, s := range ms {
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
	if err := g.gate.Enter(); err != nil {
		return nil, err
	}
	defer g.gate.Leave()
	m, ok := g.Member(name)
	if !ok {
		return nil, wrap(ErrUnknownMember, "Reconnect", name, nil)
	}
	if !g.claimRecovery(name) {
		return nil, &Error{Code: pkcs11.CKR_FUNCTION_FAILED, Op: "Reconnect", Member: name, msg: "recovery already running"}
	}
	defer g.releaseRecovery(name)
	s, err := g.reconnect(ctx, m)
	if err == nil {
		g.noteMarks(ctx, m) // before the catch-up lists anything
	}
	return s, err
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
		spec, ok := g.view().spec[m.Index()]
		if !ok {
			return nil, fmt.Errorf("member %s is no longer in the group", m.Name())
		}
		ns, err := slot.Open(ctx, spec)
		if err != nil {
			return nil, err
		}
		if old := m.SetSlot(ns); old != nil && old != ns {
			old.Close()
		}
		if m.State() == member.Removed {
			// RemoveMember closed the member meanwhile: do not leave this
			// token open behind it.
			ns.Close()
			return nil, fmt.Errorf("member %s was removed from the group", m.Name())
		}
		s = ns
	} else if err := s.Reinit(ctx); err != nil {
		return nil, err
	}
	m.BumpEpoch()
	g.dropPhysicalSessions(m)
	if err := g.checkMechanisms(ctx, m); err != nil {
		return nil, err
	}
	g.logins.Lock()
	defer g.logins.Unlock()
	ut, in := g.logins.LoggedIn()
	if !in && s.LoggedIn() {
		// The token came back logged in with the PIN its slot kept, but the
		// group is logged out (the application logged out, or sessions and
		// login were lost when every member failed in activeBasic).
		if err := s.Logout(ctx); err != nil {
			return nil, err
		}
		m.BumpEpoch()
	}
	if in && !(ut == pkcs11.CKU_USER && s.LoggedIn()) {
		// (A slot that logged in again by itself with its kept PIN on
		// Reinit needs no second C_Login.)
		if err := g.relogin(ctx, m, ut); err != nil {
			if slot.ClassOf(err) == slot.ClassLogin && !g.logins.OwnPIN(m, ut) {
				// The kept PIN is refused here: stop offering it, so that
				// recovery retries cannot lock the member out. The member
				// comes back after the application logs in again.
				g.logins.ForgetPIN()
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
//
// ActivateMember does not catch the member up: the caller does, and to
// miss nothing made or destroyed through the group meanwhile, it calls
// ActivateMember while it holds the write barrier (HoldWrites) and has
// caught up again if WriteMark moved since its last listing (pkg/recover
// does so).
func (g *Group) ActivateMember(ctx context.Context, name string) error {
	if err := g.gate.Enter(); err != nil {
		return err
	}
	defer g.gate.Leave()
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
	if away := g.missedHeldAway(name); len(away) > 0 {
		err := fmt.Errorf("behind: it missed changes made through the group while away, and no member holding them serves (%s): it returns once one does",
			strings.Join(away, ", "))
		m.CompareAndTransition(member.Recovering, member.Failed, err)
		return opErr("ActivateMember", name, err)
	}
	// Under the logins' lock, so that a Login running now either saw the member
	// serving (and logged it in) or is over (and the member is logged in
	// here): the application may have logged in again while the member
	// was re-opened logged out (after an outage in activeBasic), and a
	// member back in rotation without the login finds no private object.
	g.logins.Lock()
	if ut, in := g.logins.LoggedIn(); in && !m.Slot().LoggedIn() {
		if err := g.relogin(ctx, m, ut); err != nil {
			g.logins.Unlock()
			m.CompareAndTransition(member.Recovering, member.Failed, err)
			return opErr("ActivateMember", name, fmt.Errorf("log in: %w", err))
		}
		m.BumpEpoch()
	}
	to := member.Active
	if m.ConfiguredStandby() && g.anyActive() {
		to = member.Standby
	}
	moved := m.CompareAndTransition(member.Recovering, to, nil)
	g.logins.Unlock()
	if !moved {
		return &Error{Code: pkcs11.CKR_FUNCTION_FAILED, Op: "ActivateMember", Member: name, msg: "member changed state during recovery (now " + m.State().String() + ")"}
	}
	g.clearSkipped(name)
	g.clearMarks(ctx, name)
	if !m.ConfiguredStandby() {
		g.demoteStandbys()
	}
	return nil
}

func (g *Group) anyActive() bool {
	return slices.ContainsFunc(g.view().members, func(m *member.Member) bool { return m.State() == member.Active })
}

// serving returns the members in configured order that hold current
// objects (active or standby) and have a slot.
func (g *Group) serving() []*member.Member {
	ms := g.view().members
	out := make([]*member.Member, 0, len(ms))
	for _, m := range ms {
		if m.State().Serving() && m.Slot() != nil {
			out = append(out, m)
		}
	}
	return out
}

// primary returns the first active member in configured order, promoting
// standbys if none is left; nil when no member serves.
func (g *Group) primary() *member.Member {
	return g.creator(false, 0)
}

// creator returns the member key management runs on, among those not in
// skip: the primary, or with wrapped (the object made is a private or
// secret key, which travels to the other members only wrapped under the
// domain key) the first active member that can wrap it, and the primary
// when none can. nil when no member serves.
func (g *Group) creator(wrapped bool, skip memberSet) *member.Member {
	for range 2 {
		var first *member.Member
		for _, m := range g.view().members {
			if m.State() != member.Active || m.Slot() == nil || skip.has(m.Index()) {
				continue
			}
			if !wrapped || !m.Lacks(MechWrapPad) {
				return m
			}
			if first == nil {
				first = m
			}
		}
		if first != nil {
			return first
		}
		g.ensureActive()
	}
	return nil
}

// Primary returns the name of the current primary ("" when no member is
// active).
func (g *Group) Primary() string {
	for _, m := range g.view().members {
		if m.State() == member.Active {
			return m.Name()
		}
	}
	return ""
}

// commandDeadline is the longest a single call may take before the group
// gives up on it; used to bound group-level waits.
func (g *Group) commandDeadline() time.Duration {
	return dispatch.CommandTimeout(g.settings.CommandTimeout)
}
