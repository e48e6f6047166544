package slot

import (
	"context"
	"fmt"
	"time"

	"github.com/miekg/pkcs11"
)

// Session is a dedicated physical session: the same single-part operations
// as Slot (same signatures: FindObjects … GenerateRandom) plus multi-part
// ones. Not safe for concurrent use. A clear health error (or a call
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

// SignInit starts a multi-part signature.
func (ss *Session) SignInit(ctx context.Context, m *pkcs11.Mechanism, key pkcs11.ObjectHandle) error {
	if err := checkMech(ss.member(), OpSignInit, m); err != nil {
		return err
	}
	return ss.call(ctx, OpSignInit, false, func(x *sess) error { return x.ctx.SignInit(x.h, mechs(m), key) })
}

// SignUpdate feeds data to the signature.
func (ss *Session) SignUpdate(ctx context.Context, data []byte) error {
	return ss.call(ctx, OpSignUpdate, false, func(x *sess) error { return x.ctx.SignUpdate(x.h, data) })
}

// SignFinal finishes the signature and returns it.
func (ss *Session) SignFinal(ctx context.Context) ([]byte, error) {
	return result(ctx, ss.operations, OpSignFinal, false, func(x *sess) ([]byte, error) { return x.ctx.SignFinal(x.h) })
}

// VerifyInit starts a multi-part verification.
func (ss *Session) VerifyInit(ctx context.Context, m *pkcs11.Mechanism, key pkcs11.ObjectHandle) error {
	if err := checkMech(ss.member(), OpVerifyInit, m); err != nil {
		return err
	}
	return ss.call(ctx, OpVerifyInit, false, func(x *sess) error { return x.ctx.VerifyInit(x.h, mechs(m), key) })
}

// VerifyUpdate feeds data to the verification.
func (ss *Session) VerifyUpdate(ctx context.Context, data []byte) error {
	return ss.call(ctx, OpVerifyUpdate, false, func(x *sess) error { return x.ctx.VerifyUpdate(x.h, data) })
}

// VerifyFinal checks sig; a bad signature is CKR_SIGNATURE_INVALID.
func (ss *Session) VerifyFinal(ctx context.Context, sig []byte) error {
	return ss.call(ctx, OpVerifyFinal, false, func(x *sess) error { return x.ctx.VerifyFinal(x.h, sig) })
}

// EncryptInit starts a multi-part encryption.
func (ss *Session) EncryptInit(ctx context.Context, m *pkcs11.Mechanism, key pkcs11.ObjectHandle) error {
	if err := checkMech(ss.member(), OpEncryptInit, m); err != nil {
		return err
	}
	return ss.call(ctx, OpEncryptInit, false, func(x *sess) error { return x.ctx.EncryptInit(x.h, mechs(m), key) })
}

// EncryptUpdate encrypts a part and returns what output it yields.
func (ss *Session) EncryptUpdate(ctx context.Context, data []byte) ([]byte, error) {
	return result(ctx, ss.operations, OpEncryptUpdate, false, func(x *sess) ([]byte, error) { return x.ctx.EncryptUpdate(x.h, data) })
}

// EncryptFinal finishes the encryption and returns the last output.
func (ss *Session) EncryptFinal(ctx context.Context) ([]byte, error) {
	return result(ctx, ss.operations, OpEncryptFinal, false, func(x *sess) ([]byte, error) { return x.ctx.EncryptFinal(x.h) })
}

// DecryptInit starts a multi-part decryption.
func (ss *Session) DecryptInit(ctx context.Context, m *pkcs11.Mechanism, key pkcs11.ObjectHandle) error {
	if err := checkMech(ss.member(), OpDecryptInit, m); err != nil {
		return err
	}
	return ss.call(ctx, OpDecryptInit, false, func(x *sess) error { return x.ctx.DecryptInit(x.h, mechs(m), key) })
}

// DecryptUpdate decrypts a part and returns what output it yields.
func (ss *Session) DecryptUpdate(ctx context.Context, data []byte) ([]byte, error) {
	return result(ctx, ss.operations, OpDecryptUpdate, false, func(x *sess) ([]byte, error) { return x.ctx.DecryptUpdate(x.h, data) })
}

// DecryptFinal finishes the decryption and returns the last output.
func (ss *Session) DecryptFinal(ctx context.Context) ([]byte, error) {
	return result(ctx, ss.operations, OpDecryptFinal, false, func(x *sess) ([]byte, error) { return x.ctx.DecryptFinal(x.h) })
}

// DigestInit starts a multi-part digest.
func (ss *Session) DigestInit(ctx context.Context, m *pkcs11.Mechanism) error {
	if err := checkMech(ss.member(), OpDigestInit, m); err != nil {
		return err
	}
	return ss.call(ctx, OpDigestInit, false, func(x *sess) error { return x.ctx.DigestInit(x.h, mechs(m)) })
}

// DigestUpdate feeds data to the digest.
func (ss *Session) DigestUpdate(ctx context.Context, data []byte) error {
	return ss.call(ctx, OpDigestUpdate, false, func(x *sess) error { return x.ctx.DigestUpdate(x.h, data) })
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

// DigestFinal finishes the digest and returns it.
func (ss *Session) DigestFinal(ctx context.Context) ([]byte, error) {
	return result(ctx, ss.operations, OpDigestFinal, false, func(x *sess) ([]byte, error) { return x.ctx.DigestFinal(x.h) })
}
