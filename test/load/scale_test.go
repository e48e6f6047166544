package load

import (
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/miekg/pkcs11"
)

func TestMain(m *testing.M) {
	flag.Parse()
	// Benchmarks take fresh tokens for every run of every size.
	n := 4
	if f := flag.Lookup("test.bench"); f != nil && f.Value.String() != "" {
		n = 96
	}
	os.Exit(testhsm.Main(m, n))
}

// serviceTime and capacity model an HSM partition: every sign takes 2 ms
// and at most 4 run at once, so one member serves at most 2,000 signs/s.
const (
	serviceTime = 2 * time.Millisecond
	capacity    = 4
)

// scalingGroup opens a group of the given tokens, every one slowed to the
// model HSM, with an EC key made through the group.
func scalingGroup(b testing.TB, toks []testhsm.Token, cleanup func(func())) (*group.Group, group.ObjectHandle) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	serial := fmt.Sprintf("%d", 3000000+len(toks))
	pin := secret.PINFromString(testhsm.UserPIN)
	gc := provisionedGroup(ctx, b, "scale", serial, toks, pin)
	faults := slottest.NewFaults()
	g, err := group.Open(ctx, gc, (&config.Config{}).Settings(&gc), group.Options{Interceptor: faults})
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
			pkcs11.NewAttribute(pkcs11.CKA_VERIFY, true), pkcs11.NewAttribute(pkcs11.CKA_LABEL, "scale")},
		[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true), pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
			pkcs11.NewAttribute(pkcs11.CKA_SIGN, true), pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true),
			pkcs11.NewAttribute(pkcs11.CKA_LABEL, "scale")})
	if err != nil {
		b.Fatal(err)
	}
	for _, t := range toks {
		faults.Delay(t.Name, slot.OpSign, serviceTime)
		faults.Capacity(t.Name, capacity)
	}
	return g, priv
}

// BenchmarkScaling measures sign throughput through a group of 1, 2, 3 and
// 5 members, each a model HSM of fixed 2 ms service time and 4 calls at
// once (2,000 signs/s at most per member), under 32 concurrent callers.
// It reports signs/s and the efficiency against members × 2,000/s.
// docs/BENCHMARKS.md plots it (test/load/benchreport).
func BenchmarkScaling(b *testing.B) {
	type fixture struct {
		g    *group.Group
		priv group.ObjectHandle
	}
	// One group per size for all of b.Run's calls of it (it is called
	// again with a larger b.N): tokens are made once.
	groups := map[int]fixture{}
	for _, n := range []int{1, 2, 3, 5} {
		b.Run(fmt.Sprintf("members=%d", n), func(sb *testing.B) {
			f, ok := groups[n]
			if !ok {
				f.g, f.priv = scalingGroup(sb, testhsm.Take(sb, n), b.Cleanup)
				groups[n] = f
			}
			b := sb
			g, priv := f.g, f.priv
			ctx := context.Background()
			mech := pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil)
			digest := sha256.Sum256([]byte("scaling"))
			b.SetParallelism(16) // 32 callers on 2 CPUs: enough for 5 × 4 slots
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := g.Sign(ctx, mech, priv, digest[:]); err != nil {
						b.Error(err)
						return
					}
				}
			})
			rate := float64(b.N) / b.Elapsed().Seconds()
			b.ReportMetric(rate, "signs/s")
			b.ReportMetric(rate/(float64(n)*float64(capacity)/serviceTime.Seconds()), "efficiency")
		})
	}
}

// provisionedGroup installs the group's domain key on toks (opened
// directly, then closed) and returns the group's configuration.
func provisionedGroup(ctx context.Context, b testing.TB, label, serial string, toks []testhsm.Token, pin secret.PIN) config.Group {
	b.Helper()
	var targets []domainkey.Target
	gc := config.Group{Label: label, Serial: serial}
	for _, t := range toks {
		s, err := slot.Open(ctx, slot.Spec{Name: t.Name, Module: t.Module, TokenLabel: t.Label, PIN: pin.Clone()})
		if err != nil {
			b.Fatal(err)
		}
		targets = append(targets, domainkey.Target{Slot: s})
		gc.Members = append(gc.Members, config.Member{Name: t.Name, Module: t.Module, TokenLabel: t.Label})
	}
	err := domainkey.Install(ctx, targets, serial)
	for _, t := range targets {
		t.Slot.Close()
	}
	if err != nil {
		b.Fatal(err)
	}
	return gc
}
