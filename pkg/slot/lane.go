package slot

import (
	"context"
	"time"

	"github.com/hagroup/hagroup/internal/p11raw"
	"github.com/miekg/pkcs11"
)

// With Spec.SpinHandoff, a session of an in-process module also gets a
// lane (internal/p11raw): a C thread that makes single-part signatures and
// verifications straight through the module's function list. These are
// the calls an application makes thousands of times a second, and a Go
// worker costs them the runtime's part of every hand-off (a readied
// goroutine, a P changing hands, two cgo transitions on the worker) on top
// of the caller's. Everything else, and every session with an Interceptor
// (whose faults are injected on the Go worker) or of a served token, keeps
// the Go worker. The deadline, the abandoning and the quarantine are the
// same on both.

// laneJob is a call a lane can make, and its result.
type laneJob struct {
	call p11raw.LaneCall
	out  []byte
}

// laneMechanisms are the signature mechanisms whose parameter, if any, is a
// flat structure (no pointers), so that its bytes go through a lane as
// they are. CKM_EDDSA's optional parameter holds a pointer: only without
// one.
var laneMechanisms = map[uint]bool{
	pkcs11.CKM_RSA_PKCS: true, pkcs11.CKM_RSA_X_509: true,
	pkcs11.CKM_SHA1_RSA_PKCS: true, pkcs11.CKM_SHA224_RSA_PKCS: true, pkcs11.CKM_SHA256_RSA_PKCS: true,
	pkcs11.CKM_SHA384_RSA_PKCS: true, pkcs11.CKM_SHA512_RSA_PKCS: true,
	pkcs11.CKM_RSA_PKCS_PSS: true, pkcs11.CKM_SHA1_RSA_PKCS_PSS: true, pkcs11.CKM_SHA224_RSA_PKCS_PSS: true,
	pkcs11.CKM_SHA256_RSA_PKCS_PSS: true, pkcs11.CKM_SHA384_RSA_PKCS_PSS: true, pkcs11.CKM_SHA512_RSA_PKCS_PSS: true,
	pkcs11.CKM_ECDSA: true, pkcs11.CKM_ECDSA_SHA1: true, pkcs11.CKM_ECDSA_SHA224: true,
	pkcs11.CKM_ECDSA_SHA256: true, pkcs11.CKM_ECDSA_SHA384: true, pkcs11.CKM_ECDSA_SHA512: true,
	pkcs11.CKM_SHA_1_HMAC: true, pkcs11.CKM_SHA224_HMAC: true, pkcs11.CKM_SHA256_HMAC: true,
	pkcs11.CKM_SHA384_HMAC: true, pkcs11.CKM_SHA512_HMAC: true,
}

// newLaneJob returns the lane call for op with m, or nil when m cannot go
// through a lane.
func newLaneJob(op p11raw.LaneOp, m *pkcs11.Mechanism, key pkcs11.ObjectHandle, data, sig []byte) *laneJob {
	ok := laneMechanisms[m.Mechanism] || m.Mechanism == CKMEdDSA && len(m.Parameter) == 0
	if !ok {
		return nil
	}
	return &laneJob{call: p11raw.LaneCall{Op: op, Mechanism: m.Mechanism, Parameter: m.Parameter, Key: key, Data: data, Sig: sig}}
}

// startLane gives x a lane when its session can have one. It runs at the
// session's first call that a lane can make, so sessions that never sign
// (the login anchor, most dedicated ones) start no thread.
func (x *sess) startLane() {
	x.laneTried = true
	if !x.spin || x.owner.spec.Interceptor != nil {
		return
	}
	mm, ok := x.ctx.(*miekgModule)
	if !ok || mm.fl == nil {
		return
	}
	x.lane = p11raw.NewLane(mm.fl, workerSpin) // nil (no thread): the Go worker does it all
}

// runEither runs lj on x's lane when x has one, fn on its worker otherwise.
func (x *sess) runEither(ctx context.Context, op Op, timeout time.Duration, fn func(*sess) error, lj *laneJob) error {
	if lj != nil && !x.laneTried && !x.dead {
		x.startLane()
	}
	if lj == nil || x.lane == nil {
		return x.run(ctx, op, timeout, fn)
	}
	return x.runLane(ctx, op, timeout, lj)
}

// runLane is run for a call on x's lane.
func (x *sess) runLane(ctx context.Context, op Op, timeout time.Duration, lj *laneJob) error {
	if x.dead {
		return &Error{Member: x.owner.spec.Name, Op: op, Err: ErrSessionLost}
	}
	if err := ctx.Err(); err != nil {
		return &Error{Member: x.owner.spec.Name, Op: op, Err: err}
	}
	lj.call.Session = x.h
	x.owner.stats.laneCalls.Add(1)
	out, outcome, err := x.lane.Call(ctx, &lj.call, callerSpin, timeout)
	if lj.call.Yielded {
		x.owner.stats.laneYields.Add(1)
	}
	switch outcome {
	case p11raw.LaneAnswered:
		lj.out = out
		return newError(x.owner.spec.Name, op, err)
	case p11raw.LaneNoMemory:
		return newError(x.owner.spec.Name, op, pkcs11.Error(pkcs11.CKR_HOST_MEMORY))
	}
	var cause error
	if outcome == p11raw.LaneTimedOut {
		cause = timeoutError(x.owner.spec.Name, op, timeout)
	} else {
		cause = &Error{Member: x.owner.spec.Name, Op: op, Err: ctx.Err()}
	}
	// Abandoned, as run's abandon does, except that the lane has already
	// settled the race with its thread.
	x.quarantine()
	x.markAbandoned()
	lane := x.lane
	x.lane = nil
	x.stopWorker()
	go func() {
		lane.Abandoned()
		x.afterAbandon()
	}()
	return cause
}
