package group

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/miekg/pkcs11"
)

// Two opencryptoki soft tokens, which offer no AES key wrap and make no
// EC key, carry the keys made through their group (CKM_AES_CBC_PAD, the
// way their pair proved, under a transit key carried by RSA key
// transport): an AES key is on both, and what one copy encrypts the other
// decrypts; what one copy of an RSA private key signs, the other member's
// public key verifies.
func TestOCKPairReplicates(t *testing.T) {
	a, b := testhsm.ServeOCK(t, "ock-pa").Token(), testhsm.ServeOCK(t, "ock-pb").Token()
	a.UserPIN, b.UserPIN = testhsm.OCKUserPIN, testhsm.OCKUserPIN
	f := setup(t, setupOpts{toks: []testhsm.Token{a, b}, noDomain: true})
	ctx := testContext(t)
	for _, name := range []string{a.Name, b.Name} {
		// (The soft token makes no EC key: nothing of that kind to carry.)
		if got := f.g.CannotHold(name); len(got) != 0 {
			t.Errorf("CannotHold(%s) = %q, want none: secret and RSA private keys travel by CKM_AES_CBC_PAD", name, got)
		}
		for _, e := range f.events.byKind(MechanismMissing, name) {
			if !strings.Contains(e.Err.Error(), "only by the ways its pairs proved") {
				t.Errorf("mechanism_missing event for %s: %v, want it to say keys travel by its pairs", name, e.Err)
			}
		}
	}
	s := openSession(t, f.g)
	if _, err := s.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), []*pkcs11.Attribute{
		attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_VALUE_LEN, 32), attr(pkcs11.CKA_LABEL, "ock-aes"),
		attr(pkcs11.CKA_ENCRYPT, true), attr(pkcs11.CKA_DECRYPT, true), attr(pkcs11.CKA_EXTRACTABLE, true)}); err != nil {
		t.Fatalf("AES generation through a group of two opencryptoki soft tokens: %v", err)
	}
	if _, _, err := s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_MODULUS_BITS, 2048), attr(pkcs11.CKA_PUBLIC_EXPONENT, []byte{1, 0, 1}),
			attr(pkcs11.CKA_VERIFY, true), attr(pkcs11.CKA_LABEL, "ock-rsa")},
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SIGN, true),
			attr(pkcs11.CKA_EXTRACTABLE, true), attr(pkcs11.CKA_LABEL, "ock-rsa")}); err != nil {
		t.Fatalf("RSA generation through a group of two opencryptoki soft tokens: %v", err)
	}
	digest := bytes.Repeat([]byte{9}, 32)
	var sig []byte
	for i, tok := range []testhsm.Token{b, a} {
		d := openDirect(t, tok)
		class := uint(pkcs11.CKO_PRIVATE_KEY)
		if i == 1 {
			class = pkcs11.CKO_PUBLIC_KEY
		}
		hs, err := d.FindObjects(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, "ock-rsa"), attr(pkcs11.CKA_CLASS, class)})
		if err != nil || len(hs) != 1 {
			t.Fatalf("%s holds %d ock-rsa keys of class %d (%v), want 1", tok.Name, len(hs), class, err)
		}
		m := pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS, nil)
		if i == 0 {
			if sig, err = d.Sign(ctx, m, hs[0], digest); err != nil {
				t.Fatal(err)
			}
		} else if err := d.Verify(ctx, m, hs[0], digest, sig); err != nil {
			t.Fatalf("what %s's copy of the private key signs, %s's public key does not verify: %v", b.Name, a.Name, err)
		}
	}
	iv := bytes.Repeat([]byte{3}, 16)
	msg := []byte("sixteen byte msg")
	var ct []byte
	for i, tok := range []testhsm.Token{a, b} {
		d := openDirect(t, tok)
		hs, err := d.FindObjects(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, "ock-aes"), attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY)})
		if err != nil || len(hs) != 1 {
			t.Fatalf("%s holds %d copies of the key (%v), want 1", tok.Name, len(hs), err)
		}
		if i == 0 {
			if ct, err = d.Encrypt(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_CBC, iv), hs[0], msg); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if pt, err := d.Decrypt(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_CBC, iv), hs[0], ct); err != nil || !bytes.Equal(pt, msg) {
			t.Fatalf("%s's copy decrypts %q, %v; want %q", tok.Name, pt, err, msg)
		}
	}
}

// A group of SoftHSM and the opencryptoki soft token, which share no AES
// wrap, makes AES keys: each travels by RSA-OAEP under the target's
// throwaway transport key, the one way their pair proves, and what one
// copy encrypts the other decrypts. RSA private keys have no way between
// them (SoftHSM takes a private key only by AES key wrap, and wraps none
// under RSA): the group refuses to make one while both serve, naming the
// pair, and says so in CannotHold.
func TestSoftHSMAndOCKGroupMakesSecretKeys(t *testing.T) {
	soft := testhsm.Take(t, 1)[0]
	ock := testhsm.ServeOCK(t, "ock-mix").Token()
	ock.UserPIN = testhsm.OCKUserPIN
	f := setup(t, setupOpts{toks: []testhsm.Token{soft, ock}, noDomain: true})
	ctx := testContext(t)
	if got := f.g.CannotHold(ock.Name); !slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, "RSA private key") }) ||
		slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, "secret key") }) {
		t.Errorf("CannotHold(%s) = %q, want RSA private keys and no secret keys", ock.Name, got)
	}
	s := openSession(t, f.g)
	if _, err := s.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), []*pkcs11.Attribute{
		attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_VALUE_LEN, 32), attr(pkcs11.CKA_LABEL, "mix-aes"),
		attr(pkcs11.CKA_ENCRYPT, true), attr(pkcs11.CKA_DECRYPT, true)}); err != nil {
		t.Fatalf("AES generation through a group of SoftHSM and an opencryptoki soft token: %v", err)
	}
	_, _, err := s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_MODULUS_BITS, 2048), attr(pkcs11.CKA_PUBLIC_EXPONENT, []byte{1, 0, 1}),
			attr(pkcs11.CKA_VERIFY, true), attr(pkcs11.CKA_LABEL, "mix-rsa")},
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_LABEL, "mix-rsa")})
	if code := CodeOf(err); code != pkcs11.CKR_MECHANISM_INVALID {
		t.Errorf("RSA generation through the group: %v, want CKR_MECHANISM_INVALID (no way carries RSA private keys between the two)", err)
	}
	iv := bytes.Repeat([]byte{3}, 16)
	msg := []byte("sixteen byte msg")
	var ct []byte
	for i, tok := range []testhsm.Token{soft, ock} {
		d := openDirect(t, tok)
		if hs, err := d.FindObjects(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, "mix-rsa")}); err != nil || len(hs) != 0 {
			t.Errorf("%s holds %d mix-rsa objects (%v), want none", tok.Name, len(hs), err)
		}
		hs, err := d.FindObjects(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, "mix-aes"), attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY)})
		if err != nil || len(hs) != 1 {
			t.Fatalf("%s holds %d copies of the key (%v), want 1", tok.Name, len(hs), err)
		}
		if i == 0 {
			if ct, err = d.Encrypt(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_CBC, iv), hs[0], msg); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if pt, err := d.Decrypt(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_CBC, iv), hs[0], ct); err != nil || !bytes.Equal(pt, msg) {
			t.Fatalf("%s's copy decrypts %q, %v; want %q", tok.Name, pt, err, msg)
		}
	}
}
