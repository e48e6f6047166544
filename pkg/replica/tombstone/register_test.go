package tombstone

import (
	"context"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
)

// faultyTokens opens n tokens with f at their slot boundary.
func faultyTokens(tb testing.TB, n int, f *slottest.Faults) []*slot.Slot {
	tb.Helper()
	var out []*slot.Slot
	for _, tok := range testhsm.Take(tb, n) {
		s, err := slot.Open(context.Background(), slot.Spec{Name: tok.Name, Module: tok.Module, ModuleEnv: tok.ModuleEnv,
			TokenLabel: tok.Label, PIN: secret.PINFromString(tok.UserPIN), CommandTimeout: 20 * time.Second, Interceptor: f})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { s.Close() })
		out = append(out, s)
	}
	return out
}

