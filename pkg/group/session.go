package group

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/hagroup/hagroup/pkg/group/login"
	"github.com/hagroup/hagroup/pkg/group/opstate"
	"github.com/hagroup/hagroup/pkg/group/vtable"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// SessionHandle is a virtual session handle: stable for the life of the
// process, never reused, never 0.
type SessionHandle uint

type physSession struct {
	s     *slot.Session
	epoch uint64
}

// Session is a virtual session. Its physical sessions are opened lazily:
// one per member to hold the session objects made in it, and one per
// multi-part operation on the member it is pinned to. Single-part work
// uses the members' session pools. A Session is safe for concurrent use,
// but PKCS#11 operations in one session are sequential by nature.
type Session struct {
	g     *Group
	h     SessionHandle
	flags uint
	gen   uint64 // Group.sessGen at open: a different one means the session was lost

	mu      sync.Mutex
	closed  bool
	lost    bool          // closed because every member failed (activeBasic)
	phys    []physSession // by member index; grows with the group
	ops     opstate.Table[placement, vtable.Object]
	objects map[ObjectHandle]*vtable.Object // session objects made in this session
}

// OpenSession opens a virtual session. flags are the PKCS#11 session flags
// (CKF_SERIAL_SESSION, CKF_RW_SESSION); they are kept for State and
// checked by the PKCS#11 module.
func (g *Group) OpenSession(ctx context.Context, flags uint) (*Session, error) {
	if err := g.gate.Enter(); err != nil {
		return nil, err
	}
	defer g.gate.Leave()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := &Session{
		g:       g,
		h:       SessionHandle(g.nextSess.Add(1)),
		flags:   flags,
		gen:     g.sessGen.Load(),
		objects: make(map[ObjectHandle]*vtable.Object),
	}
	g.sessMu.Lock()
	g.sessions[s.h] = s
	g.sessMu.Unlock()
	return s, nil
}

// Session returns the open virtual session with handle h.
func (g *Group) Session(h SessionHandle) (*Session, error) {
	g.sessMu.Lock()
	s := g.sessions[h]
	g.sessMu.Unlock()
	if s == nil {
		return nil, wrap(ErrSessionHandle, "Session", "", nil)
	}
	return s, nil
}

// CloseAllSessions closes every virtual session.
func (g *Group) CloseAllSessions() {
	for _, s := range g.allSessions() {
		s.close()
	}
}

// allSessions returns the open virtual sessions.
func (g *Group) allSessions() []*Session {
	g.sessMu.Lock()
	defer g.sessMu.Unlock()
	all := make([]*Session, 0, len(g.sessions))
	for _, s := range g.sessions {
		all = append(all, s)
	}
	return all
}

// Handle returns the session's virtual handle.
func (s *Session) Handle() SessionHandle { return s.h }

// State returns the PKCS#11 session state (CKS_RO_PUBLIC_SESSION …) from
// the session's flags and the group's login.
func (s *Session) State() uint {
	rw := s.flags&pkcs11.CKF_RW_SESSION != 0
	ut, in := s.g.LoggedIn()
	switch {
	case in && ut == pkcs11.CKU_SO:
		return pkcs11.CKS_RW_SO_FUNCTIONS
	case in && rw:
		return pkcs11.CKS_RW_USER_FUNCTIONS
	case in:
		return pkcs11.CKS_RO_USER_FUNCTIONS
	case rw:
		return pkcs11.CKS_RW_PUBLIC_SESSION
	}
	return pkcs11.CKS_RO_PUBLIC_SESSION
}

// Close ends the session's operations, destroys its session objects on
// every member (by closing the physical sessions that hold them) and
// invalidates its handle. Closing a session lost when every member failed
// (activeBasic) succeeds.
func (s *Session) Close() error {
	if !s.close() {
		s.mu.Lock()
		lost := s.lost
		s.mu.Unlock()
		if lost {
			return nil
		}
		return wrap(ErrSessionHandle, "CloseSession", "", nil)
	}
	return nil
}

func (s *Session) close() bool {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return false
	}
	s.closed = true
	s.ops.EndAll((*opRunner)(s))
	for _, o := range s.objects {
		s.g.objs.Remove(o)
	}
	s.objects = nil
	for i := range s.phys {
		if s.phys[i].s != nil {
			s.phys[i].s.Close()
			s.phys[i] = physSession{}
		}
	}
	s.mu.Unlock()
	s.g.sessMu.Lock()
	delete(s.g.sessions, s.h)
	s.g.sessMu.Unlock()
	return true
}

