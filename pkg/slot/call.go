package slot

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hagroup/hagroup/internal/handoff"
	"github.com/hagroup/hagroup/internal/p11raw"
	"github.com/hagroup/hagroup/internal/tokenquirk"
	"github.com/hagroup/hagroup/pkg/slot/dispatch"
	"github.com/miekg/pkcs11"
)

// The way down of a call, in this file: Single (an Init and its
// single-part call in one crossing) or another of the operations, then do
// on a pooled session (slot.go keeps the pool) or Session.callWith on a
// dedicated one, then runWith, the one way every module call of a session
// goes. runWith dispatches it
// as the member's Spec.Dispatch says (dispatch.go): on the caller's goroutine
// (inline) or on the session's worker, abandoned at its deadline (handoff).
// Right before the module call (below the Interceptor: an injected fault
// holds no lock) it takes the token's object lock, a quirk of SoftHSM's
// (internal/tokenquirk), and lets it go when the module call returns,
// however late. The wait for the lock is not part of the call's deadline:
// the caller, or the inline watchdog, extends the deadline by it.

// Single makes the single-part operation k (on a Slot, on a pooled
// session): its Init with m and key (none for a digest), then its
// single-part call on in. For KindVerify, sig is the signature and the
// output nil; a bad signature is CKR_SIGNATURE_INVALID (class request).
func (o operations) Single(ctx context.Context, k Kind, m *pkcs11.Mechanism, key pkcs11.ObjectHandle, in, sig []byte) ([]byte, error) {
	if err := checkMech(o.member(), kinds[k].op, m); err != nil {
		return nil, err
	}
	a := &shotArgs{k: k, m: m, key: key, in: in, sig: sig}
	if err := o.run(ctx, kinds[k].op, o.on.cmdTimeout, nil, a); err != nil {
		return nil, err
	}
	return a.out, nil
}

// do runs fn (or one-shot a, fn nil: shot.go) on a pooled session: it
// borrows one (waiting, bounded by ctx, while all are lent out), runs the
// call under timeout inside the slot's gate, and returns the session to
// the pool, or discards it after a session-level error.
func (s *Slot) do(ctx context.Context, op Op, timeout time.Duration, fn func(*sess) error, a *shotArgs) error {
	if q := s.quarantined.Load(); q >= int64(s.capacity) {
		return &Error{Member: s.spec.Name, Op: op, Err: fmt.Errorf("%w: %d calls still hung in the module", ErrTimeout, q)}
	}
	select {
	case s.permits <- struct{}{}:
	default:
		select {
		case s.permits <- struct{}{}:
		case <-ctx.Done():
			return &Error{Member: s.spec.Name, Op: op, Err: fmt.Errorf("waiting for a free session: %w", ctx.Err())}
		case <-s.closedCh:
			return &Error{Member: s.spec.Name, Op: op, Err: ErrClosed}
		}
	}
	x, err := s.take(ctx, op)
	if err == nil {
		err = x.runWith(ctx, op, timeout, fn, a)
		s.giveBack(x, err)
		s.gate.leave()
	}
	<-s.permits
	if s.loginLost(err) {
		s.checkLogin(ctx)
	}
	return err
}

// take enters the slot's gate and borrows a session of the current
// generation for a call of op; on an error it has left the gate.
func (s *Slot) take(ctx context.Context, op Op) (*sess, error) {
	if err := s.gate.enter(ctx); err != nil {
		return nil, &Error{Member: s.spec.Name, Op: op, Err: err}
	}
	var err error
	if st := s.st.Load(); s.closed.Load() {
		err = &Error{Member: s.spec.Name, Op: op, Err: ErrClosed}
	} else if err = st.err; err == nil {
		var x *sess
		if x, err = s.borrow(ctx, st); err == nil {
			return x, nil
		}
	}
	s.gate.leave()
	return nil, err
}

// giveBack returns x to the pool after a call that ended with err, or
// discards it after a session-level error (a quarantined one is dead).
func (s *Slot) giveBack(x *sess, err error) {
	switch {
	case x.dead: // quarantined
		s.stats.open.Add(-1)
	case isSessionFatal(err):
		s.discard(x)
	default:
		s.idle.put(x)
	}
}

// Session states, for the race between a worker finishing and its caller
// giving up.
const (
	stIdle      = handoff.Idle
	stBusy      = handoff.Busy
	stAbandoned = handoff.Abandoned
)

