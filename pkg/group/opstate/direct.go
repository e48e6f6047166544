package opstate

import (
	"context"
	"sync"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// Direct is an application session on one member's own token (the
// PKCS#11 module's pass-through slots): its operations run through the
// same state machine as pkg/group's virtual session, on one token
// session, with no failover and the token's own handles. Safe for
// concurrent use; calls are serialised.
type Direct struct {
	ctx context.Context // for abandoning an operation the application cancels
	ss  *slot.Session

	mu  sync.Mutex
	ops Table[pkcs11.ObjectHandle, pkcs11.ObjectHandle] // At: the key's handle
}

// NewDirect runs operations on ss, which it closes on Close. ctx bounds
// the calls Cancel makes to end an operation on the token.
func NewDirect(ctx context.Context, ss *slot.Session) *Direct {
	return &Direct{ctx: ctx, ss: ss}
}

// Init sends operation k's Init to the token (C_SignInit …): its answer is
// the call's.
func (d *Direct) Init(ctx context.Context, k Kind, mech *pkcs11.Mechanism, key pkcs11.ObjectHandle) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ops.Init(ctx, (*direct)(d), k, &Op[pkcs11.ObjectHandle]{Mech: mech, At: key})
}

// Active reports whether an operation is active.
func (d *Direct) Active() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ops.Active()
}

// Cancel ends operation k without a result.
func (d *Direct) Cancel(k Kind) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ops.Cancel((*direct)(d), k)
}

// Do runs step st of operation k (see Table.Do for room).
func (d *Direct) Do(ctx context.Context, k Kind, st Step, in, sig []byte, room Room) ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ops.Do(ctx, (*direct)(d), k, st, in, sig, nil, room)
}

// DigestKey feeds the value of key to the active digest.
func (d *Direct) DigestKey(ctx context.Context, key pkcs11.ObjectHandle) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, err := d.ops.Do(ctx, (*direct)(d), Digest, Update, nil, nil, &key, Any)
	return err
}

// Close closes the token session, which ends its operations there.
func (d *Direct) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ops = Table[pkcs11.ObjectHandle, pkcs11.ObjectHandle]{}
	return d.ss.Close()
}

// direct is Direct's Runner (kept off Direct's own API).
type direct Direct

func (d *direct) Start(ctx context.Context, k Kind, op *Op[pkcs11.ObjectHandle]) error {
	return InitOn(ctx, k, d.ss, op.Mech, op.At) // the token's own answer, a bad handle's code included
}

func (d *direct) Run(ctx context.Context, k Kind, op *Op[pkcs11.ObjectHandle], st Step, in, sig []byte, with *pkcs11.ObjectHandle) ([]byte, error) {
	out, err := StepOn(ctx, k, st, d.ss, in, sig, with)
	if err == nil && st == Update {
		op.Started = true
	}
	return out, err
}

func (d *direct) Stop(k Kind, op *Op[pkcs11.ObjectHandle], live bool) {
	if live {
		AbandonOn(d.ctx, k, d.ss, op.Started)
	}
}

func (d *direct) Code(err error) uint { return slot.CodeOf(err) }
