// Package login is the virtual slot's login and the rules for logging its
// members in: the application's PIN is proved on one member before any
// other sees it, and that member's refusal is final; a member with its own
// PIN source logs in as CKU_USER with it, the others with the
// application's PIN, which is kept while logged in only when some member
// needs it; a member whose token refused a PIN is not offered one again
// while the Guard blocks it. pkg/group supplies the member calls
// (Members) and decides when to log in.
package login

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// Guard remembers the members whose token refused the PIN they were
// logged in with (pkg/group's PINGuard). Nil: no guard.
type Guard interface {
	Blocked(member string) error
	Refused(member string, err error)
}

// Members is what a login asks of the group's members.
type Members struct {
	// OwnPIN returns m's own PIN source, nil when it has none.
	OwnPIN func(m *member.Member) func() (secret.PIN, error)
	// Login makes the one C_Login of m, charging m's health as any call
	// would; CKR_USER_ALREADY_LOGGED_IN is success.
	Login func(ctx context.Context, m *member.Member, userType uint, pin secret.PIN) error
	// Fail takes m out of rotation for err.
	Fail func(m *member.Member, err error)
}

// ErrNoPIN is the error for a member that has no PIN source while the
// application's PIN is not known.
var ErrNoPIN = errors.New("no PIN for this member: it has no pin source and the application's PIN is not known")

// ErrNoMember is wrapped when no member answered the PIN's proof.
var ErrNoMember = errors.New("no member to check the PIN on")

// RefusedError is a member's final answer to the PIN's proof.
type RefusedError struct {
	Member string
	Err    error
}

func (e *RefusedError) Error() string { return e.Member + ": " + e.Err.Error() }
func (e *RefusedError) Unwrap() error { return e.Err }

// State is the virtual slot's login. Every method but LoggedIn and Lost
// wants the lock held (Lock): a login, a logout and a member's return to
// rotation do not overlap.
type State struct {
	mu       sync.Mutex
	userType atomic.Int64 // -1: logged out; otherwise CKU_USER / CKU_SO
	pin      secret.PIN   // the application's, kept while a member needs it; zeroed on logout and close
	guard    Guard
	ms       Members
}

// New returns a logged-out state.
func New(guard Guard, ms Members) *State {
	s := &State{guard: guard, ms: ms}
	s.userType.Store(-1)
	return s
}

// Lock takes the login lock.
func (s *State) Lock() { s.mu.Lock() }

// Unlock lets the login lock go.
func (s *State) Unlock() { s.mu.Unlock() }

// LoggedIn reports whether the slot is logged in, and as whom.
func (s *State) LoggedIn() (userType uint, ok bool) {
	ut := s.userType.Load()
	if ut < 0 {
		return 0, false
	}
	return uint(ut), true
}

// Set records the login as userType. The application's pin is kept (a
// copy) when proved is set and some member of all needs it after a
// recovery.
func (s *State) Set(userType uint, pin secret.PIN, proved bool, all []*member.Member) {
	s.ForgetPIN()
	if proved && s.needsAppPIN(all, userType) {
		s.pin = pin.Clone()
	}
	s.userType.Store(int64(userType))
}

// Clear ends the login and zeroes the kept PIN.
func (s *State) Clear() {
	s.userType.Store(-1)
	s.ForgetPIN()
}

// Lost ends the login without the lock (every member failed in
// activeBasic); the kept PIN stays until ForgetPIN.
func (s *State) Lost() { s.userType.Store(-1) }

// KeepsPIN reports whether the application's PIN is kept.
func (s *State) KeepsPIN() bool { return !s.pin.Empty() }

// ForgetPIN zeroes the kept PIN.
func (s *State) ForgetPIN() {
	s.pin.Zero()
	s.pin = secret.PIN{}
}

// OwnPIN reports whether m logs in as userType with its own PIN source.
func (s *State) OwnPIN(m *member.Member, userType uint) bool {
	return userType == pkcs11.CKU_USER && s.ms.OwnPIN(m) != nil
}

// needsAppPIN reports whether some member of ms logs in as userType with
// the application's PIN rather than its own.
func (s *State) needsAppPIN(ms []*member.Member, userType uint) bool {
	return slices.ContainsFunc(ms, func(m *member.Member) bool { return !s.OwnPIN(m, userType) })
}

