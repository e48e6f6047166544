package slot

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hagroup/hagroup/internal/initargs"
	"github.com/hagroup/hagroup/internal/tokenquirk"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot/dispatch"
	"github.com/miekg/pkcs11"
)

// Slot is one opened physical token with its session pool. Safe for
// concurrent use.
type Slot struct {
	operations
	spec       Spec // spec.PIN is not kept here (see pin)
	query      tokenQuery
	cmdTimeout time.Duration
	keyTimeout time.Duration
	capacity   int

	mod *module

	// st is what a call needs; replaced by Reinit.
	st atomic.Pointer[slotState]

	gate     gate
	permits  chan struct{} // one per session lent out of the pool
	idle     idlePool      // pooled sessions not lent out
	closed   atomic.Bool
	closedCh chan struct{}

	// mu serialises Login, Logout, re-login, Reinit, Close and OpenSession
	// bookkeeping, and guards the fields below.
	mu        sync.Mutex
	anchor    *sess      // the long-lived session holding the login
	pin       secret.PIN // user PIN kept for re-login; empty after Logout
	loginType int        // loginNone, loginUser, loginSO

	// dmu guards dedicated. It is never held while waiting for the gate.
	dmu       sync.Mutex
	dedicated map[*Session]struct{}

	loggedIn    atomic.Bool
	epoch       atomic.Uint64
	quarantined atomic.Int64 // calls past their deadline still inside the module
	qmu         sync.Mutex
	qchanged    chan struct{} // closed and replaced when a quarantined call ends
	holds       atomic.Int64  // 1 until Close, plus one per quarantined call
	stalls      atomic.Int64  // inline calls past their deadline (dispatch.go)
	dog         watchdog      // over the inline calls (dispatch.go)
	stats       counters
}

const (
	loginNone = iota
	loginUser
	loginSO
)

// slotState is the module context and token slot of one generation.
type slotState struct {
	ctx   p11
	id    uint
	token TokenSummary
	// objects is the token's object lock, nil when the token does not
	// need one (internal/tokenquirk).
	objects *tokenquirk.ObjectLock
	gen     uint64
	inc     uint64 // incarnation of the module context (see module.inc)
	err     error  // the token could not be found again: every call fails with it
}

// counters are the pool's statistics.
type counters struct {
	open             atomic.Int64
	maxOpen          atomic.Int64
	opened           atomic.Uint64
	discarded        atomic.Uint64
	quarantinedTotal atomic.Uint64
	relogins         atomic.Uint64
}

// Stats is a snapshot of a Slot's session pool.
type Stats struct {
	Capacity         int    // pool cap
	Open             int    // pooled sessions open (idle or lent out)
	InUse            int    // pooled sessions lent out (or being opened to be)
	MaxOpen          int    // the most pooled sessions ever open at once
	Quarantined      int    // calls past their deadline still inside the module
	Opened           uint64 // pooled sessions opened, ever
	Discarded        uint64 // pooled sessions closed after an error, ever
	QuarantinedTotal uint64 // calls abandoned at their deadline or ctx, ever
	Relogins         uint64 // automatic logins after the login was found gone
}

