package slot

import (
	"fmt"
	"sync/atomic"
	"time"
)

// Dispatch is how a member's calls reach its module (Spec.Dispatch).
type Dispatch string

// The dispatches.
const (
	// DispatchHandoff (the default) runs each call on the session's worker
	// while the caller waits for the answer, for the deadline or for its
	// ctx, whichever comes first. A module call cannot be cancelled: a call
	// given up is abandoned, its session quarantined and closed if the
	// call ever returns. The price is a hand-off per call.
	DispatchHandoff Dispatch = "handoff"
	// DispatchInline runs each call on the caller's goroutine (the
	// application's thread, in libhapkcs11.so): no hand-off, for
	// in-process software tokens that cannot hang (SoftHSM). Neither the
	// deadline nor ctx can interrupt a call: a hung call hangs its caller.
	// A watchdog marks the member stalled once a call outlives its
	// deadline; from then on every other call fails at once with
	// ErrTimeout (class health), so the group fails the member over, until
	// the hung call returns.
	DispatchInline Dispatch = "inline"
)

// Dispatches lists the valid values of Spec.Dispatch, default first.
var Dispatches = []Dispatch{DispatchHandoff, DispatchInline}

// ParseDispatch returns the dispatch named s ("" is the default).
func ParseDispatch(s string) (Dispatch, error) {
	switch d := Dispatch(s); d {
	case "":
		return DispatchHandoff, nil
	case DispatchHandoff, DispatchInline:
		return d, nil
	}
	return "", fmt.Errorf("unknown dispatch %q (want %q or %q)", s, DispatchHandoff, DispatchInline)
}

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

// watch is the inline watchdog of one call.
type watch struct {
	state    atomic.Int32 // watchRunning, watchDone or watchFired
	x        *sess
	t        atomic.Pointer[time.Timer]
	credited time.Duration // of x's wait for the object lock; fire's only
}

const (
	watchRunning int32 = iota
	watchDone
	watchFired
)

// fire marks the member stalled, unless the call spent part of its time
// waiting for the token's object lock: then it looks again as much later.
func (w *watch) fire() {
	if waited := w.x.lockWaited(); waited > w.credited && w.t.Load() != nil {
		w.t.Load().Reset(waited - w.credited)
		w.credited = waited
		return
	}
	if w.state.CompareAndSwap(watchRunning, watchFired) {
		w.x.owner.stalls.Add(1)
	}
}

// runInline makes the call on the caller's goroutine, under the watchdog.
func (x *sess) runInline(op Op, timeout time.Duration) error {
	w := &watch{x: x}
	t := time.AfterFunc(timeout, w.fire)
	w.t.Store(t)
	err := x.exec()
	t.Stop()
	if !w.state.CompareAndSwap(watchRunning, watchDone) {
		x.owner.stalls.Add(-1) // the member answers again
	}
	x.state.Store(stIdle)
	x.cctx, x.fn = nil, nil
	return newError(x.owner.spec.Name, op, err)
}

// stalled returns the error of a call on an inline member while one of its
// calls is past its deadline, nil otherwise.
func (s *Slot) stalled(op Op) error {
	if s.stalls.Load() <= 0 {
		return nil
	}
	return &Error{Member: s.spec.Name, Op: op, Err: fmt.Errorf("%w: a call has been inside the module past its deadline (dispatch %s does not abandon it)", ErrTimeout, DispatchInline)}
}
