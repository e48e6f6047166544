package object

import (
	"crypto/aes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"math/big"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/internal/synctest"
	"github.com/miekg/pkcs11"
)

func TestIdentityKeyAndString(t *testing.T) {
	a := Identity{Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_EC, ID: []byte{0x0a, 0x01}, Label: "signer"}
	tests := []struct {
		name  string
		other Identity
		equal bool
	}{
		{"same", Identity{Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_EC, ID: []byte{0x0a, 0x01}, Label: "signer"}, true},
		{"other class", Identity{Class: pkcs11.CKO_PUBLIC_KEY, KeyType: pkcs11.CKK_EC, ID: []byte{0x0a, 0x01}, Label: "signer"}, false},
		{"other key type", Identity{Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_RSA, ID: []byte{0x0a, 0x01}, Label: "signer"}, false},
		{"other id", Identity{Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_EC, ID: []byte{0x0a}, Label: "signer"}, false},
		{"other label", Identity{Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_EC, ID: []byte{0x0a, 0x01}, Label: "signer2"}, false},
		// An ID byte must not be confusable with a label character.
		{"id/label boundary", Identity{Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_EC, ID: []byte{0x0a}, Label: "01/signer"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := a.Key() == tc.other.Key(); got != tc.equal {
				t.Errorf("Key() equal = %v, want %v (%q vs %q)", got, tc.equal, a.Key(), tc.other.Key())
			}
		})
	}
	m := map[string]int{a.Key(): 1}
	if m[Identity{Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_EC, ID: []byte{0x0a, 0x01}, Label: "signer"}.Key()] != 1 {
		t.Error("an equal identity does not find the map entry")
	}
	if got, want := a.String(), `private key EC id=0a01 label="signer"`; got != want {
		t.Errorf("String() = %s, want %s", got, want)
	}
	cert := Identity{Class: pkcs11.CKO_CERTIFICATE, KeyType: NoKeyType, Label: `a "b"`}
	if got, want := cert.String(), `certificate id=none label="a \"b\""`; got != want {
		t.Errorf("String() = %s, want %s", got, want)
	}
}

// spkiSum is the fingerprint a user computes with Go's own encoder (or
// `openssl pkey -pubin -outform DER | sha256sum`).
func spkiSum(t *testing.T, pub any) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(der)
	return s[:]
}

func ecPublicFromToken(t *testing.T, point []byte) *ecdsa.PublicKey {
	t.Helper()
	var raw []byte
	if _, err := asn1.Unmarshal(point, &raw); err != nil {
		t.Fatalf("CKA_EC_POINT %x is not an OCTET STRING: %v", point, err)
	}
	pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), raw)
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

