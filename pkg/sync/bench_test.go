package sync

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/miekg/pkcs11"
)

func benchSlot(b *testing.B, tok testhsm.Token) *slot.Slot {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := slot.Open(ctx, slot.Spec{Name: tok.Name, Module: tok.Module, ModuleEnv: tok.ModuleEnv, InitArgs: tok.InitArgs, TokenLabel: tok.Label,
		PIN: secret.PINFromString(tok.UserPIN)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// BenchmarkList lists a token holding 250 EC key pairs, 250 AES keys and
// 250 data objects (1,000 objects); reported per listing and per object.
func BenchmarkList(b *testing.B) {
	s := benchSlot(b, testhsm.Take(b, 1)[0])
	ctx := context.Background()
	for i := range 250 {
		id := []byte(fmt.Sprintf("b%04d", i))
		if _, _, err := s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
			[]*pkcs11.Attribute{attr(pkcs11.CKA_EC_PARAMS, oidP256Params), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_ID, id)},
			[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_ID, id)}); err != nil {
			b.Fatal(err)
		}
		if _, err := s.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil),
			[]*pkcs11.Attribute{attr(pkcs11.CKA_VALUE_LEN, 16), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_ID, id)}); err != nil {
			b.Fatal(err)
		}
		if _, err := s.CreateObject(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA),
			attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_VALUE, id), attr(pkcs11.CKA_LABEL, string(id))}); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for b.Loop() {
		objs, err := List(ctx, s)
		if err != nil {
			b.Fatal(err)
		}
		if len(objs) != 1000 {
			b.Fatalf("listed %d objects, want 1000", len(objs))
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1000, "ns/object")
}

// BenchmarkReplicate replicates an AES key and an EC private key between
// two tokens (destroying the copy after each round).
func BenchmarkReplicate(b *testing.B) {
	toks := testhsm.Take(b, 2)
	src, dst := benchSlot(b, toks[0]), benchSlot(b, toks[1])
	ctx := context.Background()
	if err := domainkey.Install(ctx, []domainkey.Target{{Slot: src}, {Slot: dst}}, "bench"); err != nil {
		b.Fatal(err)
	}
	r := &Replicator{GroupSerial: "bench"}
	aesKey, err := src.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), []*pkcs11.Attribute{
		attr(pkcs11.CKA_VALUE_LEN, 32), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_SENSITIVE, true),
		attr(pkcs11.CKA_EXTRACTABLE, true), attr(pkcs11.CKA_LABEL, "bench-aes")})
	if err != nil {
		b.Fatal(err)
	}
	pub, priv, err := src.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{attr(pkcs11.CKA_EC_PARAMS, oidP256Params), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_ID, []byte("bec")), attr(pkcs11.CKA_LABEL, "bench-ec")},
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_SENSITIVE, true),
			attr(pkcs11.CKA_EXTRACTABLE, true), attr(pkcs11.CKA_ID, []byte("bec")), attr(pkcs11.CKA_LABEL, "bench-ec")})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := r.Replicate(ctx, src, pub, Target{Slot: dst}); err != nil {
		b.Fatal(err)
	}
	for _, k := range []struct {
		name string
		h    pkcs11.ObjectHandle
	}{{"AES", aesKey}, {"ECPrivate", priv}} {
		b.Run(k.name, func(b *testing.B) {
			for b.Loop() {
				h, err := r.Replicate(ctx, src, k.h, Target{Slot: dst})
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := dst.DestroyObject(ctx, h); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkReplicateCrowded replicates an AES key to a target holding
// 0 or 1,000 other objects, with and without Target.Absent: SoftHSM
// visits every object of the token to answer the look-up for an existing
// copy, and nothing else a copy does depends on the token's size.
func BenchmarkReplicateCrowded(b *testing.B) {
	toks := testhsm.Take(b, 2)
	src, dst := benchSlot(b, toks[0]), benchSlot(b, toks[1])
	ctx := context.Background()
	if err := domainkey.Install(ctx, []domainkey.Target{{Slot: src}, {Slot: dst}}, "bench"); err != nil {
		b.Fatal(err)
	}
	r := &Replicator{GroupSerial: "bench"}
	key, err := src.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), []*pkcs11.Attribute{
		attr(pkcs11.CKA_VALUE_LEN, 32), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_SENSITIVE, true),
		attr(pkcs11.CKA_EXTRACTABLE, true), attr(pkcs11.CKA_LABEL, "bench-aes")})
	if err != nil {
		b.Fatal(err)
	}
	held := 0
	for _, n := range []int{0, 1000} {
		for ; held < n; held++ {
			if _, err := dst.CreateObject(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA),
				attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_VALUE, []byte("x")), attr(pkcs11.CKA_LABEL, fmt.Sprintf("filler-%d", held))}); err != nil {
				b.Fatal(err)
			}
		}
		for _, absent := range []bool{false, true} {
			b.Run(fmt.Sprintf("objects=%d/absent=%v", n, absent), func(b *testing.B) {
				for b.Loop() {
					h, err := r.Replicate(ctx, src, key, Target{Slot: dst, Absent: absent})
					if err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					if err := dst.DestroyObject(ctx, h); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
			})
		}
	}
}

