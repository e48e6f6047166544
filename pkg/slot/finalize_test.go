package slot_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/dispatch"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
)

// TestModuleOutlivesACallGivenUpOn: a module's context is not finalized
// while a call its caller gave up on still runs on it — C_Finalize under
// another thread's call is undefined (PKCS#11 v2.40, 5.4), and SoftHSM
// died with SIGSEGV in C_GetTokenInfo that way: a token lookup abandoned
// at Open's deadline while the last slot on the module closed. The last
// such call finalizes it when it returns, unless a slot took the module up
// again meanwhile. The module is a copy of SoftHSM with a token directory
// of its own, so no other test shares its context.
// ownModule returns a copy of SoftHSM with a token directory of its own
// holding one token, and the spec of that token (no PIN), so that no other
// test shares the module's context.
func ownModule(t *testing.T) (string, slot.Spec) {
	t.Helper()
	dir := t.TempDir()
	lib := filepath.Join(dir, "libsofthsm2-own.so")
	body, err := os.ReadFile(testhsm.SoftHSMModule)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lib, body, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "tokens"), 0o700); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "softhsm2.conf")
	text := fmt.Sprintf("directories.tokendir = %s\nobjectstore.backend = file\nlog.level = ERROR\n", filepath.Join(dir, "tokens"))
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := testhsm.InitTokens(ctxT(t), conf, []string{"own"}, testhsm.UserPIN, testhsm.SOPIN); err != nil {
		t.Fatal(err)
	}
	return lib, slot.Spec{Name: "own", Module: lib, ModuleEnv: map[string]string{"SOFTHSM2_CONF": conf}, TokenLabel: "own"}
}

// moduleCounts fails t unless module lib has inside calls given up on
// running on it and was initialised inits and finalized finals times.
func moduleCounts(t *testing.T, lib, when string, inside, inits, finals int) {
	t.Helper()
	_, i, f := slot.ModuleCounts(lib)
	if n := slot.ModuleCallsInside(lib); n != inside || i != inits || f != finals {
		t.Fatalf("%s: %d calls inside, %d C_Initialize, %d C_Finalize; want %d, %d, %d", when, n, i, f, inside, inits, finals)
	}
}

// eventually waits until cond holds, failing t after 20 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20 s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestModuleOutlivesACallGivenUpOn(t *testing.T) {
	t.Parallel()
	lib, spec := ownModule(t)
	faults := slottest.NewFaults()
	hung := spec
	hung.Interceptor = faults
	// giveUp opens the hung spec and gives up once its token lookup is
	// inside the module (here: held by the fault, as a hung module would).
	giveUp := func() {
		t.Helper()
		faults.Hang(spec.Name, slot.OpTokenInfo)
		ctx, cancel := context.WithCancel(ctxT(t))
		done := make(chan error, 1)
		go func() {
			s, err := slot.Open(ctx, hung)
			if err == nil {
				s.Close()
			}
			done <- err
		}()
		if err := faults.WaitHung(ctxT(t), spec.Name, 1); err != nil {
			t.Fatalf("the lookup never hung: %v", err)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Open given up on: %v, want context.Canceled", err)
		}
	}

	giveUp()
	moduleCounts(t, lib, "the only user gave up on its lookup", 1, 1, 0)

	s, err := slot.Open(ctxT(t), spec)
	if err != nil {
		t.Fatalf("Open while a lookup given up on is inside the module: %v", err)
	}
	moduleCounts(t, lib, "a new slot took the module up", 1, 1, 0)
	faults.Release(spec.Name)
	eventually(t, "the released lookup returns", func() bool { return slot.ModuleCallsInside(lib) == 0 })
	moduleCounts(t, lib, "the lookup returned while the new slot holds the module", 0, 1, 0)
	if _, err := s.TokenInfo(ctxT(t)); err != nil {
		t.Fatalf("TokenInfo on the slot that took the module up: %v", err)
	}

	giveUp()
	s.Close()
	moduleCounts(t, lib, "the last slot closed while a lookup given up on is inside", 1, 1, 0)
	faults.Release(spec.Name)
	eventually(t, "the module is finalized once the lookup returned", func() bool {
		_, _, f := slot.ModuleCounts(lib)
		return f == 1
	})
	moduleCounts(t, lib, "after the last call returned", 0, 1, 1)
}

// TestModuleOutlivesAStalledInlineCall: under dispatch inline a call past
// its deadline is not abandoned (the caller is inside it); the slot's
// Close does not wait for it beyond its bound, and the module is
// finalized only once the call returns, as after an abandoned one.
func TestModuleOutlivesAStalledInlineCall(t *testing.T) {
	t.Parallel()
	lib, spec := ownModule(t)
	spec.Dispatch = dispatch.Inline
	spec.CommandTimeout = 200 * time.Millisecond
	spec.KeygenTimeout = 300 * time.Millisecond // bounds Close's wait for calls in flight
	faults := slottest.NewFaults()
	spec.Interceptor = faults
	s, err := slot.Open(ctxT(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	faults.Hang(spec.Name, slot.OpGenerateRandom)
	hung := make(chan error, 1)
	go func() {
		_, err := s.GenerateRandom(ctxT(t), 4)
		hung <- err
	}()
	if err := faults.WaitHung(ctxT(t), spec.Name, 1); err != nil {
		t.Fatalf("the call never hung: %v", err)
	}
	eventually(t, "the watchdog marks the hung call stalled", func() bool {
		_, err := s.TokenInfo(ctxT(t))
		return errors.Is(err, slot.ErrTimeout)
	})
	s.Close()
	moduleCounts(t, lib, "the slot closed while its inline call is stalled", 0, 1, 0)
	faults.Release(spec.Name)
	if err := <-hung; err != nil {
		t.Fatalf("the stalled call once the module answered: %v", err)
	}
	eventually(t, "the module is finalized once the stalled call returned", func() bool {
		_, _, f := slot.ModuleCounts(lib)
		return f == 1
	})
	moduleCounts(t, lib, "after the stalled call returned", 0, 1, 1)
}