func TestFingerprints(t *testing.T) {
	ss, _ := openN(t, 1)
	s := ss[0]
	ctx := testContext(t)

	t.Run("EC P-256", func(t *testing.T) {
		kp := genEC(t, s, "fp-ec", randomID(t))
		point, ok := getAttr(t, s, kp.Pub, pkcs11.CKA_EC_POINT)
		if !ok {
			t.Fatal("no CKA_EC_POINT on the public key")
		}
		want := spkiSum(t, ecPublicFromToken(t, point))
		if got := mustFingerprint(t, s, kp.Pub); !sameBytes(got, want) {
			t.Errorf("public key fingerprint %x, want SHA-256 of its SubjectPublicKeyInfo %x", got, want)
		}
		if got := mustFingerprint(t, s, kp.Priv); !sameBytes(got, want) {
			t.Errorf("private key fingerprint %x, want that of its public half %x", got, want)
		}
	})
	t.Run("RSA", func(t *testing.T) {
		kp := genRSA(t, s, "fp-rsa", randomID(t))
		n, _ := getAttr(t, s, kp.Pub, pkcs11.CKA_MODULUS)
		e, _ := getAttr(t, s, kp.Pub, pkcs11.CKA_PUBLIC_EXPONENT)
		want := spkiSum(t, &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())})
		if got := mustFingerprint(t, s, kp.Pub); !sameBytes(got, want) {
			t.Errorf("public key fingerprint %x, want %x", got, want)
		}
		if got := mustFingerprint(t, s, kp.Priv); !sameBytes(got, want) {
			t.Errorf("private key fingerprint %x, want %x", got, want)
		}
	})
	t.Run("Ed25519", func(t *testing.T) {
		kp := genEd25519(t, s, "fp-ed", randomID(t))
		point, _ := getAttr(t, s, kp.Pub, pkcs11.CKA_EC_POINT)
		var raw []byte
		if _, err := asn1.Unmarshal(point, &raw); err != nil || len(raw) != ed25519.PublicKeySize {
			t.Fatalf("CKA_EC_POINT %x is not a 32-byte OCTET STRING (%v)", point, err)
		}
		want := spkiSum(t, ed25519.PublicKey(raw))
		if got := mustFingerprint(t, s, kp.Pub); !sameBytes(got, want) {
			t.Errorf("public key fingerprint %x, want %x", got, want)
		}
		// SoftHSM keeps "edwards25519" as the private half's EC params and
		// the OID on the public half: one key, one fingerprint.
		if got := mustFingerprint(t, s, kp.Priv); !sameBytes(got, want) {
			t.Errorf("private key fingerprint %x, want %x", got, want)
		}
	})
	t.Run("AES check value", func(t *testing.T) {
		value := make([]byte, 32)
		rand.Read(value)
		h, err := s.CreateObject(ctx, []*pkcs11.Attribute{
			attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
			attr(pkcs11.CKA_VALUE, value), attr(pkcs11.CKA_TOKEN, false), attr(pkcs11.CKA_ENCRYPT, true),
			attr(pkcs11.CKA_LABEL, "fp-aes")})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := aes.NewCipher(value)
		zero := make([]byte, 16)
		b.Encrypt(zero, zero)
		if got := mustFingerprint(t, s, h); !sameBytes(got, zero[:3]) {
			t.Errorf("AES fingerprint %x, want the key check value %x", got, zero[:3])
		}
		// The fallback for tokens without CKA_CHECK_VALUE agrees with it.
		got, err := kcvByEncrypt(ctx, s, h, pkcs11.CKM_AES_ECB, 16)
		if err != nil || !sameBytes(got, zero[:3]) {
			t.Errorf("computed check value %x (%v), want %x", got, err, zero[:3])
		}
		// A key that may not encrypt still has its CKA_CHECK_VALUE.
		noEnc := genAES(t, s, "fp-aes-noenc", randomID(t), attr(pkcs11.CKA_ENCRYPT, false))
		if fp := mustFingerprint(t, s, noEnc); len(fp) != 3 {
			t.Errorf("fingerprint of an AES key without CKA_ENCRYPT: %x, want a 3-byte check value", fp)
		}
	})
	t.Run("certificate and data", func(t *testing.T) {
		der := synctest.SelfSignedCert(t)
		h, err := s.CreateObject(ctx, []*pkcs11.Attribute{
			attr(pkcs11.CKA_CLASS, pkcs11.CKO_CERTIFICATE), attr(pkcs11.CKA_CERTIFICATE_TYPE, pkcs11.CKC_X_509),
			attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_VALUE, der), attr(pkcs11.CKA_SUBJECT, []byte{0x30, 0}),
			attr(pkcs11.CKA_LABEL, "fp-cert")})
		if err != nil {
			t.Fatal(err)
		}
		want := sha256.Sum256(der)
		if got := mustFingerprint(t, s, h); !sameBytes(got, want[:]) {
			t.Errorf("certificate fingerprint %x, want SHA-256 of its DER %x", got, want)
		}
		d, err := s.CreateObject(ctx, []*pkcs11.Attribute{
			attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, true),
			attr(pkcs11.CKA_VALUE, []byte("some data")), attr(pkcs11.CKA_LABEL, "fp-data")})
		if err != nil {
			t.Fatal(err)
		}
		wantD := sha256.Sum256([]byte("some data"))
		if got := mustFingerprint(t, s, d); !sameBytes(got, wantD[:]) {
			t.Errorf("data fingerprint %x, want %x", got, wantD)
		}
	})
	t.Run("EC private half alone", func(t *testing.T) {
		kp := genEC(t, s, "fp-lonely", nil)
		if err := s.DestroyObject(ctx, kp.Pub); err != nil {
			t.Fatal(err)
		}
		_, err := Fingerprint(ctx, s, kp.Priv)
		if !errors.Is(err, ErrNoFingerprint) {
			t.Fatalf("Fingerprint of an EC private key with no public half: %v, want ErrNoFingerprint", err)
		}
		if !strings.Contains(err.Error(), s.Name()) {
			t.Errorf("error %q does not name the member", err)
		}
		o, err := ReadObject(ctx, s, kp.Priv)
		if err != nil || o.Fingerprint != nil || o.Label != "fp-lonely" || o.Class != pkcs11.CKO_PRIVATE_KEY {
			t.Errorf("ReadObject = %+v, %v; want the object with a nil fingerprint", o, err)
		}
	})
}