// Open loads the module (sharing its context), finds the token, opens the
// long-lived session and logs in when spec.PIN is set.
func Open(ctx context.Context, spec Spec) (*Slot, error) {
	q, err := parseQuery(&spec)
	if spec.Name == "" {
		spec.Name = "(unnamed)"
	}
	if err != nil {
		return nil, &Error{Member: spec.Name, Err: err}
	}
	spec.CommandTimeout = dispatch.CommandTimeout(spec.CommandTimeout)
	spec.KeygenTimeout = dispatch.KeygenTimeout(spec.KeygenTimeout)
	if spec.MaxSessions < 0 {
		return nil, invalid(spec.Name, "", "MaxSessions %d is negative", spec.MaxSessions)
	}
	d, err := dispatch.Parse(string(spec.Dispatch))
	if err != nil {
		return nil, invalid(spec.Name, "", "%v", err)
	}
	spec.Dispatch = d
	pin := spec.PIN.Clone()
	spec.PIN = secret.PIN{}

	if initargs.HoldsPIN(spec.InitArgs, pin.Bytes()) {
		pin.Zero()
		return nil, invalid(spec.Name, "", "its init arguments contain its PIN: a PIN never goes in init arguments (they are shown and passed on command lines)")
	}
	mod, err := modules.acquire(ctx, spec.moduleRef(), initializeTimeout(spec.CommandTimeout))
	if err != nil {
		pin.Zero()
		return nil, newError(spec.Name, "", err)
	}
	s := &Slot{
		spec:       spec,
		query:      q,
		cmdTimeout: spec.CommandTimeout,
		keyTimeout: spec.KeygenTimeout,
		mod:        mod,
		closedCh:   make(chan struct{}),
		dedicated:  make(map[*Session]struct{}),
	}
	s.operations = operations{on: s, run: s.do}
	s.holds.Store(1)
	c := modules.current(mod)
	tok, err := findToken(ctx, &s.spec, q, mod, s.cmdTimeout)
	if err != nil {
		pin.Zero()
		modules.release(mod)
		return nil, err
	}
	s.st.Store(&slotState{ctx: c, id: tok.SlotID, token: tok, objects: mod.objectLock(tok), gen: 1, inc: mod.inc.Load()})

	s.capacity = spec.MaxSessions
	if s.capacity == 0 {
		s.capacity = maxPool
		var ti pkcs11.TokenInfo
		err := callOn(ctx, mod, s.cmdTimeout, func() error {
			v, err := c.GetTokenInfo(tok.SlotID)
			ti = v
			return err
		})
		// ti is read only when the call returned (see single.go).
		if err == nil && ti.MaxRwSessionCount != pkcs11.CK_EFFECTIVELY_INFINITE && ti.MaxRwSessionCount != pkcs11.CK_UNAVAILABLE_INFORMATION {
			// One session of the token's allowance is the anchor.
			s.capacity = max(1, min(int(ti.MaxRwSessionCount)-1, maxPool))
		}
	}
	s.permits = make(chan struct{}, s.capacity)

	s.mu.Lock()
	_, err = s.anchorLocked(ctx)
	if err == nil && !pin.Empty() {
		err = s.loginLocked(ctx, pkcs11.CKU_USER, pin)
	}
	s.mu.Unlock()
	pin.Zero()
	if err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Name returns the member name of the spec.
func (s *Slot) Name() string { return s.spec.Name }

// SlotID returns the PKCS#11 slot ID the token was found on (at Open or the
// last Reinit). Slot IDs are not stable across restarts of a module.
func (s *Slot) SlotID() uint { return s.st.Load().id }

// Token describes the token as found at Open or the last Reinit.
func (s *Slot) Token() TokenSummary { return s.st.Load().token }

// Module returns the module path of the spec.
func (s *Slot) Module() string { return s.spec.Module }

// OwnsContext reports whether the slot has its module context to itself
// (it was loaded for this spec's module env and initialised by us), so that
// Reinit finalizes and initialises it again.
func (s *Slot) OwnsContext() bool { return modules.owns(s.mod) }

// LoggedIn reports whether the user is logged in, as far as the slot knows.
func (s *Slot) LoggedIn() bool { return s.loggedIn.Load() }

// Epoch changes whenever object handles obtained before may have become
// invalid: after a Logout, an automatic re-login, or a Reinit. Callers that
// cache handles compare it and look their objects up again.
func (s *Slot) Epoch() uint64 { return s.epoch.Load() }

// Stats returns a snapshot of the session pool.
func (s *Slot) Stats() Stats {
	return Stats{
		Capacity:         s.capacity,
		Open:             int(s.stats.open.Load()),
		InUse:            len(s.permits),
		MaxOpen:          int(s.stats.maxOpen.Load()),
		Quarantined:      int(s.quarantined.Load()),
		Opened:           s.stats.opened.Load(),
		Discarded:        s.stats.discarded.Load(),
		QuarantinedTotal: s.stats.quarantinedTotal.Load(),
		Relogins:         s.stats.relogins.Load(),
	}
}

// unquarantine forgets a quarantined call that has returned.
func (s *Slot) unquarantine() {
	s.quarantined.Add(-1)
	s.qmu.Lock()
	if s.qchanged != nil {
		close(s.qchanged)
		s.qchanged = nil
	}
	s.qmu.Unlock()
}

// waitQuarantine waits until no call is quarantined, or ctx ends.
func (s *Slot) waitQuarantine(ctx context.Context) error {
	for {
		s.qmu.Lock()
		if s.quarantined.Load() == 0 {
			s.qmu.Unlock()
			return nil
		}
		if s.qchanged == nil {
			s.qchanged = make(chan struct{})
		}
		ch := s.qchanged
		s.qmu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// hold keeps the module context referenced for a quarantined call.
func (s *Slot) hold() { s.holds.Add(1) }

// unhold drops a hold; the last one releases the module context.
func (s *Slot) unhold() {
	if s.holds.Add(-1) == 0 {
		modules.release(s.mod)
	}
}

// anchorLocked returns the long-lived session, opening a new one when there
// is none (or it died); a new anchor restores the user login when the slot
// holds a PIN. Callers hold s.mu.
func (s *Slot) anchorLocked(ctx context.Context) (*sess, error) {
	st := s.st.Load()
	if a := s.anchor; a != nil && !a.dead && a.gen == st.gen {
		return a, nil
	}
	if st.err != nil {
		return nil, st.err
	}
	if s.anchor != nil {
		s.anchor.retire(s.cmdTimeout)
		s.anchor = nil
	}
	a := newSess(s, st)
	if err := a.openOn(ctx, st.id, s.cmdTimeout); err != nil {
		a.retire(s.cmdTimeout)
		return nil, err
	}
	s.anchor = a
	if s.loginType == loginUser && !s.pin.Empty() {
		if err := s.reloginLocked(ctx, a); err != nil {
			return a, err
		}
	}
	return a, nil
}

// anchorCall runs fn on the anchor; a session-fatal error retires it.
// Callers hold s.mu.
func (s *Slot) anchorCall(ctx context.Context, op Op, fn func(*sess) error) error {
	a, err := s.anchorLocked(ctx)
	if err != nil {
		return err
	}
	err = a.runWith(ctx, op, s.cmdTimeout, fn, nil)
	if err != nil && isSessionFatal(err) {
		a.retire(s.cmdTimeout)
		s.anchor = nil
	}
	return err
}

// Login logs userType (CKU_USER or CKU_SO) in; CKR_USER_ALREADY_LOGGED_IN
// is success. The user PIN is kept for Reinit and automatic re-login.
func (s *Slot) Login(ctx context.Context, userType uint, pin secret.PIN) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return &Error{Member: s.spec.Name, Op: OpLogin, Err: ErrClosed}
	}
	return s.loginLocked(ctx, userType, pin)
}

func (s *Slot) loginLocked(ctx context.Context, userType uint, pin secret.PIN) error {
	err := s.retryTorn(ctx, func() error {
		return s.anchorCall(ctx, OpLogin, func(x *sess) error {
			return x.ctx.Login(x.h, userType, pin.Reveal())
		})
	})
	if err != nil {
		if code, ok := codeIn(err); !ok || code != pkcs11.CKR_USER_ALREADY_LOGGED_IN {
			return err
		}
	}
	switch userType {
	case pkcs11.CKU_USER:
		s.pin.Zero()
		s.pin = pin.Clone()
		s.loginType = loginUser
		s.loggedIn.Store(true)
	case pkcs11.CKU_SO:
		s.loginType = loginSO
	}
	return nil
}

// Logout logs out whoever is logged in and forgets the kept user PIN, so the
// slot no longer logs in by itself. Private object handles become invalid
// (Epoch changes). Not being logged in is success.
func (s *Slot) Logout(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return &Error{Member: s.spec.Name, Op: OpLogout, Err: ErrClosed}
	}
	err := s.anchorCall(ctx, OpLogout, func(x *sess) error { return x.ctx.Logout(x.h) })
	if err != nil {
		if code, ok := codeIn(err); !ok || code != pkcs11.CKR_USER_NOT_LOGGED_IN {
			return err
		}
	}
	s.forgetPINLocked()
	s.epoch.Add(1)
	return nil
}

