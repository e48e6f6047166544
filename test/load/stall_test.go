package load

import (
	"context"
	"crypto/sha256"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
)

// stallTimeout is the group's command_timeout in BenchmarkFailoverStall.
const stallTimeout = time.Second

// BenchmarkFailoverStall measures what 4 signing callers see when one of
// two members fails under them: the longest single call from the fault
// on (the stall), for a member that dies (every call fails at once with
// CKR_DEVICE_ERROR, as a killed p11-kit server's member does) and for one
// that hangs (calls block until command_timeout, 1 s here, as a SIGSTOPped
// server's do). Faults are injected at the pkg/slot boundary; the demo and
// the soak measure the same with real processes. One iteration is one
// fault, then the member is healed and returned to rotation.
func BenchmarkFailoverStall(b *testing.B) {
	for _, kind := range []string{"killed", "hung"} {
		b.Run("fault="+kind, func(b *testing.B) {
			toks := testhsm.Take(b, 2)
			faults := slottest.NewFaults()
			g, priv := stallGroup(b, toks, faults)
			victim := toks[0].Name
			ctx := context.Background()
			mech := pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil)
			digest := sha256.Sum256([]byte("stall"))
			var worst time.Duration
			b.ResetTimer()
			for range b.N {
				var stop atomic.Bool
				var faultAt atomic.Int64
				var mu sync.Mutex
				var stall time.Duration
				var wg sync.WaitGroup
				for range 4 {
					wg.Go(func() {
						for !stop.Load() {
							start := time.Now()
							_, err := g.Sign(ctx, mech, priv, digest[:])
							if err != nil {
								b.Error(err)
								return
							}
							// Calls that end after the fault: those caught
							// in it and those made while the member fails.
							if f := faultAt.Load(); f != 0 && time.Now().UnixNano() >= f {
								mu.Lock()
								stall = max(stall, time.Since(start))
								mu.Unlock()
							}
						}
					})
				}
				time.Sleep(50 * time.Millisecond) // calls in flight on both members
				faultAt.Store(time.Now().UnixNano())
				if kind == "killed" {
					faults.FailAll(victim, slot.ErrDeviceFailure)
				} else {
					faults.Hang(victim, slot.OpSign)
				}
				// Until the member is out and the callers have run on the
				// other one for a while.
				deadline := time.Now().Add(10 * time.Second)
				for {
					m, _ := g.Member(victim)
					if m.State() != member.Active || time.Now().After(deadline) {
						break
					}
					time.Sleep(time.Millisecond)
				}
				time.Sleep(200 * time.Millisecond)
				stop.Store(true)
				faults.Heal(victim)
				wg.Wait()
				worst = max(worst, stall)
				b.StopTimer()
				if err := g.ActivateMember(ctx, victim); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(worst.Microseconds())/1000, "worst-stall-ms")
			b.ReportMetric(float64(stallTimeout.Milliseconds()), "command-timeout-ms")
		})
	}
}

// stallGroup is a group of toks with a 1 s command_timeout and an EC key.
func stallGroup(b *testing.B, toks []testhsm.Token, faults *slottest.Faults) (*group.Group, group.ObjectHandle) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	serial := "3100001"
	pin := secret.PINFromString(testhsm.UserPIN)
	gc := provisionedGroup(ctx, b, "stall", serial, toks, pin)
	set := (&config.Config{}).Settings(&gc)
	set.CommandTimeout = stallTimeout
	g, err := group.Open(ctx, gc, set, group.Options{Interceptor: faults})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { g.Close() })
	if err := g.Login(ctx, pkcs11.CKU_USER, pin.Clone()); err != nil {
		b.Fatal(err)
	}
	s, err := g.OpenSession(ctx, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	p256 := []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}
	_, priv, err := s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true), pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, p256),
			pkcs11.NewAttribute(pkcs11.CKA_VERIFY, true), pkcs11.NewAttribute(pkcs11.CKA_LABEL, "stall")},
		[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true), pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
			pkcs11.NewAttribute(pkcs11.CKA_SIGN, true), pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true),
			pkcs11.NewAttribute(pkcs11.CKA_LABEL, "stall")})
	if err != nil {
		b.Fatal(err)
	}
	return g, priv
}
