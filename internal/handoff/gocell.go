package handoff

import (
	"sync/atomic"
	"time"
)

// Pair is what a caller and its worker meet on: a Cell, whose sides spin
// and then sleep on a futex in C, or a GoCell, whose sides park as
// goroutines. Both number the calls the same way and keep the same
// promises; only a Cell's worker makes shots.
type Pair interface {
	Post(shot bool) uint32
	Serve(last uint32, state *int32, job Job, spin time.Duration) (seq uint32, abandoned bool)
	Done(seq uint32)
	Drop()
	Cancel(seq uint32)
	Wait(seq uint32, spin, timeout time.Duration) Outcome
	WaitAnswer(seq uint32)
}

var (
	_ Pair = (*Cell)(nil)
	_ Pair = (*GoCell)(nil)
)

// GoCell is the meeting point of a pair whose calls are all made in Go (a
// token served over a socket, a call wrapped by an interceptor): the
// worker returns to Go for every call anyway, and such a call may take
// milliseconds. A side that waits that long inside a C call holds its
// thread and leaves its P in a system call, for the runtime's monitor to
// take back every few tens of µs and to hand on with a thread woken for it;
// timers of that P fire late meanwhile. Parked goroutines hold neither.
// Make it with NewGoCell; it must not be copied.
type GoCell struct {
	req, res, cancel atomic.Uint32 // as in hg_cell
	posted           chan struct{} // a post the worker may not have seen
	woken            chan struct{} // an answer or a cancel the caller may not have seen
	timer            *time.Timer   // the caller's deadline (one call at a time)
}

// NewGoCell returns a GoCell ready for its first call.
func NewGoCell() *GoCell {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &GoCell{posted: make(chan struct{}, 1), woken: make(chan struct{}, 1), timer: t}
}

// notify leaves a token in ch unless one is there already: the side woken
// looks at the words again, so tokens may merge or be stale.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Post announces a call to the worker and returns its sequence number. A
// GoCell's worker makes no shots: shot must be false.
func (c *GoCell) Post(shot bool) uint32 {
	if shot {
		panic("handoff: a GoCell's worker makes no shots")
	}
	seq := c.req.Add(1)
	notify(c.posted)
	return seq
}

// Serve waits for the call after last and returns it; the worker makes it
// and answers with Done (or ends with Drop). It never reports an abandoned
// shot, having none.
func (c *GoCell) Serve(last uint32, _ *int32, _ Job, _ time.Duration) (uint32, bool) {
	for {
		if r := c.req.Load(); r != last {
			return r, false
		}
		<-c.posted
	}
}

// Done tells the caller that call seq is answered.
func (c *GoCell) Done(seq uint32) {
	c.res.Store(seq)
	notify(c.woken)
}

// Drop ends the worker's part in a call it will not answer.
func (c *GoCell) Drop() {}

// Cancel makes the caller's Wait for call seq return Cancelled, unless it
// was answered first.
func (c *GoCell) Cancel(seq uint32) {
	c.cancel.Store(seq)
	notify(c.woken)
}

// look is how call seq stands: answered first, then cancelled.
func (c *GoCell) look(seq uint32, cancellable bool) (Outcome, bool) {
	if c.res.Load() == seq {
		return Answered, true
	}
	if cancellable && c.cancel.Load() == seq {
		return Cancelled, true
	}
	return 0, false
}

// Wait blocks the caller until call seq is answered, cancelled or timeout
// passes. It does not spin: a call made in Go is not answered within a
// spin's time.
func (c *GoCell) Wait(seq uint32, _, timeout time.Duration) Outcome {
	if o, ok := c.look(seq, true); ok {
		return o
	}
	if timeout <= 0 {
		return TimedOut
	}
	c.timer.Reset(timeout)
	defer c.timer.Stop()
	for {
		select {
		case <-c.woken:
		case <-c.timer.C:
			if o, ok := c.look(seq, true); ok {
				return o
			}
			return TimedOut
		}
		if o, ok := c.look(seq, true); ok {
			return o
		}
	}
}

// WaitAnswer blocks the caller until call seq is answered, whatever the
// time and any cancel.
func (c *GoCell) WaitAnswer(seq uint32) {
	for {
		if _, ok := c.look(seq, false); ok {
			return
		}
		<-c.woken
	}
}
