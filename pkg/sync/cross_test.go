package sync

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/miekg/pkcs11"
)

// provenWays answers PairWay from the pairs' proofs, as pkg/group does:
// one make needs none; two use the pair's best way for the kind.
func provenWays(t *testing.T, ss ...*slot.Slot) PairWay {
	t.Helper()
	proofs := map[[2]string]PairWays{}
	for _, a := range ss {
		for _, b := range ss {
			if a != b {
				proofs[[2]string{a.Name(), b.Name()}] = prove(t, a, b)
			}
		}
	}
	return func(_ context.Context, src, dst *slot.Slot, k Kind) (Way, bool, error) {
		if src.Token().Manufacturer == dst.Token().Manufacturer {
			return Way{}, false, nil
		}
		p := proofs[[2]string{src.Name(), dst.Name()}]
		if w, ok := p.WayFor(k); ok {
			return w, true, nil
		}
		return Way{}, true, &slot.Error{Member: dst.Name(), Code: pkcs11.CKR_KEY_TYPE_INCONSISTENT,
			Err: fmt.Errorf("no proven way carries %ss from %s", trialName(k), src.Name())}
	}
}

// A key crosses between SoftHSM and NSS, either way, by the way the pair
// proved, and the copy is the key: what one encrypts the other decrypts,
// what one signs the other's public key verifies. No domain key is
// needed on either. A key an NSS member cannot take (an EC private key)
// and one that may be wrapped under trusted keys only are refused, and
// nothing of them stays on the target.
func TestReplicateAcrossMakes(t *testing.T) {
	soft := openSlot(t, testhsm.Take(t, 1)[0], nil)
	nss := openSlot(t, testhsm.NSS(t, "nss-cross"), nil)
	ctx := testContext(t)
	r := &Replicator{GroupSerial: "cross", PairWay: provenWays(t, soft, nss)}

	for _, dir := range [][2]*slot.Slot{{soft, nss}, {nss, soft}} {
		src, dst := dir[0], dir[1]
		t.Run(src.Name()+"->"+dst.Name(), func(t *testing.T) {
			aes := genAES(t, src, "cross-aes", randomID(t))
			cp, err := r.Replicate(ctx, src, aes, Target{Slot: dst})
			if err != nil {
				t.Fatalf("replicate AES: %v", err)
			}
			iv := bytes.Repeat([]byte{1}, 16)
			msg := []byte("sixteen byte msg")
			ct, err := src.Encrypt(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_CBC, iv), aes, msg)
			if err != nil {
				t.Fatal(err)
			}
			pt, err := dst.Decrypt(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_CBC, iv), cp, ct)
			if err != nil || !bytes.Equal(pt, msg) {
				t.Fatalf("the copy on %s decrypts %q, %v; want %q", dst.Name(), pt, err, msg)
			}
			if v, ok := getAttr(t, dst, cp, pkcs11.CKA_VALUE); ok {
				t.Errorf("the copy of a sensitive key on %s shows its value (%d bytes)", dst.Name(), len(v))
			}

			rsa := genRSA(t, src, "cross-rsa", randomID(t))
			pub, err := r.Replicate(ctx, src, rsa.Pub, Target{Slot: dst})
			if err != nil {
				t.Fatalf("replicate the RSA public key: %v", err)
			}
			priv, err := r.Replicate(ctx, src, rsa.Priv, Target{Slot: dst})
			if err != nil {
				t.Fatalf("replicate the RSA private key: %v", err)
			}
			sha := pkcs11.NewMechanism(pkcs11.CKM_SHA256_RSA_PKCS, nil)
			sig, err := dst.Sign(ctx, sha, priv, msg)
			if err != nil {
				t.Fatal(err)
			}
			if err := src.Verify(ctx, sha, rsa.Pub, msg, sig); err != nil {
				t.Errorf("the copy on %s signs for another key: %v", dst.Name(), err)
			}
			sig, err = src.Sign(ctx, sha, rsa.Priv, msg)
			if err != nil {
				t.Fatal(err)
			}
			if err := dst.Verify(ctx, sha, pub, msg, sig); err != nil {
				t.Errorf("the public key's copy on %s does not verify the source's signature: %v", dst.Name(), err)
			}
			// Again: the copy is found, not made twice.
			if again, err := r.Replicate(ctx, src, rsa.Priv, Target{Slot: dst}); err != nil || again != priv {
				t.Errorf("replicating again gave %d, %v; want the copy %d", again, err, priv)
			}
		})
	}

	// Nothing of the agreements stays on either token: no key pair, no
	// derived key that could unwrap or wrap again what travelled.
	for _, s := range []*slot.Slot{soft, nss} {
		if hs := findByLabel(t, s, transitLabel); len(hs) != 0 {
			t.Errorf("%s holds %d objects of the agreements after the copies", s.Name(), len(hs))
		}
	}

	t.Run("EC private key into NSS", func(t *testing.T) {
		id := randomID(t)
		ec := genEC(t, soft, "cross-ec", id)
		_, err := r.Replicate(ctx, soft, ec.Priv, Target{Slot: nss})
		if err == nil || !strings.Contains(err.Error(), "no proven way carries private keys") {
			t.Fatalf("replicate an EC private key into NSS: %v, want no proven way", err)
		}
		if hs, _ := nss.FindObjects(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_ID, id)}); len(hs) != 0 {
			t.Errorf("NSS holds %d objects of the refused key", len(hs))
		}
	})

	t.Run("wrap-with-trusted key", func(t *testing.T) {
		id := randomID(t)
		k := genAES(t, soft, "cross-wwt", id, attr(pkcs11.CKA_WRAP_WITH_TRUSTED, true))
		_, err := r.Replicate(ctx, soft, k, Target{Slot: nss})
		var se *slot.Error
		if !errors.As(err, &se) || se.Member != soft.Name() || se.Code != pkcs11.CKR_KEY_NOT_WRAPPABLE {
			t.Fatalf("replicate a wrap-with-trusted key into NSS: %v, want the source's CKR_KEY_NOT_WRAPPABLE", err)
		}
		if hs, _ := nss.FindObjects(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_ID, id)}); len(hs) != 0 {
			t.Errorf("NSS holds %d objects of the refused key", len(hs))
		}
	})
}

