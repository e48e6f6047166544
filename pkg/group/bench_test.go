package group

import (
	"crypto/sha256"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
)

// Benchmarks compare the group with plain pkg/slot on the same tokens.
// Compare sub-benchmarks with benchstat, e.g.
//
//	go test -run '^$' -bench . -count 6 ./pkg/group | tee new.txt
//	benchstat -col /mode new.txt

var ecdsaMech = pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil)

// BenchmarkSign compares single-part ECDSA P-256 signing through a group
// of one member with signing on the same token through pkg/slot directly.
func BenchmarkSign(b *testing.B) {
	f := setup(b, setupOpts{n: 1})
	ctx := testContext(b)
	s := openSession(b, f.g)
	_, priv := genEC(b, s, "bench")
	d := openDirect(b, f.toks[0])
	hs, err := d.FindObjects(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, "bench"), attr(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY)})
	if err != nil || len(hs) != 1 {
		b.Fatalf("find: %v %d", err, len(hs))
	}
	digest := sha256.Sum256([]byte("bench"))
	b.Run("mode=direct-slot", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := d.Sign(ctx, ecdsaMech, hs[0], digest[:]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("mode=group-1-member", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := f.g.Sign(ctx, ecdsaMech, priv, digest[:]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// BenchmarkSignSlowMembers measures scaling: every member is slowed to a
// fixed 2 ms service time with room for 4 calls at once (an HSM's
// capacity), and 3 members are compared with 1.
func BenchmarkSignSlowMembers(b *testing.B) {
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			faults := slottest.NewFaults()
			f := setup(b, setupOpts{n: n, interceptor: faults})
			ctx := testContext(b)
			s := openSession(b, f.g)
			_, priv := genEC(b, s, "slow")
			for _, tok := range f.toks {
				faults.Delay(tok.Name, slot.OpSign, 2*time.Millisecond)
				faults.Capacity(tok.Name, 4)
			}
			digest := sha256.Sum256([]byte("bench"))
			b.SetParallelism(16) // enough callers to keep every member's 4 slots busy
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := f.g.Sign(ctx, ecdsaMech, priv, digest[:]); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkGenerateKeyPair compares P-256 key generation through a group
// of 3 (generate on the primary, replicate to 2) with plain generation on
// one token.
func BenchmarkGenerateKeyPair(b *testing.B) {
	mech := pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil)
	pubT := func(label string) []*pkcs11.Attribute {
		return []*pkcs11.Attribute{attr(pkcs11.CKA_EC_PARAMS, p256), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_VERIFY, true), attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_ID, []byte(label))}
	}
	privT := func(label string) []*pkcs11.Attribute {
		return []*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SIGN, true),
			attr(pkcs11.CKA_SENSITIVE, true), attr(pkcs11.CKA_EXTRACTABLE, true), attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_ID, []byte(label))}
	}
	b.Run("mode=plain", func(b *testing.B) {
		d := openDirect(b, takeTokens(b, 1)[0])
		ctx := testContext(b)
		for i := 0; b.Loop(); i++ {
			l := fmt.Sprintf("k%d", i)
			if _, _, err := d.GenerateKeyPair(ctx, mech, pubT(l), privT(l)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("mode=group-3-members", func(b *testing.B) {
		f := setup(b, setupOpts{})
		ctx := testContext(b)
		s := openSession(b, f.g)
		for i := 0; b.Loop(); i++ {
			l := fmt.Sprintf("k%d", i)
			if _, _, err := s.GenerateKeyPair(ctx, mech, pubT(l), privT(l)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkFindAll lists every object of tokens holding findAllObjects
// token objects (1,000 with -short): through a group of 3 (one listing per
// member, joined), through a group of 1, and as a bare C_FindObjects on
// one token (handles only, no attributes: a floor, not a like-for-like
// comparison).
func BenchmarkFindAll(b *testing.B) {
	n := 10000
	if testing.Short() {
		n = 1000
	}
	toks := takeTokens(b, 3)
	fill(b, toks, n)
	b.Run("mode=direct-FindObjects", func(b *testing.B) {
		d := openDirect(b, toks[0])
		ctx := testContext(b)
		for b.Loop() {
			hs, err := d.FindObjects(ctx, nil)
			if err != nil || len(hs) < n {
				b.Fatalf("%v, %d objects", err, len(hs))
			}
		}
	})
	for _, members := range []int{1, 3} {
		b.Run(fmt.Sprintf("mode=group-%d-members", members), func(b *testing.B) {
			f := setup(b, setupOpts{toks: toks[:members], noDomain: true})
			ctx := testContext(b)
			for b.Loop() {
				hs, err := f.g.Find(ctx, nil)
				if err != nil || len(hs) != n {
					b.Fatalf("%v, %d objects, want %d", err, len(hs), n)
				}
			}
		})
	}
}

// fill puts n public data objects on every token. SoftHSM's file store
// makes each creation wait on the disk, so several sessions per token
// create at once.
func fill(b *testing.B, toks []testhsm.Token, n int) {
	b.Helper()
	start := time.Now()
	var wg sync.WaitGroup
	for _, tok := range toks {
		d := openDirect(b, tok)
		var next atomic.Int64
		for range 16 {
			wg.Go(func() {
				ctx := testContext(b)
				for {
					i := next.Add(1) - 1
					if i >= int64(n) {
						return
					}
					if _, err := d.CreateObject(ctx, []*pkcs11.Attribute{
						attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, false),
						attr(pkcs11.CKA_LABEL, fmt.Sprintf("obj-%05d", i)), attr(pkcs11.CKA_VALUE, []byte(fmt.Sprint(i))),
					}); err != nil {
						b.Errorf("fill %s: %v", tok.Name, err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	b.Logf("made %d objects on each of %d tokens in %v", n, len(toks), time.Since(start))
}

// BenchmarkHedgedSlowMember measures what a member 10 times slower than
// the others costs the group's callers, with and without hedging: three
// model members (every signature held for a service time), one of them
// held ten times as long, signed one at a time; p50 and p99 are reported
// beside the healthy group's. docs/BENCHMARKS.md ("Hedged requests") has
// the figures.
//
//	go test -run '^$' -bench HedgedSlowMember -benchtime 3000x ./pkg/group
func BenchmarkHedgedSlowMember(b *testing.B) {
	const service = 2 * time.Millisecond
	for _, c := range []struct {
		name  string
		slow  bool
		hedge bool
	}{{"members=healthy", false, true}, {"slow=10x/hedge=off", true, false}, {"slow=10x/hedge=on", true, true}} {
		b.Run(c.name, func(b *testing.B) {
			faults := slottest.NewFaults()
			f := setup(b, setupOpts{interceptor: faults, noHedge: !c.hedge})
			ctx := testContext(b)
			_, priv := genEC(b, openSession(b, f.g), "hedge-bench")
			for i, tok := range f.toks {
				d := service
				if c.slow && i == 0 {
					d = 10 * service
				}
				faults.Delay(tok.Name, slot.OpSign, d)
			}
			digest := sha256.Sum256([]byte("bench"))
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				if _, err := f.g.Sign(ctx, ecdsaMech, priv, digest[:]); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(lat)
			q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))]) / 1e6 }
			b.ReportMetric(q(0.50), "p50-ms")
			b.ReportMetric(q(0.99), "p99-ms")
			b.ReportMetric(float64(f.g.Hedges())/float64(b.N)*100, "hedged-%")
		})
	}
}
