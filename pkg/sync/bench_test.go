package sync

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

func benchSlot(b *testing.B, tok testhsm.Token) *slot.Slot {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := slot.Open(ctx, slot.Spec{Name: tok.Name, Module: tok.Module, TokenLabel: tok.Label,
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
	if err := InstallDomainKey(ctx, []DomainTarget{{Slot: src}, {Slot: dst}}, "bench"); err != nil {
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
