package state

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

func TestMain(m *testing.M) { os.Exit(testhsm.Main(m, 8)) }

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// openSlot opens tok logged in as the user.
func openSlot(t *testing.T, tok testhsm.Token, ic slot.Interceptor) *slot.Slot {
	t.Helper()
	s, err := slot.Open(testContext(t), slot.Spec{
		Name:           tok.Name,
		Module:         tok.Module,
		ModuleEnv:      tok.ModuleEnv,
		InitArgs:       tok.InitArgs,
		TokenLabel:     tok.Label,
		PIN:            secret.PINFromString(tok.UserPIN),
		CommandTimeout: 10 * time.Second,
		Interceptor:    ic,
	})
	if err != nil {
		t.Fatalf("open %s: %v", tok.Name, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// openN takes n fresh tokens and opens them.
func openN(t *testing.T, n int) ([]*slot.Slot, []testhsm.Token) {
	t.Helper()
	toks := testhsm.Take(t, n)
	ss := make([]*slot.Slot, n)
	for i, tok := range toks {
		ss[i] = openSlot(t, tok, nil)
	}
	return ss, toks
}

func attr(t uint, v any) *pkcs11.Attribute { return pkcs11.NewAttribute(t, v) }
