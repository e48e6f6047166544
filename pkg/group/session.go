package group

import (
	"context"
	"errors"
	"sync"

	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// SessionHandle is a virtual session handle: stable for the life of the
// process, never reused, never 0.
type SessionHandle uint

type opKind int

const (
	opSign opKind = iota
	opVerify
	opEncrypt
	opDecrypt
	opDigest
	nKinds
)

var opNames = [nKinds]string{"Sign", "Verify", "Encrypt", "Decrypt", "Digest"}

// mpState is one operation started with *Init. It touches no member until
// the application says whether it is single-part (then it is scheduled
// with failover) or multi-part (then it is pinned to one member on the
// first Update).
type mpState struct {
	mech *pkcs11.Mechanism
	key  *vobject // nil for digest

	m     *member.Member // pinned member; nil until the first Update
	ps    *slot.Session
	epoch uint64
}

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
	ops     [nKinds]*mpState
	objects map[ObjectHandle]*vobject // session objects made in this session
}

// OpenSession opens a virtual session. flags are the PKCS#11 session flags
// (CKF_SERIAL_SESSION, CKF_RW_SESSION); they are kept for SessionState and
// checked by the PKCS#11 module.
func (g *Group) OpenSession(ctx context.Context, flags uint) (*Session, error) {
	if err := g.gate.enter(); err != nil {
		return nil, err
	}
	defer g.gate.leave()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := &Session{
		g:       g,
		h:       SessionHandle(g.nextSess.Add(1)),
		flags:   flags,
		gen:     g.sessGen.Load(),
		objects: make(map[ObjectHandle]*vobject),
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
	g.sessMu.Lock()
	all := make([]*Session, 0, len(g.sessions))
	for _, s := range g.sessions {
		all = append(all, s)
	}
	g.sessMu.Unlock()
	for _, s := range all {
		s.close()
	}
}

// Handle returns the session's virtual handle.
func (s *Session) Handle() SessionHandle { return s.h }

// Flags returns the flags the session was opened with.
func (s *Session) Flags() uint { return s.flags }

// State returns the PKCS#11 session state (CKS_RO_PUBLIC_SESSION …) from
// the session's flags and the group's login.
func (s *Session) State() uint {
	rw := s.flags&pkcs11.CKF_RW_SESSION != 0
	switch ut := s.g.userType.Load(); {
	case ut == int64(pkcs11.CKU_SO):
		return pkcs11.CKS_RW_SO_FUNCTIONS
	case ut >= 0 && rw:
		return pkcs11.CKS_RW_USER_FUNCTIONS
	case ut >= 0:
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
	for k := range s.ops {
		s.endOp(opKind(k))
	}
	for _, o := range s.objects {
		s.g.objs.remove(o)
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
	g.sessMu.Lock()
	all := make([]*Session, 0, len(g.sessions))
	for _, s := range g.sessions {
		all = append(all, s)
	}
	g.sessMu.Unlock()
	i := m.Index()
	for _, s := range all {
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
// and nil otherwise: for a PKCS#11 module that runs single-part
// operations through the Group rather than through the Session.
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
// member only (see proveOn for which), and that member's answer is final —
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
	return g.login(ctx, userType, pin, true)
}

// LoginConfigured logs the members in as CKU_USER with their own PIN
// sources only, for a process that serves no application and has no PIN
// of its own to prove (haagent). Members without a source stay logged
// out. It succeeds when at least one member is logged in.
func (g *Group) LoginConfigured(ctx context.Context) error {
	return g.login(ctx, pkcs11.CKU_USER, secret.PIN{}, false)
}

func (g *Group) login(ctx context.Context, userType uint, pin secret.PIN, prove bool) error {
	if err := g.gate.enter(); err != nil {
		return err
	}
	defer g.gate.leave()
	g.loginMu.Lock()
	defer g.loginMu.Unlock()
	if ut := g.userType.Load(); ut >= 0 {
		if uint(ut) == userType {
			return wrap(ErrAlreadyLoggedIn, "Login", "", nil)
		}
		return wrap(ErrAnotherLoggedIn, "Login", "", nil)
	}
	ms := g.serving()
	if len(ms) == 0 {
		g.ensureActive()
		ms = g.serving()
	}
	var rest []*member.Member
	logged := 0
	if prove {
		checked, err := g.provePIN(ctx, ms, userType, pin)
		if err != nil {
			return err
		}
		logged++
		for _, m := range ms {
			if m != checked {
				rest = append(rest, m)
			}
		}
	} else {
		for _, m := range ms {
			if g.ownPIN(m, userType) {
				rest = append(rest, m)
			}
		}
	}
	n, lastErr := g.loginAll(ctx, rest, userType, pin)
	logged += n
	if logged == 0 {
		if lastErr == nil {
			return wrap(ErrNoMember, "Login", "", errors.New("no member to log in"))
		}
		return wrap(ErrNoMember, "Login", "", lastErr)
	}
	g.appPIN.Zero()
	g.appPIN = secret.PIN{}
	if prove && g.needsAppPIN(userType) {
		// Kept only because a member that is (or will be) recovered must
		// be logged in with it.
		g.appPIN = pin.Clone()
	}
	g.userType.Store(int64(userType))
	for _, m := range g.view().members {
		m.BumpEpoch() // handles found before the login may not show private objects
	}
	return nil
}

// provePIN logs one member of ms in with the application's pin and
// returns it. Members without a PIN source of their own are asked first:
// they are the ones that need the application's PIN, and where members
// hold different PINs the application knows theirs. A member the guard
// blocks is passed over (nothing is sent to it); a member that fails for a
// health reason is failed and the next one asked; any other answer is
// final.
func (g *Group) provePIN(ctx context.Context, ms []*member.Member, userType uint, pin secret.PIN) (*member.Member, error) {
	order := make([]*member.Member, 0, len(ms))
	for _, own := range []bool{false, true} {
		for _, m := range ms {
			if g.ownPIN(m, userType) == own {
				order = append(order, m)
			}
		}
	}
	var lastErr error
	for _, m := range order {
		if err := g.blocked(m); err != nil {
			lastErr = err
			g.failMember(m, err)
			continue
		}
		err := g.loginAs(ctx, m, userType, pin)
		if err == nil {
			return m, nil
		}
		if slot.ClassOf(err) != slot.ClassHealth || ctx.Err() != nil {
			return nil, opErr("Login", m.Name(), err)
		}
		lastErr = err
		g.failMember(m, err)
	}
	if lastErr == nil {
		return nil, wrap(ErrNoMember, "Login", "", errors.New("no member to check the PIN on"))
	}
	return nil, wrap(ErrNoMember, "Login", "", lastErr)
}

// loginAll logs ms in (see loginMember) at once, fails those that do not
// log in, and returns how many did and the last error.
func (g *Group) loginAll(ctx context.Context, ms []*member.Member, userType uint, pin secret.PIN) (int, error) {
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() { errs[i] = g.loginMember(ctx, m, userType, pin) })
	}
	wg.Wait()
	logged := 0
	var lastErr error
	for i, err := range errs {
		if err != nil {
			lastErr = err
			g.failMember(ms[i], err)
			continue
		}
		logged++
	}
	return logged, lastErr
}

// needsAppPIN reports whether some member logs in as userType with the
// application's PIN rather than its own.
func (g *Group) needsAppPIN(userType uint) bool {
	for _, m := range g.view().members {
		if !g.ownPIN(m, userType) {
			return true
		}
	}
	return false
}

// ownPIN reports whether m logs in as userType with its configured PIN.
func (g *Group) ownPIN(m *member.Member, userType uint) bool {
	cm, ok := g.view().cfg[m.Index()]
	return ok && userType == pkcs11.CKU_USER && cm.HasPIN()
}

// loginMember logs m in by itself, as the engine does after the PIN was
// proved, on a recovery and on a lost login: with its own PIN source, or
// else pin (the application's, kept). A member the guard blocks is not
// asked; a token that refuses the PIN is reported to the guard, so that
// no process offers it again until an operator recovers the member.
// loginMu held.
func (g *Group) loginMember(ctx context.Context, m *member.Member, userType uint, pin secret.PIN) error {
	if err := g.blocked(m); err != nil {
		return err
	}
	if g.ownPIN(m, userType) {
		own, err := g.view().cfg[m.Index()].ReadPIN()
		if err != nil {
			return err
		}
		defer own.Zero()
		pin = own
	} else if pin.Empty() {
		return wrap(ErrNotLoggedIn, "Login", m.Name(), errors.New("no PIN for this member: it has no pin source and the application's PIN is not known"))
	}
	err := g.loginAs(ctx, m, userType, pin)
	if slot.PINRefused(err) && g.opts.PINGuard != nil {
		g.opts.PINGuard.Refused(m.Name(), err)
	}
	return err
}

// blocked returns why the guard keeps m from being logged in, or nil.
func (g *Group) blocked(m *member.Member) error {
	if g.opts.PINGuard == nil {
		return nil
	}
	return g.opts.PINGuard.Blocked(m.Name())
}

// loginAs makes the one C_Login of a login of m with pin, charging m's
// health as any call would. CKR_USER_ALREADY_LOGGED_IN is success.
func (g *Group) loginAs(ctx context.Context, m *member.Member, userType uint, pin secret.PIN) error {
	s := m.Slot()
	start := m.Begin()
	err := s.Login(ctx, userType, pin)
	if slot.CodeOf(err) == pkcs11.CKR_USER_ALREADY_LOGGED_IN {
		err = nil
	}
	if out := m.End(start, err); out.Fail {
		g.failMember(m, err)
	}
	if err == nil {
		// The domain key is private: now it can be seen, audit it.
		_ = g.rep.Audit(ctx, s) // a weak key is reported; the first copy meets any error again
	}
	return err
}

// Logout logs every member out, zeroes the kept PIN and forgets the
// physical handles of private objects.
func (g *Group) Logout(ctx context.Context) error {
	if err := g.gate.enter(); err != nil {
		return err
	}
	defer g.gate.leave()
	g.loginMu.Lock()
	defer g.loginMu.Unlock()
	if g.userType.Load() < 0 {
		return wrap(ErrNotLoggedIn, "Logout", "", nil)
	}
	g.userType.Store(-1)
	g.appPIN.Zero()
	g.appPIN = secret.PIN{}
	var wg sync.WaitGroup
	for _, m := range g.serving() {
		wg.Go(func() {
			start := m.Begin()
			err := m.Slot().Logout(ctx)
			if slot.CodeOf(err) == pkcs11.CKR_USER_NOT_LOGGED_IN {
				err = nil
			}
			if out := m.End(start, err); out.Fail {
				g.failMember(m, err)
			}
		})
	}
	wg.Wait()
	for _, m := range g.view().members {
		m.BumpEpoch()
	}
	return nil
}

// LoggedIn reports whether the virtual slot is logged in, and as whom.
func (g *Group) LoggedIn() (userType uint, ok bool) {
	ut := g.userType.Load()
	if ut < 0 {
		return 0, false
	}
	return uint(ut), true
}

// ---- operations: *Init records, single-part schedules, Update pins ----

func (s *Session) initOp(k opKind, mech *pkcs11.Mechanism, key ObjectHandle) error {
	op := opNames[k] + "Init"
	var o *vobject
	if k != opDigest {
		var err error
		if o, err = s.g.key(op, key, argOpKey); err != nil {
			return err
		}
		if err := usable(op, []*vobject{o}); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkOpen(op); err != nil {
		return err
	}
	if s.ops[k] != nil {
		return wrap(ErrOperationActive, op, "", nil)
	}
	s.ops[k] = &mpState{mech: mech, key: o}
	return nil
}

// endOp ends operation k, closing its physical session. s.mu held.
func (s *Session) endOp(k opKind) {
	if op := s.ops[k]; op != nil {
		if op.ps != nil {
			op.ps.Close()
		}
		if op.m != nil {
			op.m.Unpin()
		}
		s.ops[k] = nil
	}
}

// takeSingle ends operation k and returns it for a single-part call.
func (s *Session) takeSingle(k opKind) (*mpState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkOpen(opNames[k]); err != nil {
		return nil, err
	}
	op := s.ops[k]
	if op == nil {
		return nil, wrap(ErrOperationNotInitialized, opNames[k], "", nil)
	}
	pinned := op.m != nil
	s.endOp(k)
	if pinned {
		return nil, wrap(ErrOperationActive, opNames[k], "", errors.New("a multi-part operation is in progress"))
	}
	return op, nil
}

// initOn starts operation op on physical session ps.
func initOn(ctx context.Context, k opKind, ps *slot.Session, mech *pkcs11.Mechanism, key pkcs11.ObjectHandle) error {
	switch k {
	case opSign:
		return ps.SignInit(ctx, mech, key)
	case opVerify:
		return ps.VerifyInit(ctx, mech, key)
	case opEncrypt:
		return ps.EncryptInit(ctx, mech, key)
	case opDecrypt:
		return ps.DecryptInit(ctx, mech, key)
	default:
		return ps.DigestInit(ctx, mech)
	}
}

// step runs one Update (or Final) of operation k. Before the first Update
// succeeded nothing is committed, so the operation is placed with failover
// (init + this step on one member, moving on after a health failure).
// Afterwards it is pinned: if the member fails, the operation ends with
// ErrMemberLost (CKR_DEVICE_ERROR), the member is failed, and the
// application must start again.
func (s *Session) step(ctx context.Context, k opKind, final bool, fn func(ps *slot.Session) ([]byte, error)) ([]byte, error) {
	opName := opNames[k] + "Update"
	if final {
		opName = opNames[k] + "Final"
	}
	return s.stepWith(ctx, k, opName, final, nil, func(ps *slot.Session, _ pkcs11.ObjectHandle) ([]byte, error) { return fn(ps) })
}

// stepWith is step for a call that also names an object (C_DigestKey's
// key): with is resolved on the operation's member, which, when the
// operation is not pinned yet, is one that holds it.
func (s *Session) stepWith(ctx context.Context, k opKind, opName string, final bool, with *vobject,
	fn func(ps *slot.Session, h pkcs11.ObjectHandle) ([]byte, error)) ([]byte, error) {
	g := s.g
	if err := g.gate.enter(); err != nil {
		return nil, err
	}
	defer g.gate.leave()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkOpen(opName); err != nil {
		return nil, err
	}
	op := s.ops[k]
	if op == nil {
		return nil, wrap(ErrOperationNotInitialized, opName, "", nil)
	}
	if op.m != nil {
		m := op.m
		if !m.State().Serving() || m.Epoch() != op.epoch {
			s.endOp(k)
			return nil, wrap(ErrMemberLost, opName, m.Name(), nil)
		}
		var wh pkcs11.ObjectHandle
		if with != nil {
			var err error
			if wh, err = g.resolveHeld(ctx, opName, with, m); err != nil {
				if !errors.Is(err, ErrKeyHandle) {
					s.endOp(k)
				} // else nothing reached the member: its operation goes on, as a token's does after a bad handle
				return nil, err
			}
		}
		var out []byte
		class, err := g.call(ctx, m, func() (err error) {
			out, err = fn(op.ps, wh)
			return err
		})
		switch {
		case err == nil:
			if final {
				s.endOp(k)
			}
			return out, nil
		case class == slot.ClassHealth && ctx.Err() == nil && !slot.Ambiguous(err):
			// (An ambiguous error is the request's while no other member
			// served it: the token's answer, and the member stays.)
			s.endOp(k)
			g.failMember(m, err)
			return nil, wrap(ErrMemberLost, opName, m.Name(), err)
		}
		s.endOp(k)
		return nil, opErr(opName, m.Name(), err)
	}
	// Not placed yet: exec places the Init and this step on one member
	// that holds the key (and with), with failover.
	var objs []*vobject
	for _, o := range [2]*vobject{op.key, with} {
		if o != nil {
			objs = append(objs, o)
		}
	}
	var ps *slot.Session
	var out []byte
	var ep uint64
	m, err := g.exec(ctx, plan{op: opName, objs: objs}, func(ctx context.Context, m *member.Member, sl *slot.Slot, hs []pkcs11.ObjectHandle) (err error) {
		var kh, wh pkcs11.ObjectHandle
		if op.key != nil {
			kh = hs[0]
		}
		if with != nil {
			wh = hs[len(hs)-1]
		}
		ep = m.Epoch()
		if ps, err = sl.OpenSession(ctx); err != nil {
			return err
		}
		if err = initOn(ctx, k, ps, op.mech, kh); err == nil {
			out, err = fn(ps, wh)
		}
		if err != nil {
			ps.Close()
			ps = nil
		}
		return err
	})
	switch {
	case err == nil && final:
		ps.Close()
		s.endOp(k)
	case err == nil:
		op.m, op.ps, op.epoch = m, ps, ep
		m.Pin()
	case op.key == nil && errors.Is(err, ErrKeyHandle):
		// Only with is held nowhere: nothing started, and the operation
		// goes on, as a token's does.
	default:
		s.endOp(k)
	}
	return out, err
}

// SignInit starts a signature with key. Nothing reaches a member until
// Sign (single-part, scheduled with failover) or SignUpdate (multi-part,
// pinned to one member).
func (s *Session) SignInit(ctx context.Context, mech *pkcs11.Mechanism, key ObjectHandle) error {
	return s.initOp(opSign, mech, key)
}

// Sign signs data in one part, with transparent failover, and ends the
// operation.
func (s *Session) Sign(ctx context.Context, data []byte) ([]byte, error) {
	op, err := s.takeSingle(opSign)
	if err != nil {
		return nil, err
	}
	return s.g.sign(ctx, op.mech, op.key, data)
}

// SignUpdate feeds data to a multi-part signature.
func (s *Session) SignUpdate(ctx context.Context, data []byte) error {
	_, err := s.step(ctx, opSign, false, func(ps *slot.Session) ([]byte, error) { return nil, ps.SignUpdate(ctx, data) })
	return err
}

// SignFinal returns the multi-part signature and ends the operation.
func (s *Session) SignFinal(ctx context.Context) ([]byte, error) {
	return s.step(ctx, opSign, true, func(ps *slot.Session) ([]byte, error) { return ps.SignFinal(ctx) })
}

// VerifyInit starts a verification with key (see SignInit).
func (s *Session) VerifyInit(ctx context.Context, mech *pkcs11.Mechanism, key ObjectHandle) error {
	return s.initOp(opVerify, mech, key)
}

// Verify checks sig over data in one part, with failover. A bad signature
// is CKR_SIGNATURE_INVALID, never a failover.
func (s *Session) Verify(ctx context.Context, data, sig []byte) error {
	op, err := s.takeSingle(opVerify)
	if err != nil {
		return err
	}
	return s.g.verify(ctx, op.mech, op.key, data, sig)
}

// VerifyUpdate feeds data to a multi-part verification.
func (s *Session) VerifyUpdate(ctx context.Context, data []byte) error {
	_, err := s.step(ctx, opVerify, false, func(ps *slot.Session) ([]byte, error) { return nil, ps.VerifyUpdate(ctx, data) })
	return err
}

// VerifyFinal checks sig and ends the multi-part verification.
func (s *Session) VerifyFinal(ctx context.Context, sig []byte) error {
	_, err := s.step(ctx, opVerify, true, func(ps *slot.Session) ([]byte, error) { return nil, ps.VerifyFinal(ctx, sig) })
	return err
}

// EncryptInit starts an encryption with key (see SignInit).
func (s *Session) EncryptInit(ctx context.Context, mech *pkcs11.Mechanism, key ObjectHandle) error {
	return s.initOp(opEncrypt, mech, key)
}

// Encrypt encrypts data in one part, with failover.
func (s *Session) Encrypt(ctx context.Context, data []byte) ([]byte, error) {
	op, err := s.takeSingle(opEncrypt)
	if err != nil {
		return nil, err
	}
	return s.g.encrypt(ctx, op.mech, op.key, data)
}

// EncryptUpdate feeds data to a multi-part encryption.
func (s *Session) EncryptUpdate(ctx context.Context, data []byte) ([]byte, error) {
	return s.step(ctx, opEncrypt, false, func(ps *slot.Session) ([]byte, error) { return ps.EncryptUpdate(ctx, data) })
}

// EncryptFinal ends a multi-part encryption.
func (s *Session) EncryptFinal(ctx context.Context) ([]byte, error) {
	return s.step(ctx, opEncrypt, true, func(ps *slot.Session) ([]byte, error) { return ps.EncryptFinal(ctx) })
}

// DecryptInit starts a decryption with key (see SignInit).
func (s *Session) DecryptInit(ctx context.Context, mech *pkcs11.Mechanism, key ObjectHandle) error {
	return s.initOp(opDecrypt, mech, key)
}

// Decrypt decrypts data in one part, with failover.
func (s *Session) Decrypt(ctx context.Context, data []byte) ([]byte, error) {
	op, err := s.takeSingle(opDecrypt)
	if err != nil {
		return nil, err
	}
	return s.g.decrypt(ctx, op.mech, op.key, data)
}

// DecryptUpdate feeds data to a multi-part decryption.
func (s *Session) DecryptUpdate(ctx context.Context, data []byte) ([]byte, error) {
	return s.step(ctx, opDecrypt, false, func(ps *slot.Session) ([]byte, error) { return ps.DecryptUpdate(ctx, data) })
}

// DecryptFinal ends a multi-part decryption.
func (s *Session) DecryptFinal(ctx context.Context) ([]byte, error) {
	return s.step(ctx, opDecrypt, true, func(ps *slot.Session) ([]byte, error) { return ps.DecryptFinal(ctx) })
}

// DigestInit starts a digest.
func (s *Session) DigestInit(ctx context.Context, mech *pkcs11.Mechanism) error {
	return s.initOp(opDigest, mech, 0)
}

// Digest digests data in one part, with failover.
func (s *Session) Digest(ctx context.Context, data []byte) ([]byte, error) {
	op, err := s.takeSingle(opDigest)
	if err != nil {
		return nil, err
	}
	return s.g.Digest(ctx, op.mech, data)
}

// DigestUpdate feeds data to a multi-part digest.
func (s *Session) DigestUpdate(ctx context.Context, data []byte) error {
	_, err := s.step(ctx, opDigest, false, func(ps *slot.Session) ([]byte, error) { return nil, ps.DigestUpdate(ctx, data) })
	return err
}

// DigestKey feeds the value of object key to a multi-part digest, on
// the digest's member (chosen here among those holding the key when this
// is the digest's first step).
func (s *Session) DigestKey(ctx context.Context, key ObjectHandle) error {
	const opName = "DigestKey"
	// Any object the group holds goes to the member, which decides what
	// it digests (SoftHSM digests a data object's value too).
	o, ok := s.g.objs.get(key)
	if !ok {
		return wrap(ErrKeyHandle, opName, "", nil) // a token's digest survives a bad handle too
	}
	_, err := s.stepWith(ctx, opDigest, opName, false, o, func(ps *slot.Session, h pkcs11.ObjectHandle) ([]byte, error) {
		return nil, ps.DigestKey(ctx, h)
	})
	return err
}

// DigestFinal ends a multi-part digest.
func (s *Session) DigestFinal(ctx context.Context) ([]byte, error) {
	return s.step(ctx, opDigest, true, func(ps *slot.Session) ([]byte, error) { return ps.DigestFinal(ctx) })
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