// sess is one physical session and, under handoff, its worker.
type sess struct {
	owner *Slot
	ctx   p11
	h     pkcs11.SessionHandle
	gen   uint64 // slot generation the session belongs to
	inc   uint64 // module incarnation the session was opened in
	open  bool   // h is an open session

	// The call being made. Written by the caller before the post, read by
	// the worker after it (ordered by posted and answered for the race
	// detector, by the cell's futex words for the machine).
	cctx context.Context
	op   Op
	fn   func(*sess) error
	err  error // the worker's result

	outHint int // the length of the session's last output (a one-shot's first buffer)

	// The Done channel of the caller's context whose cancellation cancels
	// the call in flight, and how to stop that (watch; caller side).
	watched   <-chan struct{}
	stopWatch func() bool
	wmu       sync.Mutex // orders a late cancellation with the next watch
	watchGen  uint64     // of the registration that may cancel

	// The call's hold on the token's object lock (nil for none), and how
	// long the call has waited for it: lockWait ns in all, plus the wait
	// going on since lockSince (monoNow; 0 when none). Written by the
	// goroutine making the call, read by its caller.
	hold      atomic.Pointer[tokenquirk.Hold]
	lockWait  atomic.Int64
	lockSince atomic.Int64
	heldAt    atomic.Int64 // when the call took its hold (monoNow): its deadline runs from there

	worker   bool       // the session has a worker (handoff)
	inline   inlineCall // the call in flight under inline, for the slot's watchdog
	cell     handoff.Pair
	cShots   bool // the worker makes one-shots in C (shootsInC)
	posted   atomic.Uint32
	answered atomic.Uint32
	quit     atomic.Bool // set before the last post: the worker ends
	// The one-shot calls (shot.go): the C memory that holds them (under
	// handoff the worker's), the call in flight if it is one, whether its
	// arguments are in that memory, and whether the worker makes it in C.
	shot    *p11raw.Shot
	shotArg *shotArgs
	inC     bool
	postedC bool

	state atomic.Int32
	dead  bool // caller side: abandoned or closed, never to be used again
	// overtaken is the Late of a call abandoned when another member's
	// answer overtook it: told when the module returns the call.
	overtaken atomic.Pointer[Late]
}

// newSess makes a session (not open yet) on state st, with its worker
// under handoff.
func newSess(owner *Slot, st *slotState) *sess {
	x := &sess{
		owner:  owner,
		ctx:    st.ctx,
		gen:    st.gen,
		inc:    st.inc,
		worker: owner.spec.Dispatch != dispatch.Inline,
	}
	x.shot = p11raw.NewShot() // (freed by the worker, or once unreachable)
	if x.worker {
		x.cShots = shootsInC(owner, st.ctx)
		x.cell = newPair(owner, x.cShots)
		go x.work()
	} else {
		owner.dog.add(x)
	}
	return x
}

