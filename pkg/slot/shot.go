package slot

import (
	"context"

	"github.com/hagroup/hagroup/internal/p11raw"
	"github.com/miekg/pkcs11"
)

// The single-part calls (an Init and its single-part call, p11raw.OneShot)
// are the hot path of a signer. Under handoff the worker makes them in C
// without coming back to Go (handoff.Cell.Serve): their arguments are
// copied into the session's C memory (p11raw.Shot) before the post and the
// output out of it after the answer, so that a call its caller gave up on
// reads and writes no Go memory. Every other call, and a one-shot the C
// path cannot make (a served token, a mechanism parameter miekg builds, an
// Interceptor to run), is made by Go on the same worker.

// shotArgs is a one-shot call and, once answered, its output.
type shotArgs struct {
	k       p11raw.Kind
	m       *pkcs11.Mechanism
	key     pkcs11.ObjectHandle
	in, sig []byte
	out     []byte
}

// singlePart makes the single-part call a for op on r; made by Go, it is
// goFn, or Verify's when goFn is nil.
func singlePart(ctx context.Context, r runner, op Op, a *shotArgs, goFn func(x *sess, m *pkcs11.Mechanism, key pkcs11.ObjectHandle, in []byte) ([]byte, error)) ([]byte, error) {
	if err := checkMech(r.member(), op, a.m); err != nil {
		return nil, err
	}
	err := r.shot(ctx, op, a, func(x *sess) error {
		if goFn == nil {
			return x.verify(a.m, a.key, a.in, a.sig)
		}
		v, err := goFn(x, a.m, a.key, a.in)
		a.out = v
		return err
	})
	if err != nil {
		return nil, err
	}
	return a.out, nil
}

// setShot copies a into the session's C memory for the worker to make in
// C, and reports whether it can.
func (x *sess) setShot(a *shotArgs) bool {
	mm, ok := x.ctx.(*miekgModule)
	if !ok || mm.fl == nil || !p11raw.PlainMechanism(a.m) || x.owner.spec.Interceptor != nil {
		return false
	}
	x.shot.Set(mm.fl, a.k, x.h, a.m, a.key, a.in, a.sig, x.outHint)
	return true
}

// shotResult is the answered one-shot's output.
func (x *sess) shotResult() ([]byte, error) {
	out, err := x.shot.Result()
	if len(out) > 0 {
		x.outHint = len(out) // the next output of the session is likely as long
	}
	return out, err
}
