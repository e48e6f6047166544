package gate

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
)

// A holder waits for the writer inside and keeps a new writer out until
// it releases.
func TestHoldWaitsForWritersAndKeepsNewOnesOut(t *testing.T) {
	var b Barrier
	ctx := context.Background()
	if err := b.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	held := make(chan error, 1)
	go func() { held <- b.Hold(ctx) }()
	for !b.isHeld() {
		runtime.Gosched() // until the holder has closed the barrier
	}

	// A writer that arrives while the holder waits is kept out: its
	// context ends first.
	waiting, cancel := context.WithCancel(ctx)
	entered := make(chan error, 1)
	go func() { entered <- b.Enter(waiting) }()
	select {
	case err := <-held:
		t.Fatalf("Hold returned (%v) while a writer was inside", err)
	default:
	}
	b.Leave()
	if err := <-held; err != nil {
		t.Fatalf("Hold: %v", err)
	}
	cancel()
	if err := <-entered; !errors.Is(err, context.Canceled) {
		t.Fatalf("Enter while held: %v, want context.Canceled", err)
	}
	b.Release()
	if err := b.Enter(ctx); err != nil {
		t.Fatalf("Enter after Release: %v", err)
	}
	b.Leave()
}

// A Hold whose context ends while writers stay inside gives up and leaves
// the barrier open.
func TestHoldGivesUpAtItsDeadline(t *testing.T) {
	var b Barrier
	if err := b.Enter(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := b.Hold(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Hold with a writer inside: %v, want its deadline", err)
	}
	if err := b.Enter(context.Background()); err != nil {
		t.Fatalf("Enter after a Hold gave up: %v", err)
	}
	b.Leave()
	b.Leave()
}

func (b *Barrier) isHeld() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held
}
