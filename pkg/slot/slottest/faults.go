// Package slottest injects faults at the pkg/slot boundary: a Faults value
// is a slot.Interceptor that makes a token's operations fail, hang, slow
// down or queue, per token and per operation, until told otherwise.
// Everything is deterministic: no randomness, no timing guesses.
//
//	f := slottest.NewFaults()
//	spec.Interceptor = f
//	f.Fail("hsm-a", slot.OpSign, pkcs11.Error(pkcs11.CKR_DEVICE_ERROR))
//	…
//	f.Heal("hsm-a")
package slottest

import (
	"context"
	"sync"
	"time"

	"github.com/hagroup/hagroup/pkg/slot"
)

// All is the op that stands for every operation in rules and counts.
const All slot.Op = ""

// Faults is a slot.Interceptor (and slot.WrapInterceptor) holding fault
// rules per token (slot.Spec.Name). Safe for concurrent use.
type Faults struct {
	mu      sync.Mutex
	tokens  map[string]*token
	changed chan struct{} // closed and replaced on every change waiters care about
}

// token holds one token's rules and counters.
type token struct {
	fail    map[slot.Op]failRule
	hang    map[slot.Op]bool
	delay   map[slot.Op]time.Duration
	release chan struct{} // closed by Release/Heal: hung and delayed calls go on
	sem     chan struct{} // Capacity: one entry per call running; nil = unlimited
	calls   map[slot.Op]int
	hung    int // calls blocked in a Hang now
	lose    map[slot.Op]bool
}

type failRule struct {
	err  error
	left int // calls still to fail; <0 = until healed
}

var _ slot.Interceptor = (*Faults)(nil)
var _ slot.WrapInterceptor = (*Faults)(nil)

// NewFaults returns a Faults with no rules: every call goes through.
func NewFaults() *Faults {
	return &Faults{tokens: make(map[string]*token), changed: make(chan struct{})}
}

func (f *Faults) tok(name string) *token {
	t, ok := f.tokens[name]
	if !ok {
		t = &token{
			fail:    make(map[slot.Op]failRule),
			hang:    make(map[slot.Op]bool),
			delay:   make(map[slot.Op]time.Duration),
			release: make(chan struct{}),
			calls:   make(map[slot.Op]int),
			lose:    make(map[slot.Op]bool),
		}
		f.tokens[name] = t
	}
	return t
}

// notify wakes the waiters. Callers hold f.mu.
func (f *Faults) notify() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// Fail makes op (All: every op) on token return err, until Heal. err is
// normally a pkcs11.Error, which the slot classifies like the module's own.
func (f *Faults) Fail(token string, op slot.Op, err error) { f.FailN(token, op, err, -1) }

// FailAll makes every op on token return err, until Heal.
func (f *Faults) FailAll(token string, err error) { f.Fail(token, All, err) }

// FailN makes the next n calls of op (All: any op) on token return err.
func (f *Faults) FailN(token string, op slot.Op, err error, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tok(token).fail[op] = failRule{err: err, left: n}
}

// LoseAnswer makes the token's op calls go through and their answers get
// lost: the module does the work (a key generated stays on the token) and
// the caller gets slot.ErrTimeout, as from a member that died before it
// answered. Until Heal.
func (f *Faults) LoseAnswer(token string, op slot.Op) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tok(token).lose[op] = true
}

// Hang makes op (All: every op) on token block, as a hung module would,
// until Release or Heal. The caller gets slot.ErrTimeout at its deadline.
func (f *Faults) Hang(token string, op slot.Op) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tok(token).hang[op] = true
}

// Release lets every call hung on token go on (to the module) and removes
// the token's Hang rules.
func (f *Faults) Release(token string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.tok(token)
	clear(t.hang)
	close(t.release)
	t.release = make(chan struct{})
}

// Delay makes op (All: every op) on token take d longer.
func (f *Faults) Delay(token string, op slot.Op, d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tok(token).delay[op] = d
}

