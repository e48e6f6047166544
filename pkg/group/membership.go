package group

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/dispatch"
	hasync "github.com/hagroup/hagroup/pkg/sync"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// Hot membership changes, the write barrier, recovery modes and the
// mechanisms a member must offer.

// MaxMembers is the largest number of members a group holds at once.
const MaxMembers = 64

// MechWrapPad names CKM_AES_KEY_WRAP_PAD, the mechanism private and secret
// keys travel under between members (see pkg/sync). A member whose token
// does not offer it (one served by p11-kit 0.24, whose RPC cannot carry
// it, for one) stays in service for everything else; while it serves with
// another member, no private or secret key is made through the group
// (capability.go), and its health is not charged for what cannot work.
const MechWrapPad = "CKM_AES_KEY_WRAP_PAD"

// roster is the membership at one moment. It is never changed once
// published: AddMember, RemoveMember and SetStandby publish a new one, so
// the hot path reads it with one atomic load.
type roster struct {
	members []*member.Member // configured order: the first active one is primary
	byName  map[string]*member.Member
	cfg     map[int]config.Member // by member index
	spec    map[int]slot.Spec     // by member index
}

func (r *roster) add(m *member.Member, cm config.Member, spec slot.Spec) {
	r.members = append(r.members, m)
	r.byName[cm.Name] = m
	r.cfg[m.Index()] = cm
	r.spec[m.Index()] = spec
}

func (r *roster) clone() *roster {
	return &roster{
		members: slices.Clone(r.members),
		byName:  maps.Clone(r.byName),
		cfg:     maps.Clone(r.cfg),
		spec:    maps.Clone(r.spec),
	}
}

func (r *roster) used() memberSet {
	var s memberSet
	for _, m := range r.members {
		s.add(m.Index())
	}
	return s
}

func (g *Group) view() *roster { return g.roster.Load() }

// AddMember adds a member to the open group without disturbing the others.
// The new member takes no work and receives no replicated objects until
// it is caught up: it joins as recovering when its token opens (and logs
// in, when the group is logged in), and as failed otherwise — then the
// error says why, a MemberFailed event is emitted and the recovery loop
// retries it like any failed member. It goes last in the configured order.
//
// AddMember does not catch the member up: pkg/recover's Admit (or
// ha.Group.AddMember, which does both) copies the group's objects to it
// and then returns it to rotation.
func (g *Group) AddMember(ctx context.Context, mc config.Member) error {
	const op = "AddMember"
	if err := g.gate.Enter(); err != nil {
		return err
	}
	defer g.gate.Leave()
	if err := checkMemberConfig(mc); err != nil {
		return fmt.Errorf("group %s: %w", g.label, err)
	}
	g.memberMu.Lock()
	defer g.memberMu.Unlock()
	r := g.view()
	if _, dup := r.byName[mc.Name]; dup {
		return fmt.Errorf("group %s: AddMember: member %s is already in the group", g.label, mc.Name)
	}
	taken := r.used() | g.retiring
	index := -1
	for i := range MaxMembers {
		if !taken.has(i) {
			index = i
			break
		}
	}
	if index < 0 {
		return fmt.Errorf("group %s: AddMember %s: the group has %d members (or members still leaving), at most %d", g.label, mc.Name, len(r.members), MaxMembers)
	}
	spec := g.spec(mc)
	s, openErr := slot.Open(ctx, spec)
	st := member.Recovering
	if openErr != nil {
		st = member.Failed
	}
	m, err := member.New(g.memberConfig(mc, index), s, st, openErr, g.onTransition)
	if err != nil {
		if s != nil {
			s.Close()
		}
		return fmt.Errorf("group %s: %w", g.label, err)
	}
	// Stale entries of a member that had this index before: forget them.
	g.objs.Purge(index)
	nr := r.clone()
	nr.add(m, mc, spec)
	g.roster.Store(nr)
	if w := int64(index + 1); w > g.width.Load() {
		g.width.Store(w)
	}
	g.emit(Event{Kind: MemberAdded, Member: mc.Name, To: st, Err: openErr})
	if openErr != nil {
		err, t := m.LastError()
		g.emit(Event{Kind: MemberFailed, Time: t, Member: m.Name(), To: member.Failed, Err: err})
		return opErr(op, mc.Name, openErr)
	}
	if err := g.checkMechanisms(ctx, m); err != nil {
		m.Fail(err)
		return opErr(op, mc.Name, err)
	}
	g.logins.Lock()
	defer g.logins.Unlock()
	if ut, in := g.logins.LoggedIn(); in {
		if err := g.relogin(ctx, m, ut); err != nil {
			m.Fail(fmt.Errorf("log in: %w", err))
			return opErr(op, mc.Name, err)
		}
		m.BumpEpoch()
	}
	g.noteMarks(ctx, m) // before its catch-up lists anything
	return nil
}

