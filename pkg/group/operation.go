package group

import (
	"bytes"
	"context"
	"math"

	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// The operation state machine of a session, written once: the virtual
// session (Session, over the members with failover) and a member's own
// pass-through session (DirectSession, over one token session) differ only
// in their runner. It owns what PKCS#11 says of *Init … *Final: one
// operation of each kind per session, which calls end it, and the buffer
// convention (a length query or a short buffer keeps the output for the
// next call and does not end the operation).

// OpKind names an operation family; a session has at most one of each
// active.
type OpKind int

// The operation families.
const (
	OpSign OpKind = iota
	OpVerify
	OpEncrypt
	OpDecrypt
	OpDigest
	nKinds
)

var opNames = [nKinds]string{"Sign", "Verify", "Encrypt", "Decrypt", "Digest"}

// The calls' names, built once: they name the errors of every call.
var initNames, updateNames, finalNames = callNames("Init"), callNames("Update"), callNames("Final")

func callNames(step string) (names [nKinds]string) {
	for k := range names {
		names[k] = opNames[k] + step
	}
	return names
}

// Step is which call of an operation runs: the single-part one (C_Sign),
// an Update or the Final.
type Step int

// The steps of an operation.
const (
	StepSingle Step = iota + 1
	StepUpdate
	StepFinal
)

// name returns the PKCS#11 name of step st of k, for errors.
func (st Step) name(k OpKind) string {
	switch st {
	case StepUpdate:
		return updateNames[k]
	case StepFinal:
		return finalNames[k]
	}
	return opNames[k]
}

// Room is how much output the caller can take, in PKCS#11's buffer
// convention: RoomQuery (a NULL buffer) asks only for the length, n ≥ 0 is
// a buffer of n bytes, RoomAny takes whatever comes.
type Room int

// Rooms with a meaning of their own.
const (
	RoomQuery Room = -1
	RoomAny   Room = math.MaxInt
)

// ErrBufferTooSmall: the output does not fit the caller's buffer; it is
// kept, with the operation, for the next call. CKR_BUFFER_TOO_SMALL.
var ErrBufferTooSmall = sentinel(pkcs11.CKR_BUFFER_TOO_SMALL, "buffer too small")

// operation is one active operation: what its Init named, where it runs,
// and an output computed but not delivered yet.
type operation struct {
	mech *pkcs11.Mechanism
	key  *vobject            // Session: the key; nil for a digest
	raw  pkcs11.ObjectHandle // DirectSession: the key's handle

	m       *member.Member // Session: the member its Init went to; nil while deferred (see proofs)
	ps      *slot.Session  // the member session it runs on; nil while deferred
	epoch   uint64         // m's epoch when placed
	started bool           // an Update was accepted: the member holds its state, it cannot move

	held     []byte // output not delivered yet (may be empty)
	heldIn   []byte // the input it was computed from
	heldStep Step   // the step that computed it; 0: nothing held
}

// runner places and runs operations for an opTable.
type runner interface {
	// start sends op's Init (or decides it need not be sent yet). The
	// member's answer is returned as it is.
	start(ctx context.Context, k OpKind, op *operation) error
	// run runs one step. with is an object the step names (C_DigestKey's
	// key), or nil. An error ends the operation unless keep(err).
	run(ctx context.Context, k OpKind, op *operation, st Step, in, sig []byte, with *withObject) ([]byte, error)
	// stop releases op; live says the member may still hold it active
	// (the application abandons it) rather than having ended it.
	stop(k OpKind, op *operation, live bool)
}

// withObject is an object a step names besides the operation's key.
type withObject struct {
	o   *vobject            // Session
	raw pkcs11.ObjectHandle // DirectSession
}

// keep reports whether err leaves the operation active, as a token leaves
// it: a short buffer, and a bad handle given to C_DigestKey (with).
func keep(err error, with bool) bool {
	c := CodeOf(err)
	return c == pkcs11.CKR_BUFFER_TOO_SMALL || with && c == pkcs11.CKR_KEY_HANDLE_INVALID
}

// opTable is a session's active operations. Its owner serialises calls.
type opTable struct {
	ops [nKinds]*operation
}

// init makes op the active operation of kind k once r started it.
func (t *opTable) init(ctx context.Context, r runner, k OpKind, op *operation) error {
	if t.ops[k] != nil {
		return wrap(ErrOperationActive, initNames[k], "", nil)
	}
	if err := r.start(ctx, k, op); err != nil {
		return err
	}
	t.ops[k] = op
	return nil
}

// cancel ends operation k without a result (an Init with a NULL
// mechanism).
func (t *opTable) cancel(r runner, k OpKind) error {
	op := t.ops[k]
	if op == nil {
		return wrap(ErrOperationNotInitialized, initNames[k], "", nil)
	}
	t.end(r, k, true)
	return nil
}

// end drops operation k.
func (t *opTable) end(r runner, k OpKind, live bool) {
	if op := t.ops[k]; op != nil {
		r.stop(k, op, live)
		t.ops[k] = nil
	}
}

// endAll drops every operation (the session closes).
func (t *opTable) endAll(r runner) {
	for k := range t.ops {
		t.end(r, OpKind(k), true)
	}
}

// do runs step st of operation k with in (and sig, for Verify and
// VerifyFinal) and hands out its output within room: when it does not fit
// (or room is RoomQuery) the output is kept, its length returned, and the
// operation goes on; the next call of the same step with the same input
// delivers it. The error is ErrBufferTooSmall for a short buffer, nil for
// a length query.
func (t *opTable) do(ctx context.Context, r runner, k OpKind, st Step, in, sig []byte, with *withObject, room Room) ([]byte, error) {
	op := t.ops[k]
	if op == nil {
		return nil, wrap(ErrOperationNotInitialized, st.name(k), "", nil)
	}
	if st == StepSingle && op.started {
		// Any failed C_Sign (C_Encrypt …) ends the operation.
		t.end(r, k, true)
		return nil, wrap(ErrOperationActive, st.name(k), "", nil)
	}
	out := op.held
	if op.heldStep != st || !bytes.Equal(op.heldIn, in) {
		if op.heldStep == StepSingle {
			// The member's single-part call ended its operation: start
			// it again for the different input, as the token would go on.
			r.stop(k, op, false)
			op.heldStep, op.held, op.heldIn = 0, nil, nil
			if err := r.start(ctx, k, op); err != nil {
				t.ops[k] = nil
				return nil, err
			}
		}
		var err error
		if out, err = r.run(ctx, k, op, st, in, sig, with); err != nil {
			if !keep(err, with != nil) {
				t.end(r, k, false)
			}
			return nil, err
		}
		if out == nil {
			out = []byte{}
		}
	}
	if room < Room(len(out)) {
		op.held, op.heldIn, op.heldStep = out, in, st
		if room == RoomQuery {
			return out, nil
		}
		return out, wrap(ErrBufferTooSmall, st.name(k), "", nil)
	}
	op.held, op.heldIn, op.heldStep = nil, nil, 0
	if st != StepUpdate {
		t.end(r, k, false)
	}
	return out, nil
}

// initOn sends the Init of k to ps.
func initOn(ctx context.Context, k OpKind, ps *slot.Session, mech *pkcs11.Mechanism, key pkcs11.ObjectHandle) error {
	switch k {
	case OpSign:
		return ps.SignInit(ctx, mech, key)
	case OpVerify:
		return ps.VerifyInit(ctx, mech, key)
	case OpEncrypt:
		return ps.EncryptInit(ctx, mech, key)
	case OpDecrypt:
		return ps.DecryptInit(ctx, mech, key)
	default:
		return ps.DigestInit(ctx, mech)
	}
}

// stepOn runs step st of k on ps, whose operation was initialised: the
// one place the PKCS#11 calls of each step are named. wh is the object a
// C_DigestKey names (st is StepUpdate then).
func stepOn(ctx context.Context, k OpKind, st Step, ps *slot.Session, in, sig []byte, wh *pkcs11.ObjectHandle) ([]byte, error) {
	if wh != nil {
		return nil, ps.DigestKey(ctx, *wh)
	}
	switch st {
	case StepSingle:
		switch k {
		case OpSign:
			return ps.SignInitialized(ctx, in)
		case OpVerify:
			return nil, ps.VerifyInitialized(ctx, in, sig)
		case OpEncrypt:
			return ps.EncryptInitialized(ctx, in)
		case OpDecrypt:
			return ps.DecryptInitialized(ctx, in)
		default:
			return ps.DigestInitialized(ctx, in)
		}
	case StepUpdate:
		switch k {
		case OpSign:
			return nil, ps.SignUpdate(ctx, in)
		case OpVerify:
			return nil, ps.VerifyUpdate(ctx, in)
		case OpEncrypt:
			return ps.EncryptUpdate(ctx, in)
		case OpDecrypt:
			return ps.DecryptUpdate(ctx, in)
		default:
			return nil, ps.DigestUpdate(ctx, in)
		}
	default:
		switch k {
		case OpSign:
			return ps.SignFinal(ctx)
		case OpVerify:
			return nil, ps.VerifyFinal(ctx, sig)
		case OpEncrypt:
			return ps.EncryptFinal(ctx)
		case OpDecrypt:
			return ps.DecryptFinal(ctx)
		default:
			return ps.DigestFinal(ctx)
		}
	}
}

// abandonOn ends k on ps, where it is active, by finishing it and
// dropping the result (PKCS#11 before 3.0 has no cancel): with the Final
// once an Update was accepted, with the single-part call before (a
// mechanism without multi-part may refuse the Final).
func abandonOn(ctx context.Context, k OpKind, ps *slot.Session, started bool) {
	st := StepSingle
	if started {
		st = StepFinal
	}
	_, _ = stepOn(ctx, k, st, ps, nil, nil, nil) // the outcome of a dropped operation is moot
}