// BenchmarkKeygenReplicated generates an EC P-256 key pair on one of
// three members and, in "replicated", copies both halves to the two
// others, the four copies at once (as pkg/group does before it answers
// C_GenerateKeyPair). "plain" is the generation alone.
func BenchmarkKeygenReplicated(b *testing.B) {
	toks := testhsm.Take(b, 3)
	ss := []*slot.Slot{benchSlot(b, toks[0]), benchSlot(b, toks[1]), benchSlot(b, toks[2])}
	ctx := context.Background()
	targets := make([]domainkey.Target, len(ss))
	for i, s := range ss {
		targets[i] = domainkey.Target{Slot: s}
	}
	if err := domainkey.Install(ctx, targets, "bench"); err != nil {
		b.Fatal(err)
	}
	r := &Replicator{GroupSerial: "bench"}
	n := 0
	gen := func() (pkcs11.ObjectHandle, pkcs11.ObjectHandle) {
		n++
		id := []byte(fmt.Sprintf("kg%06d", n))
		pub, priv, err := ss[0].GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
			[]*pkcs11.Attribute{attr(pkcs11.CKA_EC_PARAMS, oidP256Params), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_VERIFY, true),
				attr(pkcs11.CKA_ID, id), attr(pkcs11.CKA_LABEL, "kg")},
			[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SIGN, true),
				attr(pkcs11.CKA_SENSITIVE, true), attr(pkcs11.CKA_EXTRACTABLE, true), attr(pkcs11.CKA_ID, id), attr(pkcs11.CKA_LABEL, "kg")})
		if err != nil {
			b.Fatal(err)
		}
		return pub, priv
	}
	b.Run("plain", func(b *testing.B) {
		for b.Loop() {
			gen()
		}
	})
	b.Run("replicated", func(b *testing.B) {
		for b.Loop() {
			pub, priv := gen()
			var wg sync.WaitGroup
			errs := make([]error, 4)
			for i, dst := range ss[1:] {
				for j, h := range []pkcs11.ObjectHandle{pub, priv} {
					wg.Go(func() { _, errs[2*i+j] = r.Replicate(ctx, ss[0], h, Target{Slot: dst}) })
				}
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				b.Fatal(err)
			}
		}
	})
	// Each half to both targets with one ReplicateEach, the halves at
	// once: the source is read and wrapped once per half.
	b.Run("replicated-each", func(b *testing.B) {
		targets := []Target{{Slot: ss[1]}, {Slot: ss[2]}}
		for b.Loop() {
			pub, priv := gen()
			var wg sync.WaitGroup
			errs := make([][]error, 2)
			for j, h := range []pkcs11.ObjectHandle{pub, priv} {
				wg.Go(func() { _, errs[j] = r.ReplicateEach(ctx, ss[0], h, targets) })
			}
			wg.Wait()
			if err := errors.Join(append(errs[0], errs[1]...)...); err != nil {
				b.Fatal(err)
			}
		}
	})
}