// RemoveMember takes member name out of the group without disturbing the
// others. From the call on, the member gets no new work (nor objects, nor
// the primary's role); the single-part calls in flight on it and the
// multi-part operations pinned to it are left to finish — bounded by ctx
// and by keygen_timeout, after which the pinned operations that remain
// end with CKR_DEVICE_ERROR — and then its token is closed and it emits
// MemberRemoved. The last member cannot be removed.
func (g *Group) RemoveMember(ctx context.Context, name string) error {
	if err := g.gate.Enter(); err != nil {
		return err
	}
	defer g.gate.Leave()
	g.memberMu.Lock()
	r := g.view()
	m, ok := r.byName[name]
	if !ok {
		g.memberMu.Unlock()
		return wrap(ErrUnknownMember, "RemoveMember", name, nil)
	}
	if len(r.members) == 1 {
		g.memberMu.Unlock()
		return fmt.Errorf("group %s: RemoveMember: %s is the last member; delete the group instead", g.label, name)
	}
	nr := r.clone()
	nr.members = slices.DeleteFunc(nr.members, func(x *member.Member) bool { return x == m })
	delete(nr.byName, name)
	delete(nr.cfg, m.Index())
	delete(nr.spec, m.Index())
	g.roster.Store(nr)
	g.retiring.add(m.Index())
	g.memberMu.Unlock()
	g.emit(Event{Kind: MemberLeaving, Member: name, From: m.State()})
	if m.State() == member.Active {
		g.ensureActive() // it may have been the last active one
	}

	dctx, cancel := context.WithTimeout(ctx, g.drainLimit())
	drainErr := m.Drain(dctx)
	cancel()
	var why error
	if drainErr != nil {
		why = fmt.Errorf("removed before its work ended: %w", drainErr)
	}
	m.Transition(member.Removed, why)
	if s := m.Slot(); s != nil {
		s.Close()
	}
	g.dropPhysicalSessions(m)
	g.objs.Purge(m.Index())
	g.skipMu.Lock()
	delete(g.skipped, name)
	g.skipMu.Unlock()
	g.memberMu.Lock()
	g.retiring = g.retiring.without(m.Index())
	g.memberMu.Unlock()
	g.checkOutage()
	return nil
}

// drainLimit bounds how long RemoveMember waits for a member's work.
func (g *Group) drainLimit() time.Duration {
	return max(dispatch.KeygenTimeout(g.settings.KeygenTimeout), g.commandDeadline())
}

