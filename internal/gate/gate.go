// Package gate lets an owner close while calls are in flight: every call
// enters and leaves, Close refuses new calls and waits for those inside,
// and the hot path takes no lock.
package gate

import (
	"sync"
	"sync/atomic"
)

// Gate is open until Close. Its zero value is not ready: use New.
type Gate struct {
	n      atomic.Int64
	closed atomic.Bool
	once   sync.Once
	idle   chan struct{}
	refuse error
}

// New returns an open gate whose Enter answers refuse once it is closed.
func New(refuse error) *Gate { return &Gate{idle: make(chan struct{}), refuse: refuse} }

// Enter lets a call in, or answers the gate's refusal once it is closed.
// A call let in must Leave.
func (g *Gate) Enter() error {
	g.n.Add(1)
	if g.closed.Load() {
		g.Leave()
		return g.refuse
	}
	return nil
}

// Leave ends a call that Enter let in.
func (g *Gate) Leave() {
	if g.n.Add(-1) == 0 && g.closed.Load() {
		g.once.Do(func() { close(g.idle) })
	}
}

// Closed reports whether Close was called.
func (g *Gate) Closed() bool { return g.closed.Load() }

// Close refuses new calls and waits for those inside to leave.
func (g *Gate) Close() {
	g.closed.Store(true)
	if g.n.Load() == 0 {
		return
	}
	<-g.idle
}
