// Package opstate is the operation state machine of a PKCS#11 session,
// written once: pkg/group's virtual session (over the members, with
// failover) and a member's own pass-through session (Direct, over one
// token session) differ only in their Runner. It owns what PKCS#11 says
// of *Init … *Final: one operation of each kind per session, which calls
// end it, and the buffer convention (a length query or a short buffer
// keeps the output for the next call and does not end the operation). It
// also names, in one place, the pkg/slot call of every step.
package opstate

import (
	"bytes"
	"context"
	"math"
	"slices"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// Kind names an operation family; a session has at most one of each
// active. It is pkg/slot's, so that the kind a call starts with is the one
// its member's module call is made by.
type Kind = slot.Kind

// The operation families.
const (
	Sign    = slot.KindSign
	Verify  = slot.KindVerify
	Encrypt = slot.KindEncrypt
	Decrypt = slot.KindDecrypt
	Digest  = slot.KindDigest
	nKinds  = slot.NumKinds
)

// Step is which call of an operation runs: the single-part one (C_Sign),
// an Update or the Final.
type Step int

// The steps of an operation.
const (
	Single Step = iota + 1
	Update
	Final
)

// Name returns the PKCS#11 name of step st of k, for errors.
func (st Step) Name(k Kind) string {
	switch st {
	case Update:
		return k.UpdateName()
	case Final:
		return k.FinalName()
	}
	return k.String()
}

// Room is how much output the caller can take, in PKCS#11's buffer
// convention: Query (a NULL buffer) asks only for the length, n ≥ 0 is a
// buffer of n bytes, Any takes whatever comes.
type Room int

// Rooms with a meaning of their own.
const (
	Query Room = -1
	Any   Room = math.MaxInt
)

// Error is a call the machine answers itself, without a token: the
// PKCS#11 call and its CKR code. It unwraps to the pkcs11.Error of the
// code, so that pkg/slot's and pkg/group's CodeOf read it.
type Error struct {
	Op   string
	Code uint
}

func (e *Error) Error() string { return e.Op + ": " + pkcs11.Error(e.Code).Error() }

// Unwrap returns the code as a pkcs11.Error.
func (e *Error) Unwrap() error { return pkcs11.Error(e.Code) }

// Is matches the sentinels below by code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Op == "" && t.Code == e.Code
}

// Sentinel errors, usable with errors.Is.
var (
	// ErrActive: an operation of that kind is already active in the
	// session. CKR_OPERATION_ACTIVE.
	ErrActive = &Error{Code: pkcs11.CKR_OPERATION_ACTIVE}
	// ErrNotInitialized: no operation of that kind is active.
	// CKR_OPERATION_NOT_INITIALIZED.
	ErrNotInitialized = &Error{Code: pkcs11.CKR_OPERATION_NOT_INITIALIZED}
	// ErrBufferTooSmall: the output does not fit the caller's buffer; it
	// is kept, with the operation, for the next call. CKR_BUFFER_TOO_SMALL.
	ErrBufferTooSmall = &Error{Code: pkcs11.CKR_BUFFER_TOO_SMALL}
)

func refuse(s *Error, op string) error { return &Error{Op: op, Code: s.Code} }

// Op is one active operation: what its Init named, where the session
// runs it (At, the runner's), and an output computed but not delivered
// yet.
type Op[A any] struct {
	Mech *pkcs11.Mechanism
	At   A
	// Started: an Update was accepted, so the token holds the
	// operation's state (it cannot move to another token). The runner
	// sets it.
	Started bool

	held     []byte // output not delivered yet (may be empty)
	heldIn   []byte // the input it was computed from
	heldStep Step   // the step that computed it; 0: nothing held
}

// Runner places and runs the operations of a Table. W is the type of an
// object a step names besides the operation's key (C_DigestKey's).
type Runner[A, W any] interface {
	// Start sends op's Init (or decides it need not be sent yet). The
	// token's answer is returned as it is.
	Start(ctx context.Context, k Kind, op *Op[A]) error
	// Run runs one step. with is the object the step names, or nil. An
	// error ends the operation unless it leaves it active on a token.
	Run(ctx context.Context, k Kind, op *Op[A], st Step, in, sig []byte, with *W) ([]byte, error)
	// Stop releases op; live says the token may still hold it active
	// (the application abandons it) rather than having ended it.
	Stop(k Kind, op *Op[A], live bool)
	// Code returns the CKR code of an error Start or Run returned.
	Code(err error) uint
}

// keep reports whether code leaves the operation active, as a token
// leaves it: a short buffer, and a bad handle given to C_DigestKey (with).
func keep(code uint, with bool) bool {
	return code == pkcs11.CKR_BUFFER_TOO_SMALL || with && code == pkcs11.CKR_KEY_HANDLE_INVALID
}