// forgetPINLocked drops the kept user PIN and the login state: the slot no
// longer logs in by itself. Callers hold s.mu.
func (s *Slot) forgetPINLocked() {
	s.pin.Zero()
	s.pin = secret.PIN{}
	s.loginType = loginNone
	s.loggedIn.Store(false)
}

// reloginLocked logs the user in again on anchor a when the token says
// nobody is logged in, and bumps Epoch when it did. Callers hold s.mu.
func (s *Slot) reloginLocked(ctx context.Context, a *sess) error {
	var state uint
	err := a.runWith(ctx, OpSessionInfo, s.cmdTimeout, func(x *sess) error {
		si, err := x.ctx.GetSessionInfo(x.h)
		state = si.State
		return err
	}, nil)
	if err != nil {
		return err
	}
	if state == pkcs11.CKS_RO_USER_FUNCTIONS || state == pkcs11.CKS_RW_USER_FUNCTIONS {
		return nil
	}
	pin := s.pin
	err = s.retryTorn(ctx, func() error {
		return a.runWith(ctx, OpLogin, s.cmdTimeout, func(x *sess) error {
			return x.ctx.Login(x.h, pkcs11.CKU_USER, pin.Reveal())
		}, nil)
	})
	if code, ok := codeIn(err); err != nil && (!ok || code != pkcs11.CKR_USER_ALREADY_LOGGED_IN) {
		s.loggedIn.Store(false)
		if PINRefused(err) {
			// The token no longer takes the kept PIN: forget it, so that
			// no new anchor, Reinit or lost login offers it again.
			s.forgetPINLocked()
		}
		return err
	}
	s.loggedIn.Store(true)
	s.stats.relogins.Add(1)
	s.epoch.Add(1)
	return nil
}

