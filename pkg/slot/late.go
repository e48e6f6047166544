package slot

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/hagroup/hagroup/internal/handoff"
	"github.com/hagroup/hagroup/pkg/slot/dispatch"
)

// Late lets the caller of a module call act when the member has not
// answered within After, without a goroutine or a timer of its own: the
// caller's wait for the worker's answer comes back at After, runs Fire on
// the caller's goroutine (once for all the calls made with it), and waits
// on for the rest of the call's deadline. Overtake, from any goroutine,
// ends that wait: the call returns an error wrapping ErrOvertaken and is
// abandoned as a timed-out call is (its session is closed once the module
// returns). A hedged request (pkg/group) fires its hedge this way, so that
// a call answered in time, nearly every call, costs what an unhedged one
// does. Only handed-off calls honour it (HandsOff): an inline call has no
// wait to come back from. It must not be copied once used.
type Late struct {
	After time.Duration
	Fire  func()

	mu        sync.Mutex
	fired     bool
	overtaken bool
	cell      handoff.Pair // the wait Overtake ends, once fired
	seq       uint32
	deadline  time.Time     // of the call waiting
	left      bool          // a call was abandoned when overtaken
	back      chan struct{} // closed when an overtaken call has returned from the module
}

// ErrOvertaken: the caller took another member's answer while this one
// was late (Late.Overtake). Class: request, the caller's decision.
var ErrOvertaken = errors.New("another member answered first")

type lateKey struct{}

// WithLate returns ctx carrying l for the calls made with it.
func WithLate(ctx context.Context, l *Late) context.Context {
	return context.WithValue(ctx, lateKey{}, l)
}

// Overtake ends the late call's wait, if it is still waiting.
func (l *Late) Overtake() {
	l.mu.Lock()
	l.overtaken = true
	c, seq := l.cell, l.seq
	l.mu.Unlock()
	if c != nil {
		c.Cancel(seq) // (ignored once seq is answered)
	}
}

// wait is Cell.Wait for call seq on c within timeout, with l: Fire at
// After (unless it fired for an earlier call), and Overtake's cancel from
// then on.
func (l *Late) wait(c handoff.Pair, seq uint32, timeout time.Duration) handoff.Outcome {
	l.mu.Lock()
	fired, overtaken := l.fired, l.overtaken
	if fired {
		l.cell, l.seq = c, seq
	}
	l.deadline = time.Now().Add(timeout)
	l.mu.Unlock()
	if !fired {
		if o := c.Wait(seq, callerSpin, l.After); o != handoff.TimedOut {
			return o
		}
		l.mu.Lock()
		l.fired, l.cell, l.seq = true, c, seq
		l.mu.Unlock()
		l.Fire()
		timeout -= l.After
	} else if overtaken {
		c.Cancel(seq)
	}
	return c.Wait(seq, callerSpin, timeout)
}

// Overtaken says, once the call made with l returned ErrOvertaken, whether
// a call was abandoned in the module then (ok: none when the module had
// answered it just before), when the module returns it (back is closed
// then) and by when it should have (its deadline): the caller that took
// another member's answer charges the member if the call outlives its
// deadline, as it would have charged a call it waited for.
func (l *Late) Overtaken() (back <-chan struct{}, deadline time.Time, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.back == nil {
		l.back = make(chan struct{})
	}
	return l.back, l.deadline, l.left
}

// abandoned records that a call made with l was abandoned when overtaken.
func (l *Late) abandoned() {
	l.mu.Lock()
	l.left = true
	l.mu.Unlock()
}

// returned tells Overtaken's waiter that an abandoned call returned (the
// first to: a call the module answered after its caller took another's).
func (l *Late) returned() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.back == nil {
		l.back = make(chan struct{})
	}
	select {
	case <-l.back:
	default:
		close(l.back)
	}
}

func (l *Late) wasOvertaken() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.overtaken
}

// lateFor is the Late a call is made with under ctx, when it may fire
// before timeout.
func lateFor(ctx context.Context, timeout time.Duration) *Late {
	l, _ := ctx.Value(lateKey{}).(*Late)
	if l == nil || l.After <= 0 || l.After >= timeout {
		return nil
	}
	return l
}

// HandsOff reports whether the slot's calls are made on workers
// (dispatch handoff), so that a caller may leave a late one (Late).
func (s *Slot) HandsOff() bool { return s.spec.Dispatch != dispatch.Inline }