// physSession returns the session on m that holds this virtual session's
// session objects, opening it on first use (and again after the member
// was re-opened, when the old one and its objects are gone). s.mu held.
func (s *Session) physSession(ctx context.Context, m *member.Member) (*slot.Session, error) {
	i, ep := m.Index(), m.Epoch()
	if i >= len(s.phys) {
		s.phys = append(s.phys, make([]physSession, i+1-len(s.phys))...)
	}
	if p := s.phys[i]; p.s != nil && p.epoch == ep {
		return p.s, nil
	}
	if p := s.phys[i]; p.s != nil {
		p.s.Close()
		s.phys[i] = physSession{}
	}
	var ps *slot.Session
	if _, err := s.g.call(ctx, m, func() (err error) {
		ps, err = m.Slot().OpenSession(ctx)
		return err
	}); err != nil {
		return nil, err
	}
	s.phys[i] = physSession{s: ps, epoch: ep}
	return ps, nil
}

// dropPhysicalSessions forgets every virtual session's physical sessions
// on m (called when m is re-opened: they died with it).
func (g *Group) dropPhysicalSessions(m *member.Member) {
	i := m.Index()
	for _, s := range g.allSessions() {
		s.mu.Lock()
		if i < len(s.phys) && s.phys[i].s != nil {
			s.phys[i].s.Close()
			s.phys[i] = physSession{}
		}
		s.mu.Unlock()
	}
}

// Check returns ErrSessionHandle (CKR_SESSION_HANDLE_INVALID) when the
// session is closed or was lost when every member failed in activeBasic,
// and nil otherwise: for a PKCS#11 module that runs a session's calls
// other than operations (attributes, wrapping, random) on the Group.
func (s *Session) Check() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.checkOpen("Session")
}

// checkOpen refuses a closed session, and one lost when every member
// failed in activeBasic. s.mu held.
func (s *Session) checkOpen(op string) error {
	if s.closed {
		return wrap(ErrSessionHandle, op, "", nil)
	}
	if s.gen != s.g.sessGen.Load() {
		return wrap(ErrSessionHandle, op, "", errors.New("session lost when every member failed (recovery mode activeBasic): open a new session and log in again"))
	}
	return nil
}

// Login logs the virtual slot in as userType (CKU_USER or CKU_SO) with the
// application's pin, which must prove itself first: it is tried on one
// member only (login.State.Prove says which), and that member's answer is final —
// CKR_PIN_INCORRECT, CKR_PIN_LOCKED, CKR_PIN_EXPIRED or any other refusal
// is returned and reaches no other member, so a wrong PIN costs one try on
// one token, as on a bare token. Only a member that fails for a health
// reason passes the check on to the next. Once the PIN is proved, every
// other serving member is logged in: with its own PIN source (pin_file /
// pin_env) for CKU_USER where it has one, with pin otherwise; a member
// that fails to log in is failed. While logged in the group keeps a copy
// of pin when some member needs it to be logged in after a recovery;
// Logout and Close zero it.
func (g *Group) Login(ctx context.Context, userType uint, pin secret.PIN) error {
	behind, err := g.login(ctx, userType, pin, true)
	g.catchUp(ctx, behind)
	return err
}

// LoginConfigured logs the members in as CKU_USER with their own PIN
// sources only, for a process that serves no application and has no PIN
// of its own to prove (haagent). Members without a source stay logged
// out. It succeeds when at least one member is logged in.
//
// Members found behind are left to automatic recovery (not caught up
// before it returns, as Login does): the agent must answer its socket at
// once, and its recovery loop lives long enough.
func (g *Group) LoginConfigured(ctx context.Context) error {
	_, err := g.login(ctx, pkcs11.CKU_USER, secret.PIN{}, false)
	return err
}

// catchUp hands the members a login found behind to Options.CatchUp, once
// the login's locks are let go (a catch-up logs the member in).
func (g *Group) catchUp(ctx context.Context, names []string) {
	if len(names) > 0 && g.opts.CatchUp != nil {
		g.opts.CatchUp(ctx, names)
	}
}