// SetStandby makes member name a standby (or an active member again)
// without disturbing the others. A standby takes no work while an active
// member serves; so an active member made standby is demoted at once
// unless no other active member is left (then it stays promoted, as
// standbys are when every active member is down). A standby made active
// is promoted at once and any promoted standby goes back to standby. A
// failed or recovering member returns in its new role.
func (g *Group) SetStandby(name string, standby bool) error {
	if err := g.gate.Enter(); err != nil {
		return err
	}
	defer g.gate.Leave()
	g.memberMu.Lock()
	r := g.view()
	m, ok := r.byName[name]
	if !ok {
		g.memberMu.Unlock()
		return wrap(ErrUnknownMember, "SetStandby", name, nil)
	}
	nr := r.clone()
	cm := nr.cfg[m.Index()]
	cm.Standby = standby
	nr.cfg[m.Index()] = cm
	g.roster.Store(nr)
	m.SetConfiguredStandby(standby)
	g.memberMu.Unlock()
	if standby {
		for _, o := range nr.members {
			if o != m && !o.ConfiguredStandby() && o.State() == member.Active {
				m.CompareAndTransition(member.Active, member.Standby, nil)
				break
			}
		}
		return nil
	}
	m.CompareAndTransition(member.Standby, member.Active, nil)
	g.demoteStandbys()
	return nil
}

// SetPolicy changes the scheduling policy (least-busy, round-robin or
// primary-backup) of the open group.
func (g *Group) SetPolicy(p string) error {
	pol, err := parsePolicy(p)
	if err != nil {
		return fmt.Errorf("group %s: %w", g.label, err)
	}
	g.policy.Store(int32(pol))
	return nil
}

func (g *Group) policyName() string { return policyNames[g.policy.Load()] }

func parseRecoveryMode(s string) (enhanced bool, err error) {
	switch s {
	case "", config.RecoveryActiveBasic:
		return false, nil
	case config.RecoveryActiveEnhanced:
		return true, nil
	}
	return false, fmt.Errorf("unknown recovery mode %q (want %s or %s)", s, config.RecoveryActiveBasic, config.RecoveryActiveEnhanced)
}

// SetRecoveryMode changes the recovery mode (activeBasic or
// activeEnhanced) of the open group; it decides what the next outage of
// every member does to sessions and login.
func (g *Group) SetRecoveryMode(mode string) error {
	enhanced, err := parseRecoveryMode(mode)
	if err != nil {
		return fmt.Errorf("group %s: %w", g.label, err)
	}
	g.enhanced.Store(enhanced)
	return nil
}

// RecoveryMode returns activeBasic or activeEnhanced.
func (g *Group) RecoveryMode() string {
	if g.enhanced.Load() {
		return config.RecoveryActiveEnhanced
	}
	return config.RecoveryActiveBasic
}

// checkOutage handles the failure of the last serving member, once per
// outage. In activeBasic every virtual session is lost (its handle answers
// CKR_SESSION_HANDLE_INVALID) and the login with it: once a member is
// back, the application opens new sessions and logs in again, as if it
// had been restarted (Luna's activeBasic, without the restart). In
// activeEnhanced sessions and login stay: recovered members are logged in
// with the kept PIN and the same session handles work again.
func (g *Group) checkOutage() {
	for _, m := range g.view().members {
		if m.State().Serving() {
			return
		}
	}
	if !g.down.CompareAndSwap(false, true) {
		return
	}
	if g.enhanced.Load() {
		g.emit(Event{Kind: GroupDown, Err: errors.New("every member failed (activeEnhanced): sessions and login are kept and work again once a member recovers")})
		return
	}
	g.sessGen.Add(1)
	g.logins.Lost()
	g.emit(Event{Kind: GroupDown, Err: errors.New("every member failed (activeBasic): every session and the login are lost; open new sessions and log in again once a member recovers")})
	g.background(g.dropLostSessions)
}

// background runs fn on a goroutine Close waits for (not at all once the
// group is closing). The outage handling runs there: it is reached from
// calls that hold the locks it takes.
func (g *Group) background(fn func()) {
	if g.gate.Closed() {
		return
	}
	g.bgMu.Lock()
	defer g.bgMu.Unlock()
	if g.bgClosed {
		return
	}
	g.bg.Go(fn)
}

