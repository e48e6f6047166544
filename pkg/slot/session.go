package slot

import (
	"context"
	"fmt"
	"time"

	"github.com/miekg/pkcs11"
)

// Session is a dedicated physical session: the operations of a Slot (its
// embedded operations: FindObjects … GenerateRandom) plus multi-part ones
// (Init, Update, Final). Not safe for concurrent use. A clear health error (or a call
// abandoned at its deadline) marks it broken: later calls fail with ErrSessionLost and
// Close discards it. After the Slot's Reinit it is lost as well.
type Session struct {
	operations
	s      *Slot
	x      *sess
	gen    uint64
	broken error
	closed bool
}

func (ss *Session) callWith(ctx context.Context, op Op, t time.Duration, fn func(*sess) error, a *shotArgs) error {
	s := ss.s
	if ss.closed {
		return &Error{Member: s.spec.Name, Op: op, Err: ErrClosed}
	}
	if ss.broken != nil {
		return &Error{Member: s.spec.Name, Op: op, Err: fmt.Errorf("%w (%w): broken by an earlier error: %v", ErrSessionLost, ErrNotSent, ss.broken)}
	}
	err := ss.run(ctx, op, t, fn, a)
	if s.loginLost(err) {
		s.checkLogin(ctx)
	}
	return err
}

// run makes the call inside the slot's gate, so that Reinit and Close never
// finalize or close under it.
func (ss *Session) run(ctx context.Context, op Op, timeout time.Duration, fn func(*sess) error, a *shotArgs) error {
	s := ss.s
	if err := s.gate.enter(ctx); err != nil {
		return &Error{Member: s.spec.Name, Op: op, Err: err}
	}
	defer s.gate.leave()
	if s.closed.Load() {
		return &Error{Member: s.spec.Name, Op: op, Err: ErrClosed}
	}
	if s.st.Load().gen != ss.gen {
		ss.broken = ErrSessionLost
		return &Error{Member: s.spec.Name, Op: op, Err: fmt.Errorf("%w: the slot was re-initialised since the session was opened", ErrSessionLost)}
	}
	err := ss.x.runWith(ctx, op, timeout, fn, a)
	// An ambiguous answer (CKR_GENERAL_ERROR to a request the token
	// dislikes) leaves the session usable, as on a bare token.
	if ss.x.dead || ClassOf(err) == ClassHealth && !Ambiguous(err) {
		ss.broken = err
	}
	return err
}

// Close closes the session, or discards it when it is broken or lost.
// Closing twice is harmless.
func (ss *Session) Close() error {
	if ss.closed {
		return nil
	}
	ss.closed = true
	s := ss.s
	_ = s.gate.enter(context.Background())
	defer s.gate.leave()
	s.dmu.Lock()
	_, mine := s.dedicated[ss]
	delete(s.dedicated, ss)
	s.dmu.Unlock()
	if mine {
		ss.x.retire(s.cmdTimeout)
	}
	return nil
}

// Init starts the multi-part operation k with m and key (none for a
// digest).
func (ss *Session) Init(ctx context.Context, k Kind, m *pkcs11.Mechanism, key pkcs11.ObjectHandle) error {
	op := kinds[k].init
	if err := checkMech(ss.member(), op, m); err != nil {
		return err
	}
	return ss.call(ctx, op, false, func(x *sess) error { return x.initOp(k, m, key) })
}

// Initialized makes k's single-part call (C_Sign …) in an operation the
// application started with its own Init on this session: unlike Single,
// it sends no Init, so an Init error reached the application at its Init
// call, as on a bare token. For KindVerify, sig is the signature and the
// output nil.
func (ss *Session) Initialized(ctx context.Context, k Kind, in, sig []byte) ([]byte, error) {
	return result(ctx, ss.operations, kinds[k].op, false, func(x *sess) ([]byte, error) { return x.singleOp(k, in, sig) })
}

// Update feeds in to the multi-part operation k and returns the output it
// yields (none for a signature, a verification or a digest).
func (ss *Session) Update(ctx context.Context, k Kind, in []byte) ([]byte, error) {
	return result(ctx, ss.operations, kinds[k].update, false, func(x *sess) ([]byte, error) { return x.updateOp(k, in) })
}

// Final ends the multi-part operation k and returns its last output (the
// signature, the digest). For KindVerify it checks sig: a bad signature
// is CKR_SIGNATURE_INVALID.
func (ss *Session) Final(ctx context.Context, k Kind, sig []byte) ([]byte, error) {
	return result(ctx, ss.operations, kinds[k].final, false, func(x *sess) ([]byte, error) { return x.finalOp(k, sig) })
}

// keyDigester is a module that can digest a key's value (miekg's context
// and pkg/remote's client can).
type keyDigester interface {
	DigestKey(sh pkcs11.SessionHandle, key pkcs11.ObjectHandle) error
}

// DigestKey feeds the value of key to the digest; a module
// that cannot carry it answers CKR_FUNCTION_NOT_SUPPORTED.
func (ss *Session) DigestKey(ctx context.Context, key pkcs11.ObjectHandle) error {
	return ss.call(ctx, OpDigestKey, false, func(x *sess) error {
		dk, ok := x.ctx.(keyDigester)
		if !ok {
			return pkcs11.Error(pkcs11.CKR_FUNCTION_NOT_SUPPORTED)
		}
		return dk.DigestKey(x.h, key)
	})
}
