package slot

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/hagroup/hagroup/internal/handoff"
	"github.com/hagroup/hagroup/internal/p11raw"
	"github.com/miekg/pkcs11"
)

// A module call cannot be cancelled, so every call runs on the session's
// own worker goroutine while the caller waits for the result, the deadline
// or its ctx, whichever comes first. A caller that stops waiting abandons
// the session: it is quarantined (never reused) and its worker closes it
// when, if ever, the call returns.
//
// A long-lived worker per session rather than a goroutine per call: the
// hand-off is a channel send to a parked goroutine and back, with no
// goroutine, channel or timer created per call, and the worker runs on the
// caller's thread. Measured on the 2-vCPU development machine, a no-op call
// costs ~1 µs this way against ~3 µs with a goroutine (and timer and
// channel) per call.
//
// The price that remains is the runtime's: each hand-off readies a
// goroutine, and when a P is idle the runtime wakes a thread to look for
// work (golang/go#32113) which finds none. Where the two vCPUs share a
// physical core, that thread slows the signature running on the other one:
// ~20 µs on a 60 µs SoftHSM ECDSA signature from a single goroutine, none
// to speak of when every P is busy (many callers) or with GOMAXPROCS=1
// (BenchmarkSlotSign). A deadline cannot be had without the hand-off: a
// goroutine inside a C call cannot return to its caller.
//
// Callers that are threads of a C application (libhapkcs11.so) are another
// matter: each is locked to its M, so a channel hand-off makes the
// scheduler pass the P to another thread and back (stoplockedm,
// startlockedm), two thread wake-ups per call, and on a VM whose idle
// vCPUs halt a wake-up is an interrupt through the hypervisor (~16 µs
// here). For them Spec.SpinHandoff hands calls over through
// internal/handoff instead: caller and worker spin briefly, while a CPU is
// free for it, before they sleep on a futex. callerSpin covers a typical
// signature (ECDSA ~60 µs on SoftHSM) and workerSpin the gap between two
// calls of a busy application thread.
const (
	callerSpin = 200 * time.Microsecond
	workerSpin = 50 * time.Microsecond
)

// Session states, for the race between a worker finishing and its caller
// giving up.
const (
	stIdle int32 = iota
	stBusy
	stAbandoned
)

// sess is one physical session and its worker.
type sess struct {
	owner *Slot
	ctx   p11
	h     pkcs11.SessionHandle
	gen   uint64 // slot generation the session belongs to
	inc   uint64 // module incarnation the session was opened in
	open  bool   // h is an open session

	// The call being handed to the worker. Written by the caller before the
	// send on req (or the store of posted), read by the worker after
	// receiving (or loading posted).
	cctx context.Context
	op   Op
	fn   func(*sess) error

	// Channel hand-off (Go callers).
	req   chan struct{}
	res   chan error // buffered: the worker never blocks on it
	timer *time.Timer

	// Spin hand-off (Spec.SpinHandoff): the atomics order the call and its
	// result for the race detector, the cell's futex words for the machine.
	spin     bool
	cell     handoff.Cell
	posted   atomic.Uint32
	answered atomic.Uint32
	err      error
	quit     atomic.Bool // set before the last post: the worker ends

	lane      *p11raw.Lane // the C thread for signatures (lane.go); nil without
	laneTried bool         // startLane ran: a nil lane stays nil

	objects *objectLock // the token's, shared with every session on it

	state atomic.Int32
	dead  bool // caller side: abandoned or closed, never to be used again
}

// newSess starts the worker of a session, not open yet, on state st.
func newSess(owner *Slot, st *slotState) *sess {
	x := &sess{
		owner:   owner,
		ctx:     st.ctx,
		gen:     st.gen,
		inc:     st.inc,
		spin:    owner.spec.SpinHandoff,
		objects: owner.mod.objectLock(st.id),
	}
	if x.spin {
		go x.workSpin()
		return x
	}
	x.req = make(chan struct{})
	x.res = make(chan error, 1)
	x.timer = time.NewTimer(time.Hour)
	x.timer.Stop()
	go x.work()
	return x
}

// work runs calls until the session is retired or abandoned.
func (x *sess) work() {
	for range x.req {
		err := x.exec()
		if !x.state.CompareAndSwap(stBusy, stIdle) {
			// The caller gave up on this call: clean up behind it.
			x.afterAbandon()
			return
		}
		x.res <- err
	}
}

// workSpin is work for the spin hand-off.
func (x *sess) workSpin() {
	var seq uint32
	for {
		seq = x.cell.Next(seq, workerSpin)
		if x.quit.Load() {
			x.cell.Drop()
			return
		}
		x.posted.Load() // the call is visible from here on
		err := x.exec()
		if !x.state.CompareAndSwap(stBusy, stIdle) {
			x.cell.Drop()
			x.afterAbandon()
			return
		}
		x.err = err
		x.answered.Store(seq)
		x.cell.Done(seq)
	}
}

// opCloseSession names session closes for errors. Closes are not shown to
// the Interceptor: injected faults must never leak sessions on the token.
const opCloseSession Op = "CloseSession"

// exec runs the interceptor and the call on the worker goroutine.
func (x *sess) exec() error {
	if x.op == opCloseSession || x.owner.spec.Interceptor == nil {
		return x.call()
	}
	return x.owner.spec.intercepted(x.cctx, x.op, func() error {
		if x.state.Load() == stAbandoned {
			return nil // nobody waits any more: do not start the module call
		}
		return x.call()
	})
}

// call makes the module call, under the token's object lock (an injected
// fault above it holds no lock).
func (x *sess) call() error {
	defer x.objects.hold(x.op)()
	return x.fn(x)
}

