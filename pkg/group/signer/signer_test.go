package signer

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"errors"
	"slices"
	"testing"

	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// failOver fails every member but the last, one after another, calling
// check before each failure and at the end: the signer must keep working
// with any member left.
func failOver(t *testing.T, f *fixture, check func(stage string)) {
	t.Helper()
	for _, tok := range f.toks[:len(f.toks)-1] {
		check("before failing " + tok.Name)
		if err := f.g.FailMember(tok.Name, errors.New("test failover")); err != nil {
			t.Fatal(err)
		}
	}
	check("with only " + f.toks[len(f.toks)-1].Name + " left")
}

func TestSignerECDSAAcrossFailover(t *testing.T) {
	f := setup(t)
	_, priv := f.genEC(t, "ec-signer")
	signer, err := New(testContext(t), f.g, KeySelector{Label: "ec-signer"})
	if err != nil {
		t.Fatal(err)
	}
	if signer.Handle() != priv {
		t.Fatalf("New found handle %d, GenerateKeyPair returned %d", signer.Handle(), priv)
	}
	pub := signer.Public().(*ecdsa.PublicKey)
	failOver(t, f, func(stage string) {
		for range 5 {
			d := sha256.Sum256([]byte(stage))
			sig, err := signer.Sign(rand.Reader, d[:], crypto.SHA256)
			if err != nil {
				t.Fatalf("%s: %v", stage, err)
			}
			if !ecdsa.VerifyASN1(pub, d[:], sig) {
				t.Fatalf("%s: signature does not verify", stage)
			}
		}
	})
}

func TestSignerRSAAcrossFailover(t *testing.T) {
	f := setup(t)
	ctx := testContext(t)
	_, _, err := f.s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_MODULUS_BITS, 2048), attr(pkcs11.CKA_PUBLIC_EXPONENT, []byte{1, 0, 1}),
			attr(pkcs11.CKA_VERIFY, true), attr(pkcs11.CKA_ENCRYPT, true), attr(pkcs11.CKA_LABEL, "rsa-signer")},
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SENSITIVE, true),
			attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_DECRYPT, true), attr(pkcs11.CKA_LABEL, "rsa-signer")})
	if err != nil {
		t.Fatal(err)
	}
	signer, err := New(ctx, f.g, KeySelector{Label: "rsa-signer"})
	if err != nil {
		t.Fatal(err)
	}
	pub := signer.Public().(*rsa.PublicKey)
	var dec crypto.Decrypter = signer
	failOver(t, f, func(stage string) {
		d := sha256.Sum256([]byte(stage))
		sig, err := signer.Sign(rand.Reader, d[:], crypto.SHA256)
		if err != nil {
			t.Fatalf("%s: PKCS#1 v1.5: %v", stage, err)
		}
		if err := rsa.VerifyPKCS1v15(pub, crypto.SHA256, d[:], sig); err != nil {
			t.Fatalf("%s: PKCS#1 v1.5 verify: %v", stage, err)
		}
		for _, salt := range []int{rsa.PSSSaltLengthAuto, rsa.PSSSaltLengthEqualsHash} {
			opts := &rsa.PSSOptions{SaltLength: salt, Hash: crypto.SHA256}
			sig, err := signer.Sign(rand.Reader, d[:], opts)
			if err != nil {
				t.Fatalf("%s: PSS salt %d: %v", stage, salt, err)
			}
			if err := rsa.VerifyPSS(pub, crypto.SHA256, d[:], sig, opts); err != nil {
				t.Fatalf("%s: PSS salt %d verify: %v", stage, salt, err)
			}
		}
		d512 := sha512.Sum512([]byte(stage))
		sig, err = signer.Sign(rand.Reader, d512[:], crypto.SHA512)
		if err != nil || rsa.VerifyPKCS1v15(pub, crypto.SHA512, d512[:], sig) != nil {
			t.Fatalf("%s: SHA-512 PKCS#1 v1.5: %v", stage, err)
		}
		msg := []byte("secret for " + stage)
		// SoftHSM 2.6 does OAEP with SHA-1 and no label only.
		ct, err := rsa.EncryptOAEP(sha1.New(), rand.Reader, pub, msg, nil)
		if err != nil {
			t.Fatal(err)
		}
		pt, err := dec.Decrypt(rand.Reader, ct, &rsa.OAEPOptions{Hash: crypto.SHA1})
		if err != nil || string(pt) != string(msg) {
			t.Fatalf("%s: OAEP decrypt: %q, %v", stage, pt, err)
		}
		ct, err = rsa.EncryptPKCS1v15(rand.Reader, pub, msg)
		if err != nil {
			t.Fatal(err)
		}
		pt, err = dec.Decrypt(rand.Reader, ct, nil)
		if err != nil || string(pt) != string(msg) {
			t.Fatalf("%s: PKCS#1 v1.5 decrypt: %q, %v", stage, pt, err)
		}
	})
}

func TestSignerEd25519AcrossFailover(t *testing.T) {
	f := setup(t)
	ctx := testContext(t)
	mechs, err := f.g.Mechanisms(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(mechs, slot.CKMEdDSA) {
		t.Skip("the members do not offer CKM_EDDSA")
	}
	f.importEd25519(t, "ed")
	signer, err := New(ctx, f.g, KeySelector{Label: "ed"})
	if err != nil {
		t.Fatal(err)
	}
	pub := signer.Public().(ed25519.PublicKey)
	failOver(t, f, func(stage string) {
		msg := []byte(stage)
		sig, err := signer.Sign(rand.Reader, msg, crypto.Hash(0))
		if err != nil {
			t.Fatalf("%s: %v", stage, err)
		}
		if !ed25519.Verify(pub, msg, sig) {
			t.Fatalf("%s: Ed25519 signature does not verify", stage)
		}
	})
	if _, err := signer.Decrypt(rand.Reader, []byte("x"), nil); err == nil {
		t.Errorf("Decrypt with an Ed25519 key succeeded")
	}
}

func TestSignerSelector(t *testing.T) {
	f := setup(t)
	ctx := testContext(t)
	if _, err := New(ctx, f.g, KeySelector{}); err == nil {
		t.Error("empty selector accepted")
	}
	if _, err := New(ctx, f.g, KeySelector{Label: "absent"}); group.CodeOf(err) != pkcs11.CKR_KEY_HANDLE_INVALID {
		t.Errorf("absent key: %v", err)
	}
	f.genEC(t, "by-id", attr(pkcs11.CKA_ID, []byte{0xca, 0xfe}))
	sg, err := New(ctx, f.g, KeySelector{ID: []byte{0xca, 0xfe}})
	if err != nil {
		t.Fatalf("select by ID: %v", err)
	}
	if _, ok := sg.Public().(*ecdsa.PublicKey); !ok {
		t.Errorf("public key %T", sg.Public())
	}
}