// work runs calls until the session is retired or abandoned: the one-shots
// in C (Serve), the others here.
func (x *sess) work() {
	defer x.shot.Free()
	job := handoff.Job{Run: x.shot.Run(), Arg: x.shot.Arg()}
	state := (*int32)(unsafe.Pointer(&x.state))
	var seq uint32
	for {
		var abandoned bool
		seq, abandoned = x.cell.Serve(seq, state, job, workerSpin)
		if abandoned {
			x.afterAbandon()
			return
		}
		if x.quit.Load() {
			x.cell.Drop()
			return
		}
		x.posted.Load() // the call is visible from here on
		err := x.exec()
		if !x.state.CompareAndSwap(stBusy, stIdle) {
			// The caller gave up on this call: clean up behind it.
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

// exec runs the interceptor and the module call, on whichever goroutine the
// dispatch chose.
func (x *sess) exec() error {
	if x.op == opCloseSession || x.owner.spec.Interceptor == nil {
		return x.call()
	}
	return x.owner.spec.intercepted(x.cctx, x.op, x.call)
}

// call makes the module call under the token's object lock (the slot's
// current one: a session of an older generation fails in the module).
func (x *sess) call() error {
	if a := objectAccess(x.op); a != tokenquirk.None {
		start := monoNow()
		x.lockSince.Store(start)
		st := x.owner.st.Load()
		hold, err := st.objects.Acquire(x.cctx, a)
		held := monoNow()
		x.lockWait.Add(held - start)
		x.lockSince.Store(0)
		if err != nil {
			if errors.Is(err, tokenquirk.ErrStuck) {
				err = fmt.Errorf("%w: %v", ErrTimeout, err)
			}
			return err
		}
		defer hold.Release()
		x.heldAt.Store(held) // (before the hold: abandon reads it after)
		x.hold.Store(hold)
		defer x.hold.Store(nil)
		if hold.RereadFirst() {
			defer x.owner.lockStore(x.cctx)()
			// Its answer does not matter: the token reads its object
			// list before it reads the flags it may fail on.
			_, _ = x.ctx.GetTokenInfo(st.id)
		}
	}
	if x.state.Load() == stAbandoned {
		return nil // nobody waits any more: do not start the module call
	}
	if x.fn == nil {
		return x.single(x.shotArg)
	}
	return x.fn(x)
}

// lockWaited is how long the call in flight has waited for the token's
// object lock so far.
func (x *sess) lockWaited() time.Duration {
	d := x.lockWait.Load()
	if since := x.lockSince.Load(); since != 0 {
		d += monoNow() - since
	}
	return time.Duration(d)
}

// afterAbandon runs on the worker once an abandoned call has returned: it
// closes the session and lets the slot forget the call.
func (x *sess) afterAbandon() {
	if l := x.overtaken.Load(); l != nil {
		l.returned()
	}
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

// runWith makes call fn for op on x, or, with fn nil, one-shot a
// (shot.go), at most timeout and not beyond ctx. On timeout the error
// wraps ErrTimeout; on ctx the error wraps ctx.Err(); in both cases the
// session is quarantined and dead. Under handoff it posts the call to the
// worker and waits for its answer, the deadline or ctx (and comes back to
// its Late, if it has one); the caller spins for as long as a wake-up costs
// (callerSpin) and then sleeps.
func (x *sess) runWith(ctx context.Context, op Op, timeout time.Duration, fn func(*sess) error, a *shotArgs) error {
	s := x.owner
	if x.dead {
		return &Error{Member: s.spec.Name, Op: op, Err: ErrSessionLost}
	}
	if err := ctx.Err(); err != nil {
		return &Error{Member: s.spec.Name, Op: op, Err: err}
	}
	if op != opCloseSession {
		if err := s.stalled(op); err != nil {
			return err
		}
	}
	x.cctx, x.op, x.fn, x.shotArg = ctx, op, fn, a
	x.inC = a != nil && x.setShot(a)
	x.lockWait.Store(0)
	x.state.Store(stBusy)
	if !x.worker {
		return x.runInline(op, timeout)
	}
	late := lateFor(ctx, timeout)
	if late != nil && late.wasOvertaken() {
		// Another member answered while an earlier call of this attempt
		// waited (a retry after it): make no call that nobody awaits.
		x.state.Store(stIdle)
		x.cctx, x.fn, x.shotArg = nil, nil, nil
		return &Error{Member: x.owner.spec.Name, Op: op, Err: ErrOvertaken}
	}
	x.watch(ctx)
	seq := x.posted.Add(1) // the cell numbers calls the same way
	x.postedC = x.inC && x.cShots
	x.cell.Post(x.postedC)
	if ctx.Err() != nil {
		x.cell.Cancel(seq) // cancelled before the post: watch's cancel came too early
	}
	var outcome handoff.Outcome
	if late != nil {
		outcome = late.wait(x.cell, seq, timeout)
	} else {
		outcome = x.cell.Wait(seq, callerSpin, timeout)
	}
	// The wait for the token's object lock is not the member's: wait as
	// much longer.
	for credited := time.Duration(0); outcome == handoff.TimedOut; {
		waited := x.lockWaited()
		if waited <= credited {
			break
		}
		outcome = x.cell.Wait(seq, 0, waited-credited)
		credited = waited
	}
	var cause error
	overtaken := false
	switch {
	case outcome == handoff.Answered:
		return x.result(op)
	case outcome == handoff.TimedOut:
		cause = timeoutError(x.owner.spec.Name, op, timeout)
	case late != nil && ctx.Err() == nil && late.wasOvertaken():
		cause = &Error{Member: x.owner.spec.Name, Op: op, Err: ErrOvertaken}
		overtaken = true
		x.overtaken.Store(late) // (before abandon: the worker reads it after)
	default:
		cause = &Error{Member: x.owner.spec.Name, Op: op, Err: ctx.Err()}
	}
	// A call given up before its own deadline may well return: until that
	// deadline, others wait for its lock.
	var left time.Duration
	if outcome != handoff.TimedOut {
		left = timeout
	}
	if !x.abandon(left) {
		// The worker finished just now: its answer is on the way (and
		// no call is left in the module for the Late to report).
		x.overtaken.Store(nil)
		x.cell.WaitAnswer(seq)
		return x.result(op)
	}
	if overtaken {
		late.abandoned()
	}
	return cause
}

// objectAccess is what op does to the token's objects.
func objectAccess(op Op) tokenquirk.Access {
	switch op {
	case OpCreateObject, OpCopyObject, OpDestroyObject,
		OpGenerateKey, OpGenerateKeyPair, OpUnwrapKey, OpDeriveKey:
		return tokenquirk.Change
	case OpSetAttributes:
		return tokenquirk.Write
	case OpFindObjects, OpGetAttributes:
		return tokenquirk.Read
	}
	return tokenquirk.None
}

// watch makes ctx's cancellation cancel the call in flight. The
// registration stays for the session's next calls whose context is done
// with the same channel (an application's calls through libhapkcs11.so all
// have the library's):
// registering one per call would cost an allocation and two locks of the
// context's. A cancel that comes between calls names the last, answered
// call, and the cell ignores it.
func (x *sess) watch(ctx context.Context) {
	done := ctx.Done() // (contexts themselves may not be comparable)
	if done == x.watched {
		return
	}
	x.unwatch()
	if done == nil {
		return
	}
	x.wmu.Lock()
	defer x.wmu.Unlock()
	x.watched = done
	gen := x.watchGen
	x.stopWatch = context.AfterFunc(ctx, func() {
		x.wmu.Lock()
		defer x.wmu.Unlock()
		if x.watchGen == gen { // (not a context the session has stopped watching)
			x.cell.Cancel(x.posted.Load())
		}
	})
}

// unwatch drops watch's registration; once it returns, the registration
// cancels nothing.
func (x *sess) unwatch() {
	if x.stopWatch == nil {
		return
	}
	x.stopWatch()
	x.wmu.Lock()
	x.watchGen++
	x.watched, x.stopWatch = nil, nil
	x.wmu.Unlock()
}

// result takes the answered call's result.
func (x *sess) result(op Op) error {
	x.answered.Load() // the result is visible from here on
	err := x.err
	if x.postedC {
		x.shotArg.out, err = x.shotResult()
	}
	x.cctx, x.fn, x.err, x.shotArg = nil, nil, nil, nil
	return x.owner.errorOf(op, err)
}

// abandon gives up on the call in flight: the session is quarantined and
// dead, and the slot (and its module) kept alive for the worker. A hold of
// the token's object lock is marked stuck once the call is past its own
// deadline, timeout after it took the hold (0: at once, for a call that
// timed out): a caller's cancellation says nothing of the token. It
// returns false when the worker finished just now: then nothing is given
// up and the caller takes the result after all.
func (x *sess) abandon(timeout time.Duration) bool {
	s := x.owner
	s.hold()
	s.quarantined.Add(1)
	if !x.state.CompareAndSwap(stBusy, stAbandoned) {
		s.unquarantine()
		s.unhold()
		return false
	}
	if h := x.hold.Load(); h != nil { // (the worker checks stAbandoned after it stores a hold)
		if due := time.Duration(x.heldAt.Load() + int64(timeout) - monoNow()); timeout > 0 && due > 0 {
			time.AfterFunc(due, h.Stuck) // (harmless once released)
		} else {
			h.Stuck()
		}
	}
	x.dead = true
	x.unwatch()
	s.stats.quarantinedTotal.Add(1)
	return true
}

// retire closes the session (bounded by timeout) and stops its worker.
func (x *sess) retire(timeout time.Duration) {
	if x.dead {
		return
	}
	if x.open {
		_ = x.runWith(context.Background(), opCloseSession, timeout, func(x *sess) error {
			err := x.ctx.CloseSession(x.h)
			x.open = false
			return err
		}, nil)
	}
	if x.dead {
		return // the close hung; the worker cleans up
	}
	x.dead = true
	x.unwatch()
	if x.worker {
		x.quit.Store(true)
		x.cell.Post(false)
	} else {
		x.owner.dog.remove(x)
	}
}

// openOn opens the session on slot id (CKF_SERIAL_SESSION|CKF_RW_SESSION).
func (x *sess) openOn(ctx context.Context, id uint, timeout time.Duration) error {
	return x.runWith(ctx, OpOpenSession, timeout, func(x *sess) error {
		h, err := x.ctx.OpenSession(id, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
		if err != nil {
			return err
		}
		x.h, x.open = h, true
		return nil
	}, nil)
}

// lockStore takes the token's store lock (Spec.StoreLock) for a change,
// as tokenquirk.LockChange does, and returns its release; a no-op when
// there is none.
func (s *Slot) lockStore(ctx context.Context) (release func()) {
	if s.spec.StoreLock == "" {
		return func() {}
	}
	return tokenquirk.LockChange(ctx, s.spec.StoreLock, 0o660)
}