// SoftHSM keeps a wrap-only key; NSS softokn 3.87 does not: it refuses
// CKA_COPYABLE and CKA_ALLOWED_MECHANISMS on a token key and copies a
// non-modifiable key into one that decrypts, so it may hold no domain key.
func TestWrapOnlyKeyByMake(t *testing.T) {
	soft := openSlot(t, testhsm.Take(t, 1)[0], nil)
	nss := openSlot(t, testhsm.NSS(t, "nss-wraponly"), nil)
	ctx := testContext(t)
	r := &Replicator{GroupSerial: "wraponly"}
	if err := r.KeepsWrapOnlyKey(ctx, soft); err != nil {
		t.Errorf("SoftHSM: %v, want a wrap-only key kept", err)
	}
	err := r.KeepsWrapOnlyKey(ctx, nss)
	var we *domainkey.NoWrapOnlyKeyError
	if !errors.As(err, &we) || we.Member != nss.Name() {
		t.Fatalf("NSS: %v, want a NoWrapOnlyKeyError naming it", err)
	}
	for _, want := range []string{"refuses CKA_COPYABLE or CKA_ALLOWED_MECHANISMS on a token key", "CKA_ALLOWED_MECHANISMS not only",
		"a copy may set CKA_DECRYPT=true"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("NSS: %v, want it to name %q", err, want)
		}
	}
	hs, err := nss.FindObjects(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY)})
	if err != nil || len(hs) != 0 {
		t.Errorf("the trial left %d secret keys on NSS (%v)", len(hs), err)
	}
}

// The ceremony gives a domain key to the members whose token keeps a
// wrap-only key it can use and to no other: beside SoftHSM, NSS (which
// keeps no wrap-only key) and the opencryptoki soft token (which offers no
// AES key wrap, the domain key's one use) hold none, and nothing of it is
// on them; either alone is refused, naming it and what its token lacks.
func TestDomainCeremonyOnOtherMakes(t *testing.T) {
	for _, c := range []struct {
		make string
		open func(t *testing.T) *slot.Slot
	}{
		{"nss", func(t *testing.T) *slot.Slot { return openSlot(t, testhsm.NSS(t, "nss-ceremony"), nil) }},
		{"opencryptoki", func(t *testing.T) *slot.Slot { return openOCK(t, "ock-ceremony") }},
	} {
		t.Run(c.make, func(t *testing.T) {
			soft := openSlot(t, testhsm.Take(t, 1)[0], nil)
			other := c.open(t)
			ctx := testContext(t)
			err := domainkey.Install(ctx, []domainkey.Target{{Slot: other}}, "alone")
			var we *domainkey.NoWrapOnlyKeyError
			if !errors.As(err, &we) || we.Member != other.Name() || !errors.Is(err, domainkey.ErrNoWrapOnlyKey) {
				t.Fatalf("install on %s alone: %v, want a NoWrapOnlyKeyError naming %s", c.make, err, other.Name())
			}
			if err := domainkey.Install(ctx, []domainkey.Target{{Slot: soft}, {Slot: other}}, "two-makes"); err != nil {
				t.Fatalf("install on SoftHSM and %s: %v", c.make, err)
			}
			if d, err := domainkey.Audit(ctx, soft, "two-makes"); err != nil || !d.Found || d.Weak() {
				t.Errorf("SoftHSM after the ceremony: %+v, %v; want a sound key", d, err)
			}
			hs, err := other.FindObjects(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY)})
			if err != nil || len(hs) != 0 {
				t.Errorf("%s holds %d secret keys after the ceremony (%v), want none", c.make, len(hs), err)
			}
			// Installing again changes nothing: the other make is not a
			// member that lacks it.
			if err := domainkey.Install(ctx, []domainkey.Target{{Slot: soft}, {Slot: other}}, "two-makes"); err != nil {
				t.Errorf("install again: %v", err)
			}
		})
	}
}

