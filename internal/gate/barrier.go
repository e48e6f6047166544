package gate

import (
	"context"
	"sync"
)

// Barrier lets many writers through at once, or one holder alone. A
// holder waiting for the writers in progress keeps new writers out, so
// writers under load cannot starve it. The zero value is open.
type Barrier struct {
	mu      sync.Mutex
	writers int
	held    bool
	open    chan struct{} // closed when the holder releases
	idle    chan struct{} // closed when the last writer leaves while held
}

// waitUnheld returns with b.mu held and no holder, or the cause of ctx's
// end (b.mu not held). b.mu is held on entry.
func (b *Barrier) waitUnheld(ctx context.Context) error {
	for b.held {
		ch := b.open
		b.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		b.mu.Lock()
	}
	return nil
}

// Enter lets one writer through, waiting (bounded by ctx) while the
// barrier is held. A writer let through must Leave.
func (b *Barrier) Enter(ctx context.Context) error {
	b.mu.Lock()
	if err := b.waitUnheld(ctx); err != nil {
		return err
	}
	b.writers++
	b.mu.Unlock()
	return nil
}

// Leave ends a writer that Enter let through.
func (b *Barrier) Leave() {
	b.mu.Lock()
	b.writers--
	if b.writers == 0 && b.idle != nil {
		close(b.idle)
		b.idle = nil
	}
	b.mu.Unlock()
}

// Hold closes the barrier: it waits (bounded by ctx) for another holder to
// release and for the writers in progress to leave, keeping new ones out
// meanwhile. A holder must Release.
func (b *Barrier) Hold(ctx context.Context) error {
	b.mu.Lock()
	if err := b.waitUnheld(ctx); err != nil {
		return err
	}
	b.held = true
	b.open = make(chan struct{})
	if b.writers == 0 {
		b.mu.Unlock()
		return nil
	}
	idle := make(chan struct{})
	b.idle = idle
	b.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		b.Release()
		return context.Cause(ctx)
	}
}

// Release opens a held barrier; releasing an open one does nothing.
func (b *Barrier) Release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.held {
		return
	}
	b.held = false
	b.idle = nil
	close(b.open)
}
