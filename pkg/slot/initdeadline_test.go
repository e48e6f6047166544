package slot_test

import (
	"errors"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/slot"
)

// TestInitializeOutlastsAShortCommandTimeout: a member module's
// C_Initialize (where a network HSM's client connects) is given
// slot.MinInitializeTimeout even when command_timeout is far smaller, and
// no more than that when the server never answers. The server is stopped,
// so its client's C_Initialize hangs.
func TestInitializeOutlastsAShortCommandTimeout(t *testing.T) {
	t.Parallel()
	srv := testhsm.Serve(t, "slowinit")
	spec := specOf(srv.Token())
	spec.CommandTimeout = 200 * time.Millisecond
	srv.Stop()
	defer srv.Cont()
	start := time.Now()
	s, err := slot.Open(ctxT(t), spec)
	elapsed := time.Since(start)
	if err == nil {
		s.Close()
		t.Fatalf("Open with the server stopped succeeded")
	}
	if !errors.Is(err, slot.ErrTimeout) {
		t.Fatalf("Open with the server stopped: %v, want ErrTimeout", err)
	}
	if elapsed < slot.MinInitializeTimeout || elapsed > slot.MinInitializeTimeout+margin {
		t.Fatalf("Open with the server stopped gave up after %v; want between %v and %v (not command_timeout %v)",
			elapsed, slot.MinInitializeTimeout, slot.MinInitializeTimeout+margin, spec.CommandTimeout)
	}
}
