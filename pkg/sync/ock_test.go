package sync

import (
	"bytes"
	"context"
	"crypto/sha256"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/miekg/pkcs11"
)

// openOCK opens a served opencryptoki soft token with its own PIN.
func openOCK(t *testing.T, name string) *slot.Slot {
	t.Helper()
	tok := testhsm.ServeOCK(t, name).Token()
	s, err := slot.Open(testContext(t), slot.Spec{Name: tok.Name, Module: tok.Module, TokenLabel: tok.Label,
		PIN: secret.PINFromString(testhsm.OCKUserPIN)})
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// The opencryptoki soft token signs with RSA and offers no
// CKM_AES_KEY_WRAP*: the probe finds it can hold no wrapped key through
// replication as it is, and no way carries a key between it and SoftHSM.
// Between two of them, CKM_AES_CBC_PAD carries secret keys (proven by the
// round trip).
func TestOCKSoftTok(t *testing.T) {
	a, b := openOCK(t, "ock-a"), openOCK(t, "ock-b")
	ctx := testContext(t)
	if tk := a.Token(); !strings.HasPrefix(tk.Manufacturer, "IBM") || !strings.Contains(tk.Model, "SoftTok") {
		t.Fatalf("token %+v, want IBM's SoftTok", tk)
	}
	mechs := mechsOf(t, a)
	c, err := ProbeWrap(ctx, a, mechs)
	if err != nil {
		t.Fatalf("ProbeWrap: %v", err)
	}
	if c.Mechanism || len(c.Unholdable()) != 2 {
		t.Fatalf("capability %+v: want no %s, private and secret keys unholdable", c, domainkey.MechanismName(domainkey.Mechanism))
	}
	pub, priv, err := a.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_MODULUS_BITS, 2048), pkcs11.NewAttribute(pkcs11.CKA_VERIFY, true),
			pkcs11.NewAttribute(pkcs11.CKA_PUBLIC_EXPONENT, []byte{1, 0, 1})},
		[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_SIGN, true), pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false)})
	if err != nil {
		t.Fatalf("RSA key pair on the soft token: %v", err)
	}
	msg := sha256.Sum256([]byte("signed by opencryptoki"))
	m := pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS, nil) // SoftTok 3.8 has no CKM_SHA256_RSA_PKCS
	sig, err := a.Sign(ctx, m, priv, msg[:])
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	if err := a.Verify(ctx, m, pub, msg[:], sig); err != nil {
		t.Fatalf("Verify: %v", err)
	}

	// SoftHSM 2.6.1 unwraps with AES key wrap or RSA only, the soft token
	// wraps with AES ECB/CBC/CBC-PAD or RSA only: secret keys travel by
	// RSA-OAEP under the target's transport key, private keys (which
	// SoftHSM takes only by AES key wrap, and wraps under no RSA key) by
	// no way.
	soft := openSlot(t, testhsm.Take(t, 1)[0], nil)
	for _, p := range []PairWays{prove(t, soft, a), prove(t, a, soft)} {
		if w, ok := p.Best(pkcs11.CKO_SECRET_KEY); !ok || w != rsaTransport {
			t.Errorf("%s -> %s: secret keys by %v (%v), want %v: %v", p.Source, p.Target, w, ok, rsaTransport, p.Failed)
		}
		if w, ok := p.WayFor(Kind{Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_RSA}); ok {
			t.Errorf("%s -> %s: RSA private keys proven by %v; SoftHSM and the soft token share no wrap for them", p.Source, p.Target, w)
		}
	}
	cbc := Way{pkcs11.CKM_AES_CBC_PAD, pkcs11.CKM_AES_CBC_PAD}
	if p := prove(t, a, b); !p.Proven(pkcs11.CKO_SECRET_KEY, cbc) {
		t.Errorf("soft token -> soft token: secret keys by %v not proven: %v", cbc, p.Failed)
	}
}

// Between two opencryptoki soft tokens a secret key travels by the way the
// pair proved (CKM_AES_CBC_PAD), under a transit key the two agree for the
// copy. The soft token makes no EC key, so the agreement is an RSA key
// transport (the target's throwaway RSA pair unwraps the transit key the
// source made), and nothing of it stays on either token.
func TestOCKPairCarriesSecretKeys(t *testing.T) {
	carrySecretKeys(t, openOCK(t, "ock-ca"), openOCK(t, "ock-cb"))
}

// A secret key travels between SoftHSM and the opencryptoki soft token,
// both ways, by RSA-OAEP under the target's throwaway transport key (the
// only way the two share), and nothing of the transport stays.
func TestSoftHSMAndOCKCarrySecretKeys(t *testing.T) {
	carrySecretKeys(t, openSlot(t, testhsm.Take(t, 1)[0], nil), openOCK(t, "ock-sa"))
}

// carrySecretKeys replicates an AES key each way between a and b by the
// way their pair proved, and checks the copy decrypts what the source
// encrypts, is sensitive and a token object, and that no transit object
// stays.
func carrySecretKeys(t *testing.T, a, b *slot.Slot) {
	ctx := testContext(t)
	proofs := map[string]PairWays{a.Name(): prove(t, a, b), b.Name(): prove(t, b, a)}
	r := &Replicator{GroupSerial: "ock-pair", PairWay: func(_ context.Context, src, _ *slot.Slot, k Kind) (Way, bool, error) {
		w, ok := proofs[src.Name()].WayFor(k)
		if !ok {
			t.Fatalf("no proven way for %v from %s", k, src.Name())
		}
		return w, true, nil // no domain key on this make: by the proven way
	}}
	for _, dir := range [][2]*slot.Slot{{a, b}, {b, a}} {
		src, dst := dir[0], dir[1]
		aes := genAES(t, src, "ock-aes-"+src.Name(), randomID(t))
		cp, err := r.Replicate(ctx, src, aes, Target{Slot: dst})
		if err != nil {
			t.Fatalf("%s -> %s: replicate an AES key: %v", src.Name(), dst.Name(), err)
		}
		iv := bytes.Repeat([]byte{7}, 16)
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
		if v, ok := getAttr(t, dst, cp, pkcs11.CKA_TOKEN); !ok || len(v) != 1 || v[0] != 1 {
			t.Errorf("the copy on %s is not a token object (%x, %v)", dst.Name(), v, ok)
		}
	}
	for _, s := range []*slot.Slot{a, b} {
		hs, err := s.FindObjects(ctx, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_LABEL, transitLabel)})
		if err != nil || len(hs) != 0 {
			t.Errorf("%s keeps %d transit objects (%v), want 0", s.Name(), len(hs), err)
		}
	}
}