// dropLostSessions closes the sessions lost in an activeBasic outage and
// zeroes the PIN unless the application has logged in again since.
func (g *Group) dropLostSessions() {
	g.logins.Lock()
	if _, in := g.logins.LoggedIn(); !in {
		g.logins.ForgetPIN()
	}
	g.logins.Unlock()
	gen := g.sessGen.Load()
	g.sessMu.Lock()
	var lost []*Session
	for _, s := range g.sessions {
		if s.gen != gen {
			lost = append(lost, s)
		}
	}
	g.sessMu.Unlock()
	for _, s := range lost {
		s.mu.Lock()
		s.lost = true
		s.mu.Unlock()
		s.close()
	}
}

// checkMechanisms reads the mechanisms of m's token and records (and
// reports once, with a MechanismMissing event) those the group needs that
// it lacks, then probes which kinds of key it can hold (capability.go).
// The member's health is charged if a call fails.
func (g *Group) checkMechanisms(ctx context.Context, m *member.Member) error {
	var mechs []uint
	if _, err := g.call(ctx, m, func() (err error) {
		mechs, err = m.Slot().Mechanisms(ctx)
		return err
	}); err != nil {
		return fmt.Errorf("read mechanisms: %w", err)
	}
	var missing []string
	if !slices.Contains(mechs, pkcs11.CKM_AES_KEY_WRAP_PAD) {
		missing = append(missing, MechWrapPad)
	}
	switch {
	case !m.SetMissingMechanisms(missing) || len(missing) == 0:
	case byPairOnly(m):
		g.emit(Event{Kind: MechanismMissing, Member: m.Name(), Err: fmt.Errorf(
			"member %s does not offer %s (0x%x): its make wraps with no AES key wrap, so it holds no domain key; keys reach it and leave it only by the ways its pairs proved, under transit keys agreed for each copy, and while it serves with another member the group makes no key of a kind no proven way carries (listgroups: cannotHold)",
			m.Name(), MechWrapPad, uint(pkcs11.CKM_AES_KEY_WRAP_PAD))})
	default:
		g.emit(Event{Kind: MechanismMissing, Member: m.Name(), Err: fmt.Errorf(
			"member %s does not offer %s (0x%x; a p11-kit 0.24 RPC cannot carry it): private and secret keys cannot be replicated to or from it; it stays in service, and while it serves with another member the group makes no private or secret key (%s) and does not offer the mechanisms that generate them",
			m.Name(), MechWrapPad, uint(pkcs11.CKM_AES_KEY_WRAP_PAD), CreationRefused)})
	}
	if err := g.probeCapability(ctx, m, mechs); err != nil {
		return fmt.Errorf("probe what it can wrap: %w", err)
	}
	return nil
}

// wrappedClass reports whether objects of class travel wrapped under the
// domain key: private and secret keys. Every other class (data objects,
// whose CKO_DATA is 0, certificates, public keys) travels by its
// attributes and needs no MechWrapPad.
func wrappedClass(class uint) bool {
	return class == pkcs11.CKO_PRIVATE_KEY || class == pkcs11.CKO_SECRET_KEY
}

// Unreplicated is an object made or changed through the group that a
// member did not receive because a mechanism it lacks made replication to
// it impossible.
type Unreplicated struct {
	Object object.Identity
	Time   time.Time
}

type skippedObject = Unreplicated

// forgetSkipped drops id from every member's list (it was destroyed).
func (g *Group) forgetSkipped(id object.Identity) {
	k := id.Key()
	g.skipMu.Lock()
	defer g.skipMu.Unlock()
	for _, byID := range g.skipped {
		delete(byID, k)
	}
}

// clearSkipped empties member name's list (it was just caught up: a plan
// speaks for it now).
func (g *Group) clearSkipped(name string) {
	g.skipMu.Lock()
	delete(g.skipped, name)
	g.skipMu.Unlock()
}