// login logs the group in (see Login) and returns the members it then
// failed as behind.
func (g *Group) login(ctx context.Context, userType uint, pin secret.PIN, prove bool) ([]string, error) {
	if err := g.gate.Enter(); err != nil {
		return nil, err
	}
	defer g.gate.Leave()
	g.logins.Lock()
	defer g.logins.Unlock()
	if ut, ok := g.logins.LoggedIn(); ok {
		if ut == userType {
			return nil, wrap(ErrAlreadyLoggedIn, "Login", "", nil)
		}
		return nil, wrap(ErrAnotherLoggedIn, "Login", "", nil)
	}
	ms := g.serving()
	if len(ms) == 0 {
		g.ensureActive()
		ms = g.serving()
	}
	var rest []*member.Member
	logged := 0
	if prove {
		checked, err := g.logins.Prove(ctx, ms, userType, pin)
		var refused *login.RefusedError
		switch {
		case errors.As(err, &refused):
			return nil, opErr("Login", refused.Member, refused.Err) // final: no other member sees the PIN
		case err != nil:
			return nil, wrap(ErrNoMember, "Login", "", err)
		}
		logged++
		for _, m := range ms {
			if m != checked {
				rest = append(rest, m)
			}
		}
	} else {
		for _, m := range ms {
			if g.logins.OwnPIN(m, userType) {
				rest = append(rest, m)
			}
		}
	}
	n, lastErr := g.logins.LoginAll(ctx, rest, userType, pin, prove)
	logged += n
	if refused := (*login.RefusedError)(nil); logged == 0 && errors.As(lastErr, &refused) {
		return nil, opErr("Login", refused.Member, refused.Err) // the token's answer: nobody took it
	}
	if logged == 0 {
		if lastErr == nil {
			return nil, wrap(ErrNoMember, "Login", "", errors.New("no member to log in"))
		}
		return nil, wrap(ErrNoMember, "Login", "", lastErr)
	}
	// The PIN is kept only because a member that is (or will be)
	// recovered must be logged in with it.
	g.logins.Set(userType, pin, prove, g.view().members)
	g.proofs.Forget()
	for _, m := range g.view().members {
		m.BumpEpoch() // handles found before the login may not show private objects
	}
	if !prove {
		g.auditDomainKeys(ctx) // the domain key is private: now it can be seen
	}
	return g.admitMembers(ctx), nil // marks are private: readable from now on
}

// relogin logs m in again as the group is logged in (login.State.Relogin),
// the logins' lock held.
func (g *Group) relogin(ctx context.Context, m *member.Member, userType uint) error {
	err := g.logins.Relogin(ctx, m, userType)
	if errors.Is(err, login.ErrNoPIN) {
		return wrap(ErrNotLoggedIn, "Login", m.Name(), err)
	}
	return err
}

// ownPIN is the logins' source of a member's own PIN: its pin_file or
// pin_env.
func (g *Group) ownPIN(m *member.Member) func() (secret.PIN, error) {
	if cm, ok := g.view().cfg[m.Index()]; ok && cm.HasPIN() {
		return cm.ReadPIN
	}
	return nil
}

// loginAs makes the one C_Login of a login of m with pin, charging m's
// health as call does (never failing m for an ambiguous answer: the
// login's rules decide, once they know whether another member took the
// same login). CKR_USER_ALREADY_LOGGED_IN is success.
func (g *Group) loginAs(ctx context.Context, m *member.Member, userType uint, pin secret.PIN) error {
	s := m.Slot()
	_, err := g.call(ctx, m, func() error {
		err := s.Login(ctx, userType, pin)
		if slot.CodeOf(err) == pkcs11.CKR_USER_ALREADY_LOGGED_IN {
			return nil
		}
		return err
	})
	return err
}

// auditDomainKeys audits the domain key of every serving member (each a
// search of its token), reporting a weak one. The agent's login does, so
// that the operator hears of a weak key at once; an application's login
// does not: its process may never wrap or unwrap, and the replicator
// audits a member's key before its first wrap or unwrap in each login
// epoch (docs/DESIGN.md, "The domain key wraps and unwraps").
func (g *Group) auditDomainKeys(ctx context.Context) {
	var wg sync.WaitGroup
	for _, m := range g.serving() {
		wg.Go(func() { _ = g.rep.Audit(ctx, m.Slot()) }) // a weak key is reported; the first copy meets any error again
	}
	wg.Wait()
}