// Prove logs one member of ms in with the application's pin and returns
// it. Members without a PIN source of their own are asked first: they are
// the ones that need the application's PIN, and where members hold
// different PINs the application knows theirs. A member the guard blocks
// is passed over (nothing is sent to it); a member that fails for a clear
// health reason is failed and the next one asked; any other answer is
// final (a *RefusedError). An ambiguous answer passes the proof on too, but
// fails the member only once another member proves the PIN (the rule,
// member.Charged): when every member that answered answered so, it is the
// token's answer to the request, returned as a *RefusedError, and no
// member is failed.
func (s *State) Prove(ctx context.Context, ms []*member.Member, userType uint, pin secret.PIN) (*member.Member, error) {
	order := make([]*member.Member, 0, len(ms))
	for _, own := range []bool{false, true} {
		for _, m := range ms {
			if s.OwnPIN(m, userType) == own {
				order = append(order, m)
			}
		}
	}
	var lastErr error
	var v member.Verdict
	for _, m := range order {
		if err := s.blocked(m); err != nil {
			lastErr = err
			s.ms.Fail(m, err)
			continue
		}
		err := s.ms.Login(ctx, m, userType, pin)
		switch {
		case err == nil:
			v.Served(s.ms.Fail)
			return m, nil
		case slot.ClassOf(err) != slot.ClassHealth || ctx.Err() != nil:
			return nil, &RefusedError{Member: m.Name(), Err: err}
		}
		if v.Health(m, err, true) {
			s.ms.Fail(m, err)
		}
		lastErr = err
	}
	if m, err := v.Unserved(); err != nil {
		return nil, &RefusedError{Member: m.Name(), Err: err}
	}
	if lastErr == nil {
		return nil, ErrNoMember
	}
	return nil, lastErr
}

// LoginAll logs ms in (see Member) at once, fails those that do not log
// in, and returns how many did and the last error. served says another
// member already took the same login (the PIN's proof). An ambiguous
// answer fails a member by the rule (member.Charged) only when served or
// another of ms logged in; when none did and every answer was so, it is
// the token's answer, returned as a *RefusedError, and nobody is failed.
func (s *State) LoginAll(ctx context.Context, ms []*member.Member, userType uint, pin secret.PIN, served bool) (int, error) {
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() { errs[i] = s.Member(ctx, m, userType, pin) })
	}
	wg.Wait()
	logged := 0
	var lastErr error
	var v member.Verdict
	for i, err := range errs {
		switch {
		case err == nil:
			logged++
			continue
		case slot.ClassOf(err) == slot.ClassHealth:
			if v.Health(ms[i], err, true) {
				s.ms.Fail(ms[i], err)
			}
		default:
			s.ms.Fail(ms[i], err) // a member that cannot log in cannot serve
		}
		lastErr = err
	}
	if served || logged > 0 {
		v.Served(s.ms.Fail)
	} else if m, err := v.Unserved(); err != nil {
		return 0, &RefusedError{Member: m.Name(), Err: err}
	}
	return logged, lastErr
}

// Relogin logs m in as the slot is logged in, with the kept PIN where m
// has no source of its own (see Member).
func (s *State) Relogin(ctx context.Context, m *member.Member, userType uint) error {
	return s.Member(ctx, m, userType, s.pin)
}

// Member logs m in by itself, as the engine does after the PIN was
// proved, on a recovery and on a lost login: with its own PIN source, or
// else pin (the application's). A member the guard blocks is not asked; a
// token that refuses the PIN is reported to the guard, so that no process
// offers it again until an operator recovers the member.
func (s *State) Member(ctx context.Context, m *member.Member, userType uint, pin secret.PIN) error {
	if err := s.blocked(m); err != nil {
		return err
	}
	if s.OwnPIN(m, userType) {
		own, err := s.ms.OwnPIN(m)()
		if err != nil {
			return err
		}
		defer own.Zero()
		pin = own
	} else if pin.Empty() {
		return ErrNoPIN
	}
	err := s.ms.Login(ctx, m, userType, pin)
	if slot.PINRefused(err) && s.guard != nil {
		s.guard.Refused(m.Name(), err)
	}
	return err
}

// blocked returns why the guard keeps m from being logged in, or nil.
func (s *State) blocked(m *member.Member) error {
	if s.guard == nil {
		return nil
	}
	return s.guard.Blocked(m.Name())
}
