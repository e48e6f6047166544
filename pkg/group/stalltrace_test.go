package group

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/slot"
)

// A bounded-stall test that fails must say what its slowest operations
// did: tracer records, for every operation signLoad makes, each module
// call it reached on a member (through the slot's interceptor, which sees
// the caller's context), so a failure shows which members an operation
// tried, when each call began and how long it took, and the gaps where it
// waited inside the group or the slot without reaching any module.

// opTrace is what one operation reached.
type opTrace struct {
	mu    sync.Mutex
	calls []tracedCall
}

type tracedCall struct {
	member     string
	op         slot.Op
	start, end time.Time // end zero: still in the module (hung)
	err        error
}

type traceKey struct{}

// traced returns ctx carrying a new trace.
func traced(ctx context.Context) (context.Context, *opTrace) {
	tr := &opTrace{}
	return context.WithValue(ctx, traceKey{}, tr), tr
}

// tracer is an interceptor that records each call into the trace of the
// context it is made under, around next (nil: none).
type tracer struct{ next slot.Interceptor }

func (t tracer) Before(ctx context.Context, token string, op slot.Op) error {
	return t.Wrap(ctx, token, op, func() error { return nil })
}

func (t tracer) Wrap(ctx context.Context, token string, op slot.Op, call func() error) error {
	tr, _ := ctx.Value(traceKey{}).(*opTrace)
	if tr == nil {
		return t.around(ctx, token, op, call)
	}
	tr.mu.Lock()
	i := len(tr.calls)
	tr.calls = append(tr.calls, tracedCall{member: token, op: op, start: time.Now()})
	tr.mu.Unlock()
	err := t.around(ctx, token, op, call)
	tr.mu.Lock()
	tr.calls[i].end, tr.calls[i].err = time.Now(), err
	tr.mu.Unlock()
	return err
}

func (t tracer) around(ctx context.Context, token string, op slot.Op, call func() error) error {
	switch ic := t.next.(type) {
	case nil:
		return call()
	case slot.WrapInterceptor:
		return ic.Wrap(ctx, token, op, call)
	default:
		if err := ic.Before(ctx, token, op); err != nil {
			return err
		}
		return call()
	}
}

// describe says what the operation o did, times relative to its start.
func (o opTime) describe(faultAt time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "began %v after the fault, took %v, error %v", o.start.Sub(faultAt).Round(time.Millisecond), o.end.Sub(o.start).Round(time.Millisecond), o.err)
	if o.trace == nil {
		return b.String()
	}
	o.trace.mu.Lock()
	defer o.trace.mu.Unlock()
	last := o.start
	for _, c := range o.trace.calls {
		took := "still in the module"
		if !c.end.IsZero() {
			took = fmt.Sprintf("took %v, error %v", c.end.Sub(c.start).Round(time.Millisecond), c.err)
		}
		fmt.Fprintf(&b, "\n\t+%v (%v after the last call that returned) %s on %s: %s",
			c.start.Sub(o.start).Round(time.Millisecond), c.start.Sub(last).Round(time.Millisecond), c.op, c.member, took)
		if !c.end.IsZero() {
			last = c.end
		}
	}
	if len(o.trace.calls) == 0 {
		b.WriteString("\n\treached no module")
	}
	fmt.Fprintf(&b, "\n\tended %v after the last module call returned", o.end.Sub(last).Round(time.Millisecond))
	return b.String()
}

// slowest returns the longest operation of l.
func (l load) slowest() opTime {
	var s opTime
	for _, o := range l.ops {
		if o.end.Sub(o.start) > s.end.Sub(s.start) {
			s = o
		}
	}
	return s
}

// starvation returns the longest signature that returned from a member
// other than victim and overlapped from–to: how long the machine alone
// held up a call then. (Only signatures: a call that reads or writes
// objects waits for the token's object lock inside the interceptor.)
func (l load) starvation(victim string, from, to time.Time) time.Duration {
	var d time.Duration
	for _, o := range l.ops {
		if o.trace == nil {
			continue
		}
		o.trace.mu.Lock()
		for _, c := range o.trace.calls {
			if c.op == slot.OpSign && c.member != victim && !c.end.IsZero() && c.start.Before(to) && c.end.After(from) {
				d = max(d, c.end.Sub(c.start))
			}
		}
		o.trace.mu.Unlock()
	}
	return d
}

// logSlowest logs what the n slowest operations of res did.
func logSlowest(t *testing.T, res load, faultAt time.Time, n int) {
	t.Helper()
	ops := slices.Clone(res.ops)
	slices.SortFunc(ops, func(a, b opTime) int { return cmp.Compare(b.end.Sub(b.start), a.end.Sub(a.start)) })
	for i, o := range ops[:min(n, len(ops))] {
		t.Logf("slowest operation %d: %s", i+1, o.describe(faultAt))
	}
}

// logMemberEvents logs the member state changes of f's group, times
// relative to the fault.
func logMemberEvents(t *testing.T, f *fixture, faultAt time.Time) {
	t.Helper()
	for _, e := range f.events.all() {
		if e.Member != "" && e.From != e.To {
			t.Logf("%v after the fault: %v %s %v→%v: %v", e.Time.Sub(faultAt).Round(time.Millisecond), e.Kind, e.Member, e.From, e.To, e.Err)
		}
	}
}