// Capacity lets at most n calls into token at once; others queue in call
// order, like a single-threaded server connection. n <= 0 removes the limit
// for calls that start afterwards.
func (f *Faults) Capacity(token string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.tok(token)
	if n <= 0 {
		t.sem = nil
		return
	}
	t.sem = make(chan struct{}, n)
}

// Heal removes every rule of token and lets hung and delayed calls go on.
// Counters are kept.
func (f *Faults) Heal(token string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.tok(token)
	clear(t.fail)
	clear(t.hang)
	clear(t.delay)
	clear(t.lose)
	t.sem = nil
	close(t.release)
	t.release = make(chan struct{})
}

// Calls returns how many calls of op (All: of any op) reached the
// interceptor for token, failed ones included.
func (f *Faults) Calls(token string, op slot.Op) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.tok(token)
	if op != All {
		return t.calls[op]
	}
	n := 0
	for _, c := range t.calls {
		n += c
	}
	return n
}

// Hung returns how many calls on token are blocked in a Hang right now.
func (f *Faults) Hung(token string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tok(token).hung
}

// WaitHung waits until at least n calls on token are blocked in a Hang, or
// ctx ends.
func (f *Faults) WaitHung(ctx context.Context, token string, n int) error {
	return f.wait(ctx, func() bool { return f.tok(token).hung >= n })
}

// WaitCalls waits until at least n calls of op (All: any) reached token, or
// ctx ends.
func (f *Faults) WaitCalls(ctx context.Context, token string, op slot.Op, n int) error {
	return f.wait(ctx, func() bool {
		t := f.tok(token)
		if op != All {
			return t.calls[op] >= n
		}
		c := 0
		for _, v := range t.calls {
			c += v
		}
		return c >= n
	})
}

func (f *Faults) wait(ctx context.Context, done func() bool) error {
	for {
		f.mu.Lock()
		ok := done()
		ch := f.changed
		f.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// rule returns the rule for op, falling back to the All rule.
func rule[V any](m map[slot.Op]V, op slot.Op) (V, bool) {
	if v, ok := m[op]; ok {
		return v, true
	}
	v, ok := m[All]
	return v, ok
}

// Before implements slot.Interceptor: it counts the call and applies the
// token's fail, delay and hang rules (in that order). The slot calls Wrap
// instead, which also applies Capacity.
func (f *Faults) Before(ctx context.Context, name string, op slot.Op) error {
	return f.Wrap(ctx, name, op, func() error { return nil })
}

// Wrap implements slot.WrapInterceptor: it counts the call, then applies
// the token's rules in this order: fail, capacity (held until call
// returns), delay, hang; then makes the call.
func (f *Faults) Wrap(ctx context.Context, name string, op slot.Op, call func() error) error {
	f.mu.Lock()
	t := f.tok(name)
	t.calls[op]++
	f.notify()
	if r, ok := rule(t.fail, op); ok && r.left != 0 {
		key := op
		if _, own := t.fail[op]; !own {
			key = All
		}
		if r.left > 0 {
			r.left--
			t.fail[key] = r
		}
		f.mu.Unlock()
		return r.err
	}
	sem := t.sem
	d, slow := rule(t.delay, op)
	// Taken with the count: a Heal that follows the count (WaitCalls) ends
	// this call's delay.
	delayed := t.release
	f.mu.Unlock()

	if sem != nil {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		defer func() { <-sem }()
	}
	if slow && d > 0 {
		timer := time.NewTimer(d)
		select {
		case <-timer.C:
		case <-delayed:
			timer.Stop()
		}
	}
	f.mu.Lock()
	if _, h := rule(t.hang, op); h {
		release := t.release
		t.hung++
		f.notify()
		f.mu.Unlock()
		<-release
		f.mu.Lock()
		t.hung--
		f.notify()
	}
	_, lost := rule(t.lose, op)
	f.mu.Unlock()
	if err := call(); err != nil || !lost {
		return err
	}
	return slot.ErrTimeout
}