// BenchmarkReplicateAcrossMakes times one copy of a key between two
// tokens of makes whose pair proved a way (each way between two makes;
// one way between two tokens of one make), by that way: SoftHSM and NSS,
// two opencryptoki soft tokens, and SoftHSM and the soft token (secret
// keys only: no way carries a private key between them). The key is made
// before the timer runs; the copy is destroyed after it stops.
func BenchmarkReplicateAcrossMakes(b *testing.B) {
	for _, c := range []struct {
		makes [2]string
		kinds []string
	}{
		{[2]string{"softhsm", "nss"}, []string{"aes256", "rsa2048"}},
		{[2]string{"opencryptoki", "opencryptoki"}, []string{"aes256", "rsa2048"}},
		{[2]string{"softhsm", "opencryptoki"}, []string{"aes256"}},
	} {
		b.Run(c.makes[0]+"+"+c.makes[1], func(b *testing.B) {
			x, y := benchSlot(b, benchToken(b, c.makes[0], "bench-x")), benchSlot(b, benchToken(b, c.makes[1], "bench-y"))
			dirs := [][2]*slot.Slot{{x, y}, {y, x}}
			if c.makes[0] == c.makes[1] {
				dirs = dirs[:1]
			}
			benchReplicate(b, dirs, c.kinds)
		})
	}
}

// benchToken is a fresh token of the named make: SoftHSM and NSS in
// process, the opencryptoki soft token served by hsmserve.
func benchToken(b *testing.B, make, label string) testhsm.Token {
	switch make {
	case "nss":
		return testhsm.NSS(b, label)
	case "opencryptoki":
		tok := testhsm.ServeOCK(b, label).Token()
		tok.UserPIN = testhsm.OCKUserPIN
		return tok
	}
	return testhsm.Take(b, 1)[0]
}

// benchReplicate times the copies of each of kinds (an AES-256 key,
// "aes256"; an RSA-2048 private key, "rsa2048") in each of dirs (source,
// target), by the way the pair proved; a kind no way carries fails the
// benchmark.
func benchReplicate(b *testing.B, dirs [][2]*slot.Slot, kinds []string) {
	ctx := context.Background()
	proofs := map[[2]string]PairWays{}
	for _, d := range dirs {
		sm, _ := d[0].Mechanisms(ctx)
		dm, _ := d[1].Mechanisms(ctx)
		p, err := ProvePair(ctx, d[0], d[1], sm, dm)
		if err != nil {
			b.Fatal(err)
		}
		proofs[[2]string{d[0].Name(), d[1].Name()}] = p
	}
	r := &Replicator{GroupSerial: "bench-cross", PairWay: func(_ context.Context, src, dst *slot.Slot, k Kind) (Way, bool, error) {
		p := proofs[[2]string{src.Name(), dst.Name()}]
		if w, ok := p.WayFor(k); ok {
			return w, true, nil
		}
		return Way{}, true, fmt.Errorf("no proven way carries %ss from %s to %s (failed: %v)", trialName(k), src.Name(), dst.Name(), p.Failed)
	}}
	for _, d := range dirs {
		src, dst := d[0], d[1]
		for _, kind := range kinds {
			b.Run(fmt.Sprintf("from=%s/to=%s/key=%s", makeName(src), makeName(dst), kind), func(b *testing.B) {
				for b.Loop() {
					b.StopTimer()
					var h pkcs11.ObjectHandle
					id := make([]byte, 8)
					_, _ = rand.Read(id)
					if kind == "aes256" {
						h = genAES(b, src, "bench-cross", id)
					} else {
						h = genRSA(b, src, "bench-cross", id).Priv
					}
					b.StartTimer()
					cp, err := r.Replicate(ctx, src, h, Target{Slot: dst, Absent: true})
					b.StopTimer()
					if err != nil {
						b.Fatal(err)
					}
					_ = dst.DestroyObject(ctx, cp)
					_ = src.DestroyObject(ctx, h)
					b.StartTimer()
				}
			})
		}
	}
}

func makeName(s *slot.Slot) string {
	switch m := s.Token().Manufacturer; {
	case strings.HasPrefix(m, "Mozilla"):
		return "nss"
	case strings.HasPrefix(m, "IBM"):
		return "opencryptoki"
	}
	return "softhsm"
}