// afterAbandon runs on the worker once an abandoned call has returned: it
// closes the session and lets the slot forget the call.
func (x *sess) afterAbandon() {
	// A context finalized and initialised again since (Reinit) has dropped
	// the session, and may have given its handle number to a new one.
	// (Reinit does not wait for abandoned calls, so the check and the close
	// can still cross a Reinit; the cost would be one spurious
	// CKR_SESSION_HANDLE_INVALID on the new session, which is then replaced.)
	if x.open && x.inc == x.owner.mod.inc.Load() {
		_ = x.ctx.CloseSession(x.h)
	}
	x.open = false
	x.owner.unquarantine()
	x.owner.unhold()
}

// run hands fn to the worker and waits for its result, at most timeout and
// not beyond ctx. On timeout the error wraps ErrTimeout; on ctx the error
// wraps ctx.Err(); in both cases the session is quarantined and dead.
func (x *sess) run(ctx context.Context, op Op, timeout time.Duration, fn func(*sess) error) error {
	if x.dead {
		return &Error{Member: x.owner.spec.Name, Op: op, Err: ErrSessionLost}
	}
	if err := ctx.Err(); err != nil {
		return &Error{Member: x.owner.spec.Name, Op: op, Err: err}
	}
	x.cctx, x.op, x.fn = ctx, op, fn
	x.state.Store(stBusy)
	if x.spin {
		return x.runSpin(ctx, op, timeout)
	}
	// Arm the timer before the hand-off: from the send on, this goroutine
	// should park at once so that the worker runs on this thread (a
	// spinning thread of the runtime steals it after a few µs otherwise).
	x.timer.Reset(timeout)
	x.req <- struct{}{}
	var cause error
	select {
	case err := <-x.res:
		x.timer.Stop()
		x.cctx, x.fn = nil, nil
		return newError(x.owner.spec.Name, op, err)
	case <-x.timer.C:
		cause = timeoutError(x.owner.spec.Name, op, timeout)
	case <-ctx.Done():
		x.timer.Stop()
		cause = &Error{Member: x.owner.spec.Name, Op: op, Err: ctx.Err()}
	}
	if !x.abandon() {
		// The worker finished just now: take its result after all.
		err := <-x.res
		x.cctx, x.fn = nil, nil
		return newError(x.owner.spec.Name, op, err)
	}
	return cause
}

// runSpin is run's hand-off for Spec.SpinHandoff.
func (x *sess) runSpin(ctx context.Context, op Op, timeout time.Duration) error {
	seq := x.posted.Add(1) // the cell numbers calls the same way
	x.cell.Post()
	var stop func() bool
	if ctx.Done() != nil {
		stop = context.AfterFunc(ctx, func() { x.cell.Cancel(seq) })
	}
	outcome := x.cell.Wait(seq, callerSpin, timeout)
	if stop != nil {
		stop()
	}
	var cause error
	switch outcome {
	case handoff.Answered:
		return x.spinResult(op)
	case handoff.TimedOut:
		cause = timeoutError(x.owner.spec.Name, op, timeout)
	default:
		cause = &Error{Member: x.owner.spec.Name, Op: op, Err: ctx.Err()}
	}
	if !x.abandon() {
		// The worker finished just now: its answer is on the way.
		x.cell.WaitAnswer(seq)
		return x.spinResult(op)
	}
	return cause
}

// spinResult takes the answered call's result.
func (x *sess) spinResult(op Op) error {
	x.answered.Load() // the result is visible from here on
	err := x.err
	x.cctx, x.fn, x.err = nil, nil, nil
	return newError(x.owner.spec.Name, op, err)
}

// abandon gives up on the call in flight: the session is quarantined and
// dead, and the slot (and its module) kept alive for the worker. It
// returns false when the worker finished just now: then nothing is given
// up and the caller takes the result after all.
func (x *sess) abandon() bool {
	x.quarantine()
	if !x.state.CompareAndSwap(stBusy, stAbandoned) {
		x.owner.unquarantine()
		x.owner.unhold()
		return false
	}
	x.markAbandoned()
	return true
}

// quarantine counts x's call as hung and keeps the slot (and its module)
// alive for it, until afterAbandon.
func (x *sess) quarantine() {
	x.owner.hold()
	x.owner.quarantined.Add(1)
}

// markAbandoned makes x dead once its call is given up for good.
func (x *sess) markAbandoned() {
	x.dead = true
	x.owner.stats.quarantinedTotal.Add(1)
}

// retire closes the session (bounded by timeout) and stops its workers.
func (x *sess) retire(timeout time.Duration) {
	if x.dead {
		return
	}
	if x.lane != nil {
		x.lane.Close()
		x.lane = nil
	}
	if x.open {
		_ = x.run(context.Background(), opCloseSession, timeout, func(x *sess) error {
			err := x.ctx.CloseSession(x.h)
			x.open = false
			return err
		})
	}
	if x.dead {
		return // the close hung; the worker cleans up
	}
	x.dead = true
	x.stopWorker()
}

// stopWorker ends the idle worker of a session that is dead.
func (x *sess) stopWorker() {
	if x.spin {
		x.quit.Store(true)
		x.cell.Post()
		return
	}
	close(x.req)
}

// openOn opens the session on slot id (CKF_SERIAL_SESSION|CKF_RW_SESSION).
func (x *sess) openOn(ctx context.Context, id uint, timeout time.Duration) error {
	return x.run(ctx, OpOpenSession, timeout, func(x *sess) error {
		h, err := x.ctx.OpenSession(id, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
		if err != nil {
			return err
		}
		x.h, x.open = h, true
		return nil
	})
}
