package slottest_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var errDev = pkcs11.Error(pkcs11.CKR_DEVICE_ERROR)

// call runs one call through f the way pkg/slot does.
func call(f *slottest.Faults, token string, op slot.Op) (ran bool, err error) {
	err = f.Wrap(context.Background(), token, op, func() error {
		ran = true
		return nil
	})
	return ran, err
}

func TestFailRules(t *testing.T) {
	t.Parallel()
	f := slottest.NewFaults()
	if ran, err := call(f, "a", slot.OpSign); !ran || err != nil {
		t.Fatalf("no rules: ran %v, err %v", ran, err)
	}
	f.Fail("a", slot.OpSign, errDev)
	if ran, err := call(f, "a", slot.OpSign); ran || !errors.Is(err, errDev) {
		t.Fatalf("Fail(Sign): ran %v, err %v; want the error, no call", ran, err)
	}
	if ran, err := call(f, "a", slot.OpVerify); !ran || err != nil {
		t.Fatalf("Fail(Sign) affected Verify: %v", err)
	}
	if ran, err := call(f, "b", slot.OpSign); !ran || err != nil {
		t.Fatalf("Fail on token a affected token b: %v", err)
	}
	f.FailAll("a", pkcs11.Error(pkcs11.CKR_TOKEN_NOT_PRESENT))
	if _, err := call(f, "a", slot.OpVerify); !errors.Is(err, pkcs11.Error(pkcs11.CKR_TOKEN_NOT_PRESENT)) {
		t.Fatalf("FailAll: Verify got %v", err)
	}
	if _, err := call(f, "a", slot.OpSign); !errors.Is(err, errDev) {
		t.Fatalf("an op's own rule should win over FailAll: %v", err)
	}
	f.Heal("a")
	if ran, err := call(f, "a", slot.OpSign); !ran || err != nil {
		t.Fatalf("after Heal: ran %v, err %v", ran, err)
	}

	f.FailN("a", slot.OpDigest, errDev, 2)
	for i, want := range []bool{true, true, false, false} {
		_, err := call(f, "a", slot.OpDigest)
		if got := err != nil; got != want {
			t.Fatalf("FailN(2) call %d: err %v", i, err)
		}
	}
	if got := f.Calls("a", slot.OpDigest); got != 4 {
		t.Fatalf("Calls(Digest) = %d, want 4", got)
	}
	if got, want := f.Calls("a", slottest.All), 10; got != want {
		t.Fatalf("Calls(All) = %d, want %d", got, want)
	}
}

func TestHangAndRelease(t *testing.T) {
	t.Parallel()
	f := slottest.NewFaults()
	f.Hang("a", slot.OpSign)
	const n = 3
	var done atomic.Int32
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ran, err := call(f, "a", slot.OpSign); !ran || err != nil {
				t.Errorf("released call: ran %v, err %v", ran, err)
			}
			done.Add(1)
		}()
	}
	if err := f.WaitHung(ctxT(t), "a", n); err != nil {
		t.Fatalf("calls never hung: %v", err)
	}
	if done.Load() != 0 || f.Hung("a") != n {
		t.Fatalf("hung calls finished before Release")
	}
	// Other ops and tokens go through meanwhile.
	if ran, err := call(f, "a", slot.OpVerify); !ran || err != nil {
		t.Fatalf("Verify while Sign hangs: %v", err)
	}
	f.Release("a")
	wg.Wait()
	if f.Hung("a") != 0 {
		t.Fatalf("Hung = %d after Release", f.Hung("a"))
	}
	// Release removed the rule.
	if ran, err := call(f, "a", slot.OpSign); !ran || err != nil {
		t.Fatalf("Sign after Release: %v", err)
	}

	// Heal releases too.
	f.Hang("a", slottest.All)
	errc := make(chan error, 1)
	go func() { _, err := call(f, "a", slot.OpDigest); errc <- err }()
	if err := f.WaitHung(ctxT(t), "a", 1); err != nil {
		t.Fatal(err)
	}
	f.Heal("a")
	if err := <-errc; err != nil {
		t.Fatalf("call released by Heal: %v", err)
	}
}

func TestCapacityQueues(t *testing.T) {
	t.Parallel()
	f := slottest.NewFaults()
	f.Capacity("a", 2)
	var running, peak atomic.Int32
	gate := make(chan struct{})
	inside := make(chan struct{}, 8)
	var wg sync.WaitGroup
	const n = 8
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.Wrap(context.Background(), "a", slot.OpSign, func() error {
				r := running.Add(1)
				for {
					p := peak.Load()
					if r <= p || peak.CompareAndSwap(p, r) {
						break
					}
				}
				inside <- struct{}{}
				<-gate
				running.Add(-1)
				return nil
			})
		}()
	}
	// Two are inside at once before any leaves (counted in running before
	// they say so); the rest queue, and each enters as one leaves. (Counting
	// the calls alone does not say the second one is inside yet.)
	deadline := ctxT(t)
	for i := range 2 {
		select {
		case <-inside:
		case <-deadline.Done():
			t.Fatalf("Capacity(2): only %d call(s) inside", i)
		}
	}
	for range n {
		gate <- struct{}{}
	}
	wg.Wait()
	if peak.Load() != 2 {
		t.Fatalf("Capacity(2): %d calls ran at once", peak.Load())
	}

	// A queued call gives up with its ctx.
	f.Capacity("a", 1)
	hold := make(chan struct{})
	entered := make(chan struct{})
	go f.Wrap(context.Background(), "a", slot.OpSign, func() error { close(entered); <-hold; return nil })
	<-entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := f.Wrap(ctx, "a", slot.OpSign, func() error { return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("queued call with a cancelled ctx: %v", err)
	}
	close(hold)
}

func TestDelay(t *testing.T) {
	t.Parallel()
	f := slottest.NewFaults()
	f.Delay("a", slot.OpSign, 20*time.Millisecond)
	start := time.Now()
	if _, err := call(f, "a", slot.OpSign); err != nil {
		t.Fatal(err)
	}
	if time.Since(start) < 20*time.Millisecond {
		t.Fatalf("Delay(20ms) took %v", time.Since(start))
	}
	// Heal cuts a delay short.
	f.Delay("a", slot.OpSign, time.Hour)
	errc := make(chan error, 1)
	go func() { _, err := call(f, "a", slot.OpSign); errc <- err }()
	if err := f.WaitCalls(ctxT(t), "a", slot.OpSign, 2); err != nil {
		t.Fatal(err)
	}
	f.Heal("a")
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctxT(t).Done():
		t.Fatalf("Heal did not end a delay")
	}
}

func TestBeforeAppliesRules(t *testing.T) {
	t.Parallel()
	f := slottest.NewFaults()
	var ic slot.Interceptor = f
	f.Fail("a", slot.OpLogin, pkcs11.Error(pkcs11.CKR_PIN_INCORRECT))
	if err := ic.Before(context.Background(), "a", slot.OpLogin); !errors.Is(err, pkcs11.Error(pkcs11.CKR_PIN_INCORRECT)) {
		t.Fatalf("Before: %v", err)
	}
	if err := ic.Before(context.Background(), "a", slot.OpLogout); err != nil {
		t.Fatalf("Before of another op: %v", err)
	}
}
