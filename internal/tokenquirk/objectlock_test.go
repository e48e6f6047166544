package tokenquirk

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestNeedsObjectLock(t *testing.T) {
	for _, c := range []struct {
		manufacturer, model string
		want                bool
	}{
		{"SoftHSM project                 ", "SoftHSM v2      ", true}, // as C_GetTokenInfo pads them
		{"SoftHSM project", "", true},
		{"Thales", "Luna K7", false},
		{"Mozilla Foundation              ", "NSS 3           ", false},
		{"Example HSMs Inc.", "X1", false},
		{"", "", false},
	} {
		// Every SoftHSM rule is SoftHSM's alone.
		for name, quirk := range map[string]func(string, string) bool{
			"NeedsObjectLock": NeedsObjectLock, "SerialCreations": SerialCreations, "GeneralErrorMeansOtherKey": GeneralErrorMeansOtherKey,
		} {
			if got := quirk(c.manufacturer, c.model); got != c.want {
				t.Errorf("%s(%q, %q) = %v, want %v", name, c.manufacturer, c.model, got, c.want)
			}
		}
	}
	var ls Locks
	if ls.For(1, "Thales", "Luna K7") != nil {
		t.Errorf("a Luna token got an object lock")
	}
	if a, b := ls.For(1, "SoftHSM project", "SoftHSM v2"), ls.For(1, "SoftHSM project", "SoftHSM v2"); a == nil || a != b {
		t.Errorf("one SoftHSM token got locks %p and %p, want one shared lock", a, b)
	}
}

// shortCtx bounds a wait that must not be granted.
func shortCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	t.Cleanup(cancel)
	return ctx
}

func TestObjectLockExcludes(t *testing.T) {
	var l ObjectLock
	ctx := t.Context()
	r1, err := l.Acquire(ctx, Read)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := l.Acquire(ctx, Read)
	if err != nil {
		t.Fatalf("a second reader: %v", err)
	}
	if _, err := l.Acquire(shortCtx(t), Write); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a writer while readers hold the lock: %v, want its ctx's error", err)
	}
	if _, err := l.Acquire(ctx, None); err != nil {
		t.Fatalf("a call that takes no lock: %v", err)
	}
	r1.Release()
	r2.Release()
	r2.Release() // harmless
	w, err := l.Acquire(ctx, Write)
	if err != nil {
		t.Fatalf("a writer once the readers let go: %v", err)
	}
	granted := make(chan error, 1)
	go func() {
		h, err := l.Acquire(ctx, Read)
		h.Release()
		granted <- err
	}()
	select {
	case err := <-granted:
		t.Fatalf("a reader got the lock (%v) while a writer held it", err)
	case <-time.After(50 * time.Millisecond):
	}
	w.Release()
	if err := <-granted; err != nil {
		t.Fatalf("the queued reader: %v", err)
	}
}

// A waiting writer keeps new readers out; giving up lets them in.
func TestObjectLockWriterWaiting(t *testing.T) {
	var l ObjectLock
	ctx := t.Context()
	r, _ := l.Acquire(ctx, Read)
	wctx, cancel := context.WithCancel(ctx)
	werr := make(chan error, 1)
	go func() {
		_, err := l.Acquire(wctx, Write)
		werr <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		l.mu.Lock()
		n := l.wanting
		l.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the writer never queued")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := l.Acquire(shortCtx(t), Read); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a new reader while a writer waits: %v, want its ctx's error", err)
	}
	cancel()
	if err := <-werr; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled writer: %v", err)
	}
	h, err := l.Acquire(shortCtx(t), Read)
	if err != nil {
		t.Fatalf("a reader once the writer gave up: %v", err)
	}
	h.Release()
	r.Release()
}

// A holder past its deadline makes conflicting callers fail at once.
func TestObjectLockStuck(t *testing.T) {
	var l ObjectLock
	ctx := t.Context()
	w, _ := l.Acquire(ctx, Write)
	w.Stuck()
	if _, err := l.Acquire(ctx, Read); !errors.Is(err, ErrStuck) {
		t.Fatalf("a reader behind a stuck writer: %v, want ErrStuck", err)
	}
	w.Release()
	w.Stuck() // after Release: harmless
	h, err := l.Acquire(shortCtx(t), Write)
	if err != nil {
		t.Fatalf("a writer once the stuck one let go: %v", err)
	}
	h.Release()
}
