package group

import (
	"context"
	"sync"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// DirectSession is an application session on one member's own token (the
// PKCS#11 module's pass-through slots): its operations run through the
// same state machine as a Session's, on one token session, with no
// failover and the token's own handles. Safe for concurrent use; calls
// are serialised.
type DirectSession struct {
	ctx context.Context // for abandoning an operation the application cancels
	ss  *slot.Session

	mu  sync.Mutex
	ops opTable
}

// NewDirectSession runs operations on ss, which it closes on Close. ctx
// bounds the calls Cancel makes to end an operation on the token.
func NewDirectSession(ctx context.Context, ss *slot.Session) *DirectSession {
	return &DirectSession{ctx: ctx, ss: ss}
}

// Slot returns the token session, for the calls that are no operation.
func (d *DirectSession) Slot() *slot.Session { return d.ss }

// Init sends operation k's Init to the token (C_SignInit …): its answer is
// the call's.
func (d *DirectSession) Init(ctx context.Context, k OpKind, mech *pkcs11.Mechanism, key pkcs11.ObjectHandle) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ops.init(ctx, d, k, &operation{mech: mech, raw: key})
}

// Cancel ends operation k without a result.
func (d *DirectSession) Cancel(k OpKind) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ops.cancel(d, k)
}

// Do runs step st of operation k (see opTable.do for room).
func (d *DirectSession) Do(ctx context.Context, k OpKind, st Step, in, sig []byte, room Room) ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ops.do(ctx, d, k, st, in, sig, nil, room)
}

// DigestKey feeds the value of key to the active digest.
func (d *DirectSession) DigestKey(ctx context.Context, key pkcs11.ObjectHandle) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, err := d.ops.do(ctx, d, OpDigest, StepUpdate, nil, nil, &withObject{raw: key}, RoomAny)
	return err
}

// Close closes the token session, which ends its operations there.
func (d *DirectSession) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ops = opTable{}
	return d.ss.Close()
}

func (d *DirectSession) start(ctx context.Context, k OpKind, op *operation) error {
	op.ps = d.ss
	return initOn(ctx, k, d.ss, op.mech, op.raw) // the token's own answer, a bad handle's code included
}

func (d *DirectSession) run(ctx context.Context, k OpKind, op *operation, st Step, in, sig []byte, with *withObject) ([]byte, error) {
	var wh *pkcs11.ObjectHandle
	if with != nil {
		wh = &with.raw
	}
	out, err := stepOn(ctx, k, st, d.ss, in, sig, wh)
	if err == nil && st == StepUpdate {
		op.started = true
	}
	return out, err
}

func (d *DirectSession) stop(k OpKind, op *operation, live bool) {
	if live {
		abandonOn(d.ctx, k, d.ss, op.started)
	}
}