// A token whose C_Login rewrites its store (tokenquirk.LoginRewritesStore:
// SoftHSM) answers a login that reads the store while another process's
// login rewrites it with CKR_GENERAL_ERROR or CKR_USER_PIN_NOT_INITIALIZED
// (forked children that each start a helper log in at once). Such a login
// is asked again, up to tornLoginRetries times, waiting tornLoginWait and
// then twice as long each time: the rewrite is over in milliseconds. No
// other answer is asked again (a PIN refused must not come closer to a
// lockout).
const (
	tornLoginRetries = 4
	tornLoginWait    = 5 * time.Millisecond
)

// retryTorn makes login, and makes it again while its answer is a torn
// store's (see above) and ctx allows.
func (s *Slot) retryTorn(ctx context.Context, login func() error) error {
	err := login()
	wait := tornLoginWait
	for range tornLoginRetries {
		if !s.tornLogin(err) {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait *= 2
		err = login()
	}
	return err
}

// tornLogin reports whether err is a login's answer from a token whose
// store another process's login was rewriting.
func (s *Slot) tornLogin(err error) bool {
	if err == nil {
		return false
	}
	t := s.Token()
	if !tokenquirk.LoginRewritesStore(t.Manufacturer, t.Model) {
		return false
	}
	code, _ := codeIn(err)
	return code == pkcs11.CKR_GENERAL_ERROR || code == pkcs11.CKR_USER_PIN_NOT_INITIALIZED
}

// loginLost reports whether err may mean the user login has gone under us.
func (s *Slot) loginLost(err error) bool {
	if err == nil || !s.loggedIn.Load() {
		return false
	}
	code, ok := codeIn(err)
	return ok && (code == pkcs11.CKR_USER_NOT_LOGGED_IN || code == pkcs11.CKR_OBJECT_HANDLE_INVALID || code == pkcs11.CKR_KEY_HANDLE_INVALID)
}

// checkLogin logs in again if the login has gone (a C_Logout by someone
// else in the process, a token reset). Errors are left for the next call to
// find: the caller already has the error of its own call.
func (s *Slot) checkLogin(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() || s.loginType != loginUser || s.pin.Empty() {
		return
	}
	a, err := s.anchorLocked(ctx) // a new anchor logs in by itself
	if err != nil || a == nil {
		return
	}
	if err := s.reloginLocked(ctx, a); err != nil && isSessionFatal(err) {
		a.retire(s.cmdTimeout)
		s.anchor = nil
	}
}

// Reinit re-initialises the module context when the slot owns it, finds the
// token again, re-opens sessions and logs in again with the kept PIN. It
// waits (bounded by ctx) for calls in flight to finish; calls that started
// before and hang are not waited for. Dedicated Sessions opened before
// return ErrSessionLost from then on. Epoch changes.
func (s *Slot) Reinit(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return &Error{Member: s.spec.Name, Err: ErrClosed}
	}
	if err := s.gate.lock(ctx); err != nil {
		return &Error{Member: s.spec.Name, Err: err}
	}
	defer s.gate.unlock()

	owned := modules.owns(s.mod)
	// A finalized context takes its sessions with it; on a shared context
	// they must be closed one by one.
	s.retireAllLocked(!owned)

	old := s.st.Load()
	next := &slotState{gen: old.gen + 1}
	defer func() {
		s.st.Store(next)
		s.epoch.Add(1)
	}()
	if owned {
		if err := modules.reinit(ctx, s.mod, initializeTimeout(s.cmdTimeout)); err != nil {
			next.ctx, next.inc = old.ctx, s.mod.inc.Load()
			next.err = newError(s.spec.Name, "", err)
			return next.err
		}
	}
	next.ctx = modules.current(s.mod)
	next.inc = s.mod.inc.Load()
	tok, err := findToken(ctx, &s.spec, s.query, s.mod, s.cmdTimeout)
	if err != nil {
		next.err = err
		return err
	}
	next.id, next.token, next.objects = tok.SlotID, tok, s.mod.objectLock(tok)
	s.st.Store(next)
	if _, err := s.anchorLocked(ctx); err != nil {
		return err
	}
	return nil
}

