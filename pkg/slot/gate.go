package slot

import (
	"context"
	"sync"
	"sync/atomic"
)

// gate lets module calls run concurrently while no writer (Reinit, Close)
// holds it, and lets a writer wait until no call is in flight. Entering is
// two atomic adds when there is no writer; a blocked enter honours its ctx,
// which sync.RWMutex cannot.
//
// At most one writer at a time: writers are serialised by Slot.mu.
type gate struct {
	state atomic.Int64 // calls inside, plus writerBit while a writer holds or wants the gate

	mu      sync.Mutex
	open    chan struct{} // closed when the current writer leaves
	drained chan struct{} // closed when the last call leaves while a writer waits
	closedD bool          // drained has been closed
}

const writerBit = int64(1) << 40

// enter admits a call, waiting (bounded by ctx) while a writer holds the gate.
func (g *gate) enter(ctx context.Context) error {
	for {
		if g.state.Add(1)&writerBit == 0 {
			return nil
		}
		g.leave()
		g.mu.Lock()
		open := g.open
		g.mu.Unlock()
		if open == nil {
			continue // the writer has just left
		}
		select {
		case <-open:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// leave lets a call out; the last one out wakes a waiting writer.
func (g *gate) leave() {
	if g.state.Add(-1) == writerBit {
		g.mu.Lock()
		if g.drained != nil && !g.closedD {
			g.closedD = true
			close(g.drained)
		}
		g.mu.Unlock()
	}
}

// lock shuts the gate to new calls and waits (bounded by ctx) until every
// call inside has left. On error the gate is open again.
func (g *gate) lock(ctx context.Context) error {
	g.mu.Lock()
	g.open = make(chan struct{})
	g.drained = make(chan struct{})
	g.closedD = false
	drained := g.drained
	g.mu.Unlock()
	if g.state.Add(writerBit) == writerBit {
		return nil
	}
	select {
	case <-drained:
		return nil
	case <-ctx.Done():
		g.unlock()
		return ctx.Err()
	}
}

// unlock opens the gate again.
func (g *gate) unlock() {
	g.mu.Lock()
	g.state.Add(-writerBit)
	close(g.open)
	g.open = nil
	g.drained = nil
	g.mu.Unlock()
}