// Logout logs every member out, zeroes the kept PIN and forgets the
// physical handles of private objects.
func (g *Group) Logout(ctx context.Context) error {
	if err := g.gate.Enter(); err != nil {
		return err
	}
	defer g.gate.Leave()
	g.logins.Lock()
	defer g.logins.Unlock()
	if _, ok := g.logins.LoggedIn(); !ok {
		return wrap(ErrNotLoggedIn, "Logout", "", nil)
	}
	g.logins.Clear()
	g.proofs.Forget()
	ms := g.serving()
	errs := make([]error, len(ms))
	fails := make([]bool, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() {
			_, fails[i], errs[i] = g.measure(ctx, m, func() error {
				err := m.Slot().Logout(ctx)
				if slot.CodeOf(err) == pkcs11.CKR_USER_NOT_LOGGED_IN {
					return nil
				}
				return err
			})
		})
	}
	wg.Wait()
	// Every member got the same request: one that logged out serves it.
	var v member.Verdict
	for i, err := range errs {
		if fails[i] && v.Health(ms[i], err, true) {
			g.failMember(ms[i], err)
		}
	}
	if slices.Contains(errs, nil) {
		v.Served(g.failMember)
	}
	for _, m := range g.view().members {
		m.BumpEpoch()
	}
	return nil
}

// LoggedIn reports whether the virtual slot is logged in, and as whom.
func (g *Group) LoggedIn() (userType uint, ok bool) { return g.logins.LoggedIn() }

// SignInit starts a signature with key (see Init).
func (s *Session) SignInit(ctx context.Context, mech *pkcs11.Mechanism, key ObjectHandle) error {
	return s.Init(ctx, OpSign, mech, key)
}

// Sign signs data in one part and ends the operation.
func (s *Session) Sign(ctx context.Context, data []byte) ([]byte, error) {
	return s.Do(ctx, OpSign, StepSingle, data, nil, RoomAny)
}

// DigestKey feeds the value of object key to a multi-part digest, on the
// digest's member (chosen here among those holding the key when nothing
// pinned the digest yet). A handle the group does not know is
// CKR_KEY_HANDLE_INVALID and the digest goes on, as a token's does.
func (s *Session) DigestKey(ctx context.Context, key ObjectHandle) error {
	// Any object the group holds goes to the member, which decides what
	// it digests (SoftHSM digests a data object's value too).
	o, ok := s.g.objs.Get(key)
	if !ok {
		return wrap(ErrKeyHandle, "DigestKey", "", nil)
	}
	if err := s.enter("DigestKey"); err != nil {
		return err
	}
	defer s.leave()
	_, err := s.ops.Do(ctx, (*opRunner)(s), OpDigest, StepUpdate, nil, nil, o, RoomAny)
	return err
}

// GetAttributes is Group.GetAttributes in this session: a session lost
// in activeBasic answers CKR_SESSION_HANDLE_INVALID.
func (s *Session) GetAttributes(ctx context.Context, h ObjectHandle, types []uint) ([]slot.Attribute, error) {
	if err := s.Check(); err != nil {
		return nil, err
	}
	return s.g.GetAttributes(ctx, h, types)
}

// SetAttributes is Group.SetAttributes in this session (see
// GetAttributes).
func (s *Session) SetAttributes(ctx context.Context, h ObjectHandle, attrs []*pkcs11.Attribute) error {
	if err := s.Check(); err != nil {
		return err
	}
	return s.g.SetAttributes(ctx, h, attrs)
}

// WrapKey is Group.WrapKey in this session (see GetAttributes).
func (s *Session) WrapKey(ctx context.Context, mech *pkcs11.Mechanism, wrapping, key ObjectHandle) ([]byte, error) {
	if err := s.Check(); err != nil {
		return nil, err
	}
	return s.g.WrapKey(ctx, mech, wrapping, key)
}

// GenerateRandom is Group.GenerateRandom in this session (see
// GetAttributes).
func (s *Session) GenerateRandom(ctx context.Context, n int) ([]byte, error) {
	if err := s.Check(); err != nil {
		return nil, err
	}
	return s.g.GenerateRandom(ctx, n)
}

// Find is Group.Find, for the PKCS#11 module's FindObjects*: the module
// keeps the cursor over the returned handles.
func (s *Session) Find(ctx context.Context, tmpl []*pkcs11.Attribute) ([]ObjectHandle, error) {
	s.mu.Lock()
	err := s.checkOpen("FindObjects")
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return s.g.Find(ctx, tmpl)
}
