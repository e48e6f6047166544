package slot_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// benchToken is the one token every run of BenchmarkSlotSign uses (-count
// runs the benchmark function many times; tokens are not reused by Take).
var benchToken struct {
	once sync.Once
	tok  testhsm.Token
}

// BenchmarkSlotSign measures what the pool and the per-call deadline cost:
// ECDSA P-256 signatures through Slot.Sign ("slot") against the same
// miekg/pkcs11 calls made directly on sessions of the same token
// ("direct"), from 1 and 2 goroutines. Compare with
//
//	go test -run '^$' -bench BenchmarkSlotSign -count 6 ./pkg/slot/ > /tmp/slotbench.txt
//	benchstat -col /impl /tmp/slotbench.txt
func BenchmarkSlotSign(b *testing.B) {
	benchToken.once.Do(func() { benchToken.tok = testhsm.Take(b, 1)[0] })
	tok := benchToken.tok
	ctx := context.Background()
	s, err := slot.Open(ctx, specOf(tok))
	if err != nil {
		b.Fatalf("Open: %v", err)
	}
	defer s.Close()
	var priv pkcs11.ObjectHandle
	if hs, err := s.FindObjects(ctx, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_LABEL, "bench"), pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY)}); err == nil && len(hs) == 1 {
		priv = hs[0]
	} else {
		_, priv = newECKey(b, s, "bench")
	}
	digest := sha256.Sum256([]byte("benchmark message"))
	mech := []*pkcs11.Mechanism{pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil)}

	// The direct baseline: a context of the same (already initialised)
	// module and one session per goroutine, as a careful caller of
	// miekg/pkcs11 would hold them.
	raw := pkcs11.New(tok.Module)
	if raw == nil {
		b.Fatalf("load %s", tok.Module)
	}
	defer raw.Destroy() // never Finalize: the slot's context is the same library
	if err := raw.Initialize(); err != nil && !errors.Is(err, pkcs11.Error(pkcs11.CKR_CRYPTOKI_ALREADY_INITIALIZED)) {
		b.Fatalf("Initialize: %v", err)
	}

	for _, g := range []int{1, 2} {
		b.Run(fmt.Sprintf("impl=direct/goroutines=%d", g), func(b *testing.B) {
			sessions := make([]pkcs11.SessionHandle, g)
			for i := range sessions {
				h, err := raw.OpenSession(s.SlotID(), pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
				if err != nil {
					b.Fatalf("OpenSession: %v", err)
				}
				defer raw.CloseSession(h)
				sessions[i] = h
			}
			b.ReportAllocs()
			b.ResetTimer()
			parallel(b, g, func(i int) error {
				h := sessions[i]
				if err := raw.SignInit(h, mech, priv); err != nil {
					return err
				}
				_, err := raw.Sign(h, digest[:])
				return err
			})
		})
		b.Run(fmt.Sprintf("impl=slot/goroutines=%d", g), func(b *testing.B) {
			m := mech[0]
			b.ReportAllocs()
			b.ResetTimer()
			parallel(b, g, func(int) error {
				_, err := s.Sign(ctx, m, priv, digest[:])
				return err
			})
		})
		// On a shared machine the load changes faster than benchstat's
		// runs: paired alternates one direct and one slot signature and
		// times each, so both see the same load; overhead-% is the
		// difference of their sums.
		b.Run(fmt.Sprintf("impl=paired/goroutines=%d", g), func(b *testing.B) {
			sessions := make([]pkcs11.SessionHandle, g)
			for i := range sessions {
				h, err := raw.OpenSession(s.SlotID(), pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
				if err != nil {
					b.Fatalf("OpenSession: %v", err)
				}
				defer raw.CloseSession(h)
				sessions[i] = h
			}
			m := mech[0]
			var direct, viaSlot atomic.Int64
			b.ResetTimer()
			parallel(b, g, func(i int) error {
				t0 := time.Now()
				if err := raw.SignInit(sessions[i], mech, priv); err != nil {
					return err
				}
				if _, err := raw.Sign(sessions[i], digest[:]); err != nil {
					return err
				}
				t1 := time.Now()
				if _, err := s.Sign(ctx, m, priv, digest[:]); err != nil {
					return err
				}
				t2 := time.Now()
				direct.Add(int64(t1.Sub(t0)))
				viaSlot.Add(int64(t2.Sub(t1)))
				return nil
			})
			d, v := float64(direct.Load()), float64(viaSlot.Load())
			b.ReportMetric(d/float64(b.N), "direct-ns/op")
			b.ReportMetric(v/float64(b.N), "slot-ns/op")
			b.ReportMetric(100*(v-d)/d, "overhead-%")
		})
	}
}

// BenchmarkSlotOverhead shows the absolute cost of the pool and the
// deadline per call, on a call that costs the module next to nothing
// (C_GenerateRandom of 16 bytes): slot minus direct is the overhead in ns
// that BenchmarkSlotSign's ~60 µs signatures carry.
func BenchmarkSlotOverhead(b *testing.B) {
	benchToken.once.Do(func() { benchToken.tok = testhsm.Take(b, 1)[0] })
	tok := benchToken.tok
	ctx := context.Background()
	s, err := slot.Open(ctx, specOf(tok))
	if err != nil {
		b.Fatalf("Open: %v", err)
	}
	defer s.Close()
	raw := pkcs11.New(tok.Module)
	if raw == nil {
		b.Fatalf("load %s", tok.Module)
	}
	defer raw.Destroy()
	if err := raw.Initialize(); err != nil && !errors.Is(err, pkcs11.Error(pkcs11.CKR_CRYPTOKI_ALREADY_INITIALIZED)) {
		b.Fatalf("Initialize: %v", err)
	}
	for _, g := range []int{1, 2} {
		b.Run(fmt.Sprintf("impl=direct/goroutines=%d", g), func(b *testing.B) {
			sessions := make([]pkcs11.SessionHandle, g)
			for i := range sessions {
				h, err := raw.OpenSession(s.SlotID(), pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
				if err != nil {
					b.Fatalf("OpenSession: %v", err)
				}
				defer raw.CloseSession(h)
				sessions[i] = h
			}
			b.ReportAllocs()
			b.ResetTimer()
			parallel(b, g, func(i int) error {
				_, err := raw.GenerateRandom(sessions[i], 16)
				return err
			})
		})
		b.Run(fmt.Sprintf("impl=slot/goroutines=%d", g), func(b *testing.B) {
			b.ReportAllocs()
			b.ResetTimer()
			parallel(b, g, func(int) error {
				_, err := s.GenerateRandom(ctx, 16)
				return err
			})
		})
	}
}

// parallel runs b.N calls of fn spread over g goroutines; fn gets the
// goroutine's index.
func parallel(b *testing.B, g int, fn func(i int) error) {
	var wg sync.WaitGroup
	errs := make(chan error, g)
	for i := range g {
		n := b.N / g
		if i < b.N%g {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n {
				if err := fn(i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}
