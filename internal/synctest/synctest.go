// Package synctest holds the helpers the tests of pkg/sync and its
// subpackages share: a member opened on a test token, and the keys they
// make on it. It is imported by tests only.
package synctest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// The curves' CKA_EC_PARAMS.
var (
	P256Params    = []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}
	Ed25519Params = []byte{0x06, 0x03, 0x2b, 0x65, 0x70}
)

func a(t uint, v any) *pkcs11.Attribute { return pkcs11.NewAttribute(t, v) }

// Context is the test's context, bounded to 30 s.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// OpenSlot opens tok logged in as the user.
func OpenSlot(t *testing.T, tok testhsm.Token, ic slot.Interceptor) *slot.Slot {
	t.Helper()
	s, err := slot.Open(Context(t), slot.Spec{
		Name:           tok.Name,
		Module:         tok.Module,
		ModuleEnv:      tok.ModuleEnv,
		InitArgs:       tok.InitArgs,
		TokenLabel:     tok.Label,
		PIN:            secret.PINFromString(tok.UserPIN),
		CommandTimeout: 10 * time.Second,
		Interceptor:    ic,
	})
	if err != nil {
		t.Fatalf("open %s: %v", tok.Name, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// OpenN takes n fresh tokens and opens them.
func OpenN(t *testing.T, n int) ([]*slot.Slot, []testhsm.Token) {
	t.Helper()
	toks := testhsm.Take(t, n)
	ss := make([]*slot.Slot, n)
	for i, tok := range toks {
		ss[i] = OpenSlot(t, tok, nil)
	}
	return ss, toks
}

// RandomID is a random CKA_ID.
func RandomID(t *testing.T) []byte {
	id := make([]byte, 8)
	if _, err := rand.Read(id); err != nil {
		t.Fatal(err)
	}
	return id
}

// KeyPair is a generated key pair's two handles.
type KeyPair struct{ Pub, Priv pkcs11.ObjectHandle }

// GenEC makes a P-256 key pair, extractable, on s.
func GenEC(t *testing.T, s *slot.Slot, label string, id []byte, extra ...*pkcs11.Attribute) KeyPair {
	t.Helper()
	pub, priv, err := s.GenerateKeyPair(Context(t), pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{a(pkcs11.CKA_EC_PARAMS, P256Params), a(pkcs11.CKA_TOKEN, true),
			a(pkcs11.CKA_VERIFY, true), a(pkcs11.CKA_LABEL, label), a(pkcs11.CKA_ID, id)},
		append([]*pkcs11.Attribute{a(pkcs11.CKA_TOKEN, true), a(pkcs11.CKA_PRIVATE, true),
			a(pkcs11.CKA_SIGN, true), a(pkcs11.CKA_SENSITIVE, true), a(pkcs11.CKA_EXTRACTABLE, true),
			a(pkcs11.CKA_LABEL, label), a(pkcs11.CKA_ID, id)}, extra...))
	if err != nil {
		t.Fatalf("generate EC key pair on %s: %v", s.Name(), err)
	}
	return KeyPair{Pub: pub, Priv: priv}
}

// GenEd25519 makes an Ed25519 key pair, extractable, on s.
func GenEd25519(t *testing.T, s *slot.Slot, label string, id []byte) KeyPair {
	t.Helper()
	pub, priv, err := s.GenerateKeyPair(Context(t), pkcs11.NewMechanism(slot.CKMECEdwardsKeyPairGen, nil),
		[]*pkcs11.Attribute{a(pkcs11.CKA_EC_PARAMS, Ed25519Params), a(pkcs11.CKA_TOKEN, true),
			a(pkcs11.CKA_VERIFY, true), a(pkcs11.CKA_LABEL, label), a(pkcs11.CKA_ID, id)},
		[]*pkcs11.Attribute{a(pkcs11.CKA_TOKEN, true), a(pkcs11.CKA_PRIVATE, true),
			a(pkcs11.CKA_SIGN, true), a(pkcs11.CKA_SENSITIVE, true), a(pkcs11.CKA_EXTRACTABLE, true),
			a(pkcs11.CKA_LABEL, label), a(pkcs11.CKA_ID, id)})
	if err != nil {
		t.Fatalf("generate Ed25519 key pair on %s: %v", s.Name(), err)
	}
	return KeyPair{Pub: pub, Priv: priv}
}

// GenRSA makes an RSA-2048 key pair, extractable, on s.
func GenRSA(t testing.TB, s *slot.Slot, label string, id []byte) KeyPair {
	t.Helper()
	pub, priv, err := s.GenerateKeyPair(Context(t), pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{a(pkcs11.CKA_MODULUS_BITS, 2048), a(pkcs11.CKA_PUBLIC_EXPONENT, []byte{1, 0, 1}),
			a(pkcs11.CKA_TOKEN, true), a(pkcs11.CKA_VERIFY, true), a(pkcs11.CKA_ENCRYPT, true),
			a(pkcs11.CKA_LABEL, label), a(pkcs11.CKA_ID, id)},
		[]*pkcs11.Attribute{a(pkcs11.CKA_TOKEN, true), a(pkcs11.CKA_PRIVATE, true),
			a(pkcs11.CKA_SIGN, true), a(pkcs11.CKA_DECRYPT, true), a(pkcs11.CKA_SENSITIVE, true),
			a(pkcs11.CKA_EXTRACTABLE, true), a(pkcs11.CKA_LABEL, label), a(pkcs11.CKA_ID, id)})
	if err != nil {
		t.Fatalf("generate RSA key pair on %s: %v", s.Name(), err)
	}
	return KeyPair{Pub: pub, Priv: priv}
}

// GenAES makes an AES-256 key, extractable, on s.
func GenAES(t testing.TB, s *slot.Slot, label string, id []byte, extra ...*pkcs11.Attribute) pkcs11.ObjectHandle {
	t.Helper()
	h, err := s.GenerateKey(Context(t), pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil),
		append([]*pkcs11.Attribute{a(pkcs11.CKA_VALUE_LEN, 32), a(pkcs11.CKA_TOKEN, true),
			a(pkcs11.CKA_PRIVATE, true), a(pkcs11.CKA_SENSITIVE, true), a(pkcs11.CKA_EXTRACTABLE, true),
			a(pkcs11.CKA_ENCRYPT, true), a(pkcs11.CKA_DECRYPT, true),
			a(pkcs11.CKA_LABEL, label), a(pkcs11.CKA_ID, id)}, extra...))
	if err != nil {
		t.Fatalf("generate AES key on %s: %v", s.Name(), err)
	}
	return h
}

// GetAttr reads one attribute; ok is false unless the token returned it.
func GetAttr(t *testing.T, s interface {
	GetAttributes(context.Context, pkcs11.ObjectHandle, []uint) ([]slot.Attribute, error)
}, h pkcs11.ObjectHandle, typ uint) ([]byte, bool) {
	t.Helper()
	got, err := s.GetAttributes(Context(t), h, []uint{typ})
	if err != nil {
		t.Fatalf("read attribute 0x%x of %d: %v", typ, h, err)
	}
	if len(got) != 1 || got[0].Status != pkcs11.CKR_OK {
		return nil, false
	}
	return got[0].Value, true
}

// FindByLabel returns every object labelled label that the login sees.
func FindByLabel(t *testing.T, s *slot.Slot, label string) []pkcs11.ObjectHandle {
	t.Helper()
	hs, err := s.FindObjects(Context(t), []*pkcs11.Attribute{a(pkcs11.CKA_LABEL, label)})
	if err != nil {
		t.Fatalf("find %q on %s: %v", label, s.Name(), err)
	}
	return hs
}

// SelfSignedCert is the DER of a fresh self-signed P-256 certificate.
func SelfSignedCert(t *testing.T) []byte {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(42),
		Subject:      pkix.Name{CommonName: "hagroup test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	return der
}
