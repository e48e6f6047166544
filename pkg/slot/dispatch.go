package slot

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hagroup/hagroup/pkg/slot/dispatch"
)

// How long each side of a hand-off spins before it sleeps on a futex
// (internal/handoff). Sleeping costs a wake-up, and on a VM whose idle
// vCPUs halt a wake-up is an interrupt through the hypervisor; spinning
// for about that long and then sleeping never costs more than twice the
// cheaper of the two, and never burns a core waiting for a slow member.
// The wake-up cost is measured by internal/handoff's
// BenchmarkWakeUp; docs/BENCHMARKS.md has the figures.
const (
	callerSpin = 30 * time.Microsecond
	workerSpin = 30 * time.Microsecond
)

// The inline watchdog. A call records its deadline in its session
// (inlineCall) and the slot's one timer (watchdog) fires at the earliest
// deadline it knows of: a steady signer arms no timer per call, only when
// its deadline comes before the one armed (or none is). When the timer
// fires it marks every call past its deadline (plus the time the call has
// waited for the token's object lock) stalled, and sets itself for the
// next deadline of a call in flight, or for none.

// monoBase makes monoNow a monotonic clock in ns.
var monoBase = time.Now()

func monoNow() int64 { return int64(time.Since(monoBase)) + 1 } // never 0

// inlineCall is the watchdog's view of a session's call in flight.
type inlineCall struct {
	state    atomic.Int32 // callIdle, callRunning or callStalled
	deadline atomic.Int64 // of the call running (monoNow)
}

const (
	callIdle int32 = iota
	callRunning
	callStalled
)

// watchdog is a slot's timer over its inline sessions' calls.
type watchdog struct {
	// armed is when the timer fires (monoNow), 0 when it is not set, and
	// firing while fire looks at the calls.
	armed atomic.Int64

	mu    sync.Mutex // guards the fields below and the timer's setting
	t     *time.Timer
	calls map[*sess]struct{} // the slot's inline sessions
}

const firing = -1

// add and remove keep the sessions the watchdog looks at.
func (d *watchdog) add(x *sess) {
	d.mu.Lock()
	if d.calls == nil {
		d.calls = map[*sess]struct{}{}
	}
	d.calls[x] = struct{}{}
	d.mu.Unlock()
}

func (d *watchdog) remove(x *sess) {
	d.mu.Lock()
	delete(d.calls, x)
	d.mu.Unlock()
}

// watch makes sure the timer fires by deadline. The caller has stored its
// call's deadline and state first: a fire that has already looked at the
// calls shows as firing (see fire).
func (d *watchdog) watch(deadline int64) {
	if a := d.armed.Load(); a > 0 && a <= deadline {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if a := d.armed.Load(); a > 0 && a <= deadline {
		return
	}
	d.set(deadline)
}

// set arms the timer for at (monoNow); d.mu is held.
func (d *watchdog) set(at int64) {
	d.armed.Store(at)
	wait := time.Duration(at - monoNow())
	if d.t == nil {
		d.t = time.AfterFunc(wait, d.fire)
		return
	}
	d.t.Reset(wait)
}

// fire marks the calls past their deadline stalled and arms the timer for
// the next deadline.
func (d *watchdog) fire() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.armed.Store(firing) // a call starting from now on arms the timer itself
	now := monoNow()
	next := int64(0)
	for x := range d.calls {
		c := &x.inline
		if c.state.Load() != callRunning {
			continue
		}
		deadline := c.deadline.Load() + int64(x.lockWaited())
		if deadline > now {
			if next == 0 || deadline < next {
				next = deadline
			}
			continue
		}
		// A stalled call keeps the module initialised until it returns
		// (registry.release), as an abandoned one does: held first, so
		// that its return cannot let go of a hold not yet taken.
		x.owner.hold()
		if c.state.CompareAndSwap(callRunning, callStalled) {
			x.owner.stalls.Add(1)
		} else {
			x.owner.unhold()
		}
	}
	if next == 0 {
		d.armed.Store(0)
		return
	}
	d.set(next)
}

// runInline makes the call on the caller's goroutine, under the watchdog.
func (x *sess) runInline(op Op, timeout time.Duration) error {
	c := &x.inline
	deadline := monoNow() + int64(timeout)
	c.deadline.Store(deadline)
	c.state.Store(callRunning)
	x.owner.dog.watch(deadline)
	err := x.exec()
	stalled := c.state.Swap(callIdle) == callStalled
	if stalled {
		x.owner.stalls.Add(-1) // the member answers again
	}
	x.state.Store(stIdle)
	x.cctx, x.fn, x.shotArg = nil, nil, nil
	if stalled {
		x.owner.unhold() // the watchdog's (fire)
	}
	return x.owner.errorOf(op, err)
}

// stalled returns the error of a call on an inline member while one of its
// calls is past its deadline, nil otherwise.
func (s *Slot) stalled(op Op) error {
	if s.stalls.Load() <= 0 {
		return nil
	}
	return &Error{Member: s.spec.Name, Op: op, Err: fmt.Errorf("%w: a call has been inside the module past its deadline (dispatch %s does not abandon it)", ErrTimeout, dispatch.Inline)}
}
