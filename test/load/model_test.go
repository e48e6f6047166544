package load

import (
	"context"
	"crypto/sha256"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// modelHSM is a slot.WrapInterceptor that turns every member's op into a
// model HSM partition: the call is not made, it takes serviceTime and at
// most capacity run at once per member, and it costs this process no CPU
// of the token's. What is left of a signature's CPU here is the engine's
// (and the benchmark's), which is what BenchmarkScalingModel measures.
type modelHSM struct {
	op       slot.Op
	service  time.Duration
	capacity int

	mu   sync.Mutex
	sems map[string]chan struct{}
}

func newModelHSM(op slot.Op, service time.Duration, capacity int) *modelHSM {
	return &modelHSM{op: op, service: service, capacity: capacity, sems: map[string]chan struct{}{}}
}

func (m *modelHSM) sem(token string) chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.sems[token]
	if !ok {
		s = make(chan struct{}, m.capacity)
		m.sems[token] = s
	}
	return s
}

// Before implements slot.Interceptor (the slot calls Wrap).
func (m *modelHSM) Before(ctx context.Context, token string, op slot.Op) error {
	return m.Wrap(ctx, token, op, func() error { return nil })
}

// Wrap serves op as the model does, and makes every other call.
func (m *modelHSM) Wrap(ctx context.Context, token string, op slot.Op, call func() error) error {
	if op != m.op {
		return call()
	}
	sem := m.sem(token)
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-sem }()
	t := time.NewTimer(m.service)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// A model member serves at most capacity calls at once, each taking the
// service time, and makes no call to the token.
func TestModelHSMServesAtItsRate(t *testing.T) {
	m := newModelHSM(slot.OpSign, 20*time.Millisecond, 2)
	var wg sync.WaitGroup
	made := 0
	var mu sync.Mutex
	start := time.Now()
	for range 6 {
		wg.Go(func() {
			if err := m.Wrap(t.Context(), "a", slot.OpSign, func() error { mu.Lock(); made++; mu.Unlock(); return nil }); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	// 6 calls, 2 at a time, 20 ms each: three rounds at least.
	if took := time.Since(start); took < 60*time.Millisecond {
		t.Errorf("6 calls took %v on a member serving 2 at once in 20 ms each, want at least 60 ms", took)
	}
	if made != 0 {
		t.Errorf("the model made %d calls to the token, want none", made)
	}
	ran := false
	if err := m.Wrap(t.Context(), "a", slot.OpFindObjects, func() error { ran = true; return nil }); err != nil || !ran {
		t.Errorf("another op: ran %v, err %v; want it made", ran, err)
	}
}

// Model members for BenchmarkScalingModel: 2 ms per signature, 4 at once,
// 2,000 signatures/s per member.
const (
	modelService  = 2 * time.Millisecond
	modelCapacity = 4
)

// BenchmarkScalingModel measures sign throughput through a group of 1, 2,
// 3, 5 and 8 model members (modelHSM: the token is not called, so the
// members cost no CPU here), with enough callers to keep every member's
// slots busy. It reports signs/s, the efficiency against members ×
// 2,000/s, and the process's CPU per signature (cpu-us/sign): the
// engine's share, against which the cores bound the rate.
func BenchmarkScalingModel(b *testing.B) {
	type fixture struct {
		g    *group.Group
		priv group.ObjectHandle
	}
	groups := map[int]fixture{}
	for _, n := range []int{1, 2, 3, 5, 8} {
		b.Run(fmt.Sprintf("members=%d", n), func(sb *testing.B) {
			f, ok := groups[n]
			if !ok {
				f.g, f.priv = modelGroup(sb, testhsm.Take(sb, n), b.Cleanup)
				groups[n] = f
			}
			b := sb
			ctx := context.Background()
			mech := pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil)
			digest := sha256.Sum256([]byte("scaling"))
			// Twice the members' slots in callers, so that none idles.
			b.SetParallelism(max(1, 2*n*modelCapacity/runtime.GOMAXPROCS(0)))
			cpu, hedges := testhsm.ProcessCPU(b), f.g.Hedges()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := f.g.Sign(ctx, mech, f.priv, digest[:]); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			rate := float64(b.N) / b.Elapsed().Seconds()
			b.ReportMetric(rate, "signs/s")
			b.ReportMetric(rate/(float64(n)*float64(modelCapacity)/modelService.Seconds()), "efficiency")
			b.ReportMetric(float64((testhsm.ProcessCPU(b)-cpu).Microseconds())/float64(b.N), "cpu-us/sign")
			b.ReportMetric(100*float64(f.g.Hedges()-hedges)/float64(b.N), "hedged-%")
		})
	}
}

// BenchmarkModelAlone is BenchmarkScalingModel's members without the
// engine: the same callers call the model members directly, round robin.
// Its efficiency is the model's own ceiling on this machine (its timers
// under load), the yardstick for the engine's.
func BenchmarkModelAlone(b *testing.B) {
	for _, n := range []int{1, 2, 3, 5, 8} {
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			model := newModelHSM(slot.OpSign, modelService, modelCapacity)
			var next atomic.Uint64
			b.SetParallelism(max(1, 2*n*modelCapacity/runtime.GOMAXPROCS(0)))
			cpu := testhsm.ProcessCPU(b)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					member := fmt.Sprintf("m%d", next.Add(1)%uint64(n))
					if err := model.Wrap(context.Background(), member, slot.OpSign, nil); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			rate := float64(b.N) / b.Elapsed().Seconds()
			b.ReportMetric(rate, "signs/s")
			b.ReportMetric(rate/(float64(n)*float64(modelCapacity)/modelService.Seconds()), "efficiency")
			b.ReportMetric(float64((testhsm.ProcessCPU(b)-cpu).Microseconds())/float64(b.N), "cpu-us/sign")
		})
	}
}

// modelGroup opens a group of toks, with an EC key made through the
// group, whose members then sign as model HSMs.
func modelGroup(b testing.TB, toks []testhsm.Token, cleanup func(func())) (*group.Group, group.ObjectHandle) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	serial := fmt.Sprintf("%d", 3100000+len(toks))
	pin := secret.PINFromString(testhsm.UserPIN)
	gc := provisionedGroup(ctx, b, "model", serial, toks, pin)
	model := newModelHSM(slot.OpSign, modelService, modelCapacity)
	g, err := group.Open(ctx, gc, (&config.Config{}).Settings(&gc), group.Options{Interceptor: model})
	if err != nil {
		b.Fatal(err)
	}
	cleanup(func() { g.Close() })
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
			pkcs11.NewAttribute(pkcs11.CKA_VERIFY, true), pkcs11.NewAttribute(pkcs11.CKA_LABEL, "model")},
		[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true), pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
			pkcs11.NewAttribute(pkcs11.CKA_SIGN, true), pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true),
			pkcs11.NewAttribute(pkcs11.CKA_LABEL, "model")})
	if err != nil {
		b.Fatal(err)
	}
	return g, priv
}