// Unreplicated returns the objects made or changed through the group
// since member name was last caught up that it did not receive because it
// lacks a mechanism (see MechWrapPad), oldest first.
func (g *Group) Unreplicated(name string) []Unreplicated {
	g.skipMu.Lock()
	defer g.skipMu.Unlock()
	out := make([]Unreplicated, 0, len(g.skipped[name]))
	for _, s := range g.skipped[name] {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Unreplicated) int { return a.Time.Compare(b.Time) })
	return out
}

// CannotHold names the kinds of key member name's token was last probed
// unable to hold although it offers the wrap mechanism (e.g. "EdDSA
// keys"): what its keys_unholdable event said, for status. Nil for a
// member that holds every kind, lacks the mechanism (a missing
// mechanism, reported as such) or is not in the group.
func (g *Group) CannotHold(name string) []string {
	m, ok := g.Member(name)
	if !ok {
		return nil
	}
	c := g.capability(m)
	if !c.Mechanism && !byPairOnly(m) {
		return nil
	}
	var names []string
	if c.Mechanism {
		for _, k := range c.Unholdable() {
			names = append(names, k.String()+"s")
		}
	}
	// What no proven way carries to it from a member of another make
	// (capability.go).
	for _, o := range g.view().members {
		v, ok := g.pairs.Load(pairKey(o.Name(), name))
		if !ok || o.Name() == name {
			continue
		}
		for _, k := range pairLacks(v.(hasync.PairWays)) {
			names = append(names, fmt.Sprintf("%ss from %s (no proven way)", pairKindName(k), o.Name()))
		}
	}
	return names
}

// WriteMark returns a number that changes whenever an object is created,
// destroyed or changed through the group. A caller that lists the members
// (a catch-up) reads it first; if it has moved by the time the caller
// holds the write barrier, something happened that the listing may have
// missed.
func (g *Group) WriteMark() uint64 { return g.writeMark.Load() }

// HoldWrites closes the write barrier: it waits (bounded by ctx) for the
// object creations, destructions and attribute changes in progress to
// end, and holds new ones back until release is called. Signing and every
// other operation go on. One holder at a time; release is idempotent.
// Recovery holds it for the final catch-up and activation of a member, so
// that nothing made through the group between the last listing and the
// member's return to rotation is missed.
func (g *Group) HoldWrites(ctx context.Context) (release func(), err error) {
	if err := g.writes.Hold(ctx); err != nil {
		return nil, fmt.Errorf("group %s: hold writes: %w", g.label, err)
	}
	var once sync.Once
	return func() { once.Do(g.writes.Release) }, nil
}

// beginWrite passes the write barrier for one object change; the returned
// func ends it and moves WriteMark.
func (g *Group) beginWrite(ctx context.Context, op string) (func(), error) {
	if err := g.writes.Enter(ctx); err != nil {
		return nil, opErr(op, "", err)
	}
	return func() {
		g.writeMark.Add(1)
		// Before leaving: a catch-up under the barrier then finds the
		// marks of every change made before it.
		g.markMissed(ctx)
		g.writes.Leave()
	}, nil
}

// SetOrder changes the configured order of the members to names (every
// member once). The order decides the primary: the first active member.
func (g *Group) SetOrder(names []string) error {
	g.memberMu.Lock()
	defer g.memberMu.Unlock()
	r := g.view()
	if len(names) != len(r.members) {
		return fmt.Errorf("group %s: SetOrder: %d names for %d members", g.label, len(names), len(r.members))
	}
	nr := r.clone()
	nr.members = nr.members[:0]
	seen := map[string]bool{}
	for _, n := range names {
		m, ok := r.byName[n]
		if !ok || seen[n] {
			return fmt.Errorf("group %s: SetOrder: %q is not a member, or is named twice", g.label, n)
		}
		seen[n] = true
		nr.members = append(nr.members, m)
	}
	g.roster.Store(nr)
	return nil
}
