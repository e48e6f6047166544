package gate

import (
	"errors"
	"testing"
)

var errClosed = errors.New("closed")

// Close waits for the call inside, and refuses calls after it.
func TestCloseWaitsForTheCallInside(t *testing.T) {
	g := New(errClosed)
	if err := g.Enter(); err != nil {
		t.Fatalf("Enter on an open gate: %v", err)
	}
	closed := make(chan struct{})
	go func() { g.Close(); close(closed) }()
	for !g.Closed() {
		select {
		case <-closed:
			t.Fatal("Close returned while a call was inside")
		default:
		}
	}
	if err := g.Enter(); !errors.Is(err, errClosed) {
		t.Fatalf("Enter on a closing gate: %v, want its refusal", err)
	}
	select {
	case <-closed:
		t.Fatal("Close returned while a call was inside")
	default:
	}
	g.Leave()
	<-closed
	if err := g.Enter(); !errors.Is(err, errClosed) {
		t.Fatalf("Enter on a closed gate: %v, want its refusal", err)
	}
}

// Close of a gate nobody is in returns at once.
func TestCloseOfAnIdleGate(t *testing.T) {
	g := New(errClosed)
	if err := g.Enter(); err != nil {
		t.Fatal(err)
	}
	g.Leave()
	g.Close()
	if !g.Closed() {
		t.Fatal("not closed after Close")
	}
}