// retireAllLocked retires every session: pooled, anchor and dedicated.
// With closeThem false the sessions are only forgotten (their context is
// about to be finalized). Callers hold s.mu and the gate.
func (s *Slot) retireAllLocked(closeThem bool) {
	var all []*sess
	for x, ok := s.idle.take(); ok; x, ok = s.idle.take() {
		all = append(all, x)
		s.stats.open.Add(-1)
	}
	if s.anchor != nil {
		all = append(all, s.anchor)
		s.anchor = nil
	}
	s.dmu.Lock()
	for ss := range s.dedicated {
		all = append(all, ss.x)
		delete(s.dedicated, ss)
	}
	s.dmu.Unlock()
	var wg sync.WaitGroup
	for _, x := range all {
		if !closeThem {
			x.open = false
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			x.retire(s.cmdTimeout)
		}()
	}
	wg.Wait()
}

// closeWait bounds how long Close waits for calls in flight.
func (s *Slot) closeWait() time.Duration { return s.keyTimeout + time.Second }

// Close closes every session and releases the module context (finalizing it
// after its last user). It waits for calls in flight to finish, each being
// bounded by its own deadline; calls that outlived their deadline are not
// waited for, and the context is released when the last of them returns.
// Later calls fail with ErrClosed. Close is idempotent.
func (s *Slot) Close() error {
	s.mu.Lock()
	if s.closed.Load() {
		s.mu.Unlock()
		return nil
	}
	s.closed.Store(true)
	close(s.closedCh)
	ctx, cancel := context.WithTimeout(context.Background(), s.closeWait())
	locked := s.gate.lock(ctx) == nil
	cancel()
	s.retireAllLocked(!modules.owns(s.mod))
	s.pin.Zero()
	s.pin = secret.PIN{}
	s.loggedIn.Store(false)
	if locked {
		s.gate.unlock()
	}
	s.mu.Unlock()
	s.unhold()
	return nil
}