// Table is a session's active operations. Its owner serialises calls.
type Table[A, W any] struct {
	ops [nKinds]*Op[A] // the active ones, each in store or nil
	// store holds each kind's operation, so that a signer's C_SignInit
	// allocates nothing: an operation ended is not used again (the
	// Runner's Stop lets go of its placement), and the next Init of its
	// kind overwrites it.
	store [nKinds]Op[A]
}

// Init makes a copy of op the active operation of kind k once r started
// it (r sees the copy). A session has one active operation, as on the
// member token: SoftHSM answers CKR_OPERATION_ACTIVE to any Init while
// another operation is active (measured by test/conformance's ops steps).
func (t *Table[A, W]) Init(ctx context.Context, r Runner[A, W], k Kind, op *Op[A]) error {
	if t.Active() {
		return refuse(ErrActive, k.InitName())
	}
	t.store[k] = *op
	if err := r.Start(ctx, k, &t.store[k]); err != nil {
		t.store[k] = Op[A]{}
		return err
	}
	t.ops[k] = &t.store[k]
	return nil
}

// Active reports whether an operation is active.
func (t *Table[A, W]) Active() bool {
	return slices.ContainsFunc(t.ops[:], func(op *Op[A]) bool { return op != nil })
}

// Cancel ends operation k without a result (an Init with a NULL
// mechanism).
func (t *Table[A, W]) Cancel(r Runner[A, W], k Kind) error {
	if t.ops[k] == nil {
		return refuse(ErrNotInitialized, k.InitName())
	}
	t.end(r, k, true)
	return nil
}

// end drops operation k.
func (t *Table[A, W]) end(r Runner[A, W], k Kind, live bool) {
	if op := t.ops[k]; op != nil {
		r.Stop(k, op, live)
		t.ops[k] = nil
		t.store[k] = Op[A]{} // let go of its key, input and output
	}
}

// EndAll drops every operation (the session closes).
func (t *Table[A, W]) EndAll(r Runner[A, W]) {
	for k := range t.ops {
		t.end(r, Kind(k), true)
	}
}

// Do runs step st of operation k with in (and sig, for Verify and
// VerifyFinal) on r and hands out its output within room: Begin, r's Run
// unless the output is held, End. with is the object a step names
// (C_DigestKey), or nil.
func (t *Table[A, W]) Do(ctx context.Context, r Runner[A, W], k Kind, st Step, in, sig []byte, with *W, room Room) ([]byte, error) {
	op, out, held, err := t.Begin(ctx, r, k, st, in)
	if err != nil {
		return nil, err
	}
	if !held {
		out, err = r.Run(ctx, k, op, st, in, sig, with)
	}
	return t.End(r, k, op, st, in, out, err, with != nil, room)
}

// Begin is step st of operation k with input in up to its run: it returns
// the operation to run the step on, or the output held for this very step
// and input (held: nothing to run; see End). The caller runs the step and
// hands its answer to End, so that no step comes back up through this
// table on its way down to a token.
func (t *Table[A, W]) Begin(ctx context.Context, r Runner[A, W], k Kind, st Step, in []byte) (op *Op[A], out []byte, held bool, err error) {
	op = t.ops[k]
	if op == nil {
		return nil, nil, false, refuse(ErrNotInitialized, st.Name(k))
	}
	if op.heldStep == st && bytes.Equal(op.heldIn, in) {
		return op, op.held, true, nil
	}
	if op.heldStep == Single {
		// The token's single-part call ended its operation: start it
		// again for the different input, as the token would go on.
		r.Stop(k, op, false)
		op.heldStep, op.held, op.heldIn = 0, nil, nil
		if err := r.Start(ctx, k, op); err != nil {
			t.ops[k] = nil
			return nil, nil, false, err
		}
	}
	return op, nil, false, nil
}

// End hands out the answer of step st of op (Begin's) on in: its output
// within room, or its error. When the output does not fit (or room is
// Query) it is kept, its length returned, and the operation goes on; the
// next call of the same step with the same input delivers it. The error is
// then ErrBufferTooSmall for a short buffer, nil for a length query. A
// single-part step and a Final end the operation, and so does an error
// unless it leaves the operation active on a token (with: the step named
// an object, C_DigestKey).
func (t *Table[A, W]) End(r Runner[A, W], k Kind, op *Op[A], st Step, in, out []byte, err error, with bool, room Room) ([]byte, error) {
	if err != nil {
		if !keep(r.Code(err), with) {
			t.end(r, k, false)
		}
		return nil, err
	}
	if out == nil {
		out = []byte{}
	}
	if room < Room(len(out)) {
		op.held, op.heldIn, op.heldStep = out, in, st
		if room == Query {
			return out, nil
		}
		return out, refuse(ErrBufferTooSmall, st.Name(k))
	}
	op.held, op.heldIn, op.heldStep = nil, nil, 0
	if st != Update {
		t.end(r, k, false)
	}
	return out, nil
}