// OpenSession returns a dedicated session outside the pool, for multi-part
// operations and session objects. Close it when done.
func (s *Slot) OpenSession(ctx context.Context) (*Session, error) {
	if err := s.gate.enter(ctx); err != nil {
		return nil, &Error{Member: s.spec.Name, Op: OpOpenSession, Err: err}
	}
	defer s.gate.leave()
	if s.closed.Load() {
		return nil, &Error{Member: s.spec.Name, Op: OpOpenSession, Err: ErrClosed}
	}
	st := s.st.Load()
	if st.err != nil {
		return nil, st.err
	}
	x := newSess(s, st)
	if err := x.openOn(ctx, st.id, s.cmdTimeout); err != nil {
		x.retire(s.cmdTimeout)
		return nil, err
	}
	ss := &Session{s: s, x: x, gen: st.gen}
	ss.operations = operations{on: s, run: ss.callWith}
	s.dmu.Lock()
	s.dedicated[ss] = struct{}{}
	s.dmu.Unlock()
	return ss, nil
}

// idlePool holds the pooled sessions not lent out, last returned on top: a
// call takes the session used last, whose worker is likely still spinning
// for its next call. Taken in turn (a channel's FIFO), calls would go round
// the pool and find every worker asleep.
type idlePool struct {
	mu sync.Mutex
	xs []*sess
}

func (p *idlePool) put(x *sess) {
	p.mu.Lock()
	p.xs = append(p.xs, x)
	p.mu.Unlock()
}

// take takes the top session.
func (p *idlePool) take() (*sess, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.xs)
	if n == 0 {
		return nil, false
	}
	x := p.xs[n-1]
	p.xs[n-1] = nil
	p.xs = p.xs[:n-1]
	return x, true
}

// borrow takes an idle session of generation st, or opens one. The caller
// holds a permit, so when none is idle every open session is lent out and
// there is room for one more.
func (s *Slot) borrow(ctx context.Context, st *slotState) (*sess, error) {
	for {
		if x, ok := s.idle.take(); ok {
			if x.gen == st.gen && !x.dead {
				return x, nil
			}
			s.discard(x)
			continue
		}
		x := newSess(s, st)
		if err := x.openOn(ctx, st.id, s.cmdTimeout); err != nil {
			x.retire(s.cmdTimeout)
			return nil, err
		}
		n := s.stats.open.Add(1)
		for {
			m := s.stats.maxOpen.Load()
			if n <= m || s.stats.maxOpen.CompareAndSwap(m, n) {
				break
			}
		}
		s.stats.opened.Add(1)
		return x, nil
	}
}

// discard closes a pooled session that must not be reused.
func (s *Slot) discard(x *sess) {
	s.stats.open.Add(-1)
	s.stats.discarded.Add(1)
	x.retire(s.cmdTimeout)
}

// direct runs a call that needs no session (token and mechanism
// information) on s under the command timeout, and returns its result.
//
// The gate is held until the module call itself returns, not only until
// the caller stops waiting: a caller that gives up (deadline, cancelled
// context) must not let Close finalize the module under a call still
// running inside it.
func direct[T any](ctx context.Context, s *Slot, op Op, fn func(st *slotState) (T, error)) (T, error) {
	var zero T
	if err := s.gate.enter(ctx); err != nil {
		return zero, &Error{Member: s.spec.Name, Op: op, Err: err}
	}
	if s.closed.Load() {
		s.gate.leave()
		return zero, &Error{Member: s.spec.Name, Op: op, Err: ErrClosed}
	}
	st := s.st.Load()
	if st.err != nil {
		s.gate.leave()
		return zero, st.err
	}
	if err := ctx.Err(); err != nil {
		s.gate.leave()
		return zero, s.errorOf(op, err)
	}
	if err := s.stalled(op); err != nil {
		s.gate.leave()
		return zero, err
	}
	modules.enter(s.mod) // a call given up on keeps the module initialised (registry.release)
	// out is read only once the call returned it (see result).
	var out T
	err := wait(ctx, s.cmdTimeout, func() error {
		defer s.gate.leave()
		defer modules.left(s.mod)
		return s.spec.intercepted(ctx, op, func() error {
			v, err := fn(st)
			out = v
			return err
		})
	})
	if err != nil {
		return zero, s.errorOf(op, err)
	}
	return out, nil
}
