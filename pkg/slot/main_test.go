package slot_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"encoding/asn1"
	"math/big"
	"os"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/dispatch"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
)

func TestMain(m *testing.M) { os.Exit(testhsm.Main(m, 80)) }

// specOf builds a slot.Spec naming tok by label, logging in as its user.
func specOf(tok testhsm.Token) slot.Spec {
	return slot.Spec{
		Name:       tok.Name,
		Module:     tok.Module,
		ModuleEnv:  tok.ModuleEnv,
		TokenLabel: tok.Label,
		PIN:        secret.PINFromString(tok.UserPIN),
	}
}

// ctxT returns a context bounded by the test's deadline and 30 s.
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// open opens spec and closes the slot when the test ends.
// openFaulty opens spec with a fault injector on it, healed when the test
// ends so that no call stays hung in it.
func openFaulty(t testing.TB, tok testhsm.Token, spec slot.Spec) (*slot.Slot, *slottest.Faults) {
	t.Helper()
	f := slottest.NewFaults()
	spec.Interceptor = f
	t.Cleanup(func() { f.Heal(tok.Name) })
	return open(t, spec), f
}

// A SoftHSM spec with a deadline shorter than the default (a test about
// deadlines) first has its token opened under the default one, kept open until the
// test ends: the module's C_Initialize (every token of the pool read) and
// the C_Login, which a loaded machine can make slower than the deadline
// under test, are then done, and the short deadline bounds only the calls
// the test is about.
func open(t testing.TB, spec slot.Spec) *slot.Slot {
	t.Helper()
	if spec.CommandTimeout > 0 && spec.CommandTimeout < dispatch.DefaultCommandTimeout && spec.Module == testhsm.SoftHSMModule {
		warm := spec
		warm.CommandTimeout, warm.Interceptor = 0, nil
		open(t, warm)
	}
	s, err := slot.Open(ctxT(t), spec)
	if err != nil {
		t.Fatalf("Open(%s): %v", spec.Name, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// p256OID is the DER OID of the NIST P-256 curve, as CKA_EC_PARAMS wants it.
var p256OID = []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}

// ecKeyTemplates returns templates for a P-256 signing key pair labelled label.
func ecKeyTemplates(label string, token bool) (pub, priv []*pkcs11.Attribute) {
	pub = []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_PUBLIC_KEY),
		pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_EC),
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, token),
		pkcs11.NewAttribute(pkcs11.CKA_VERIFY, true),
		pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, p256OID),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, label),
	}
	priv = []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY),
		pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_EC),
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, token),
		pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
		pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true),
		pkcs11.NewAttribute(pkcs11.CKA_SIGN, true),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, label),
	}
	return pub, priv
}

// newECKey generates a P-256 token key pair labelled label on s.
func newECKey(t testing.TB, s *slot.Slot, label string) (pub, priv pkcs11.ObjectHandle) {
	t.Helper()
	pt, kt := ecKeyTemplates(label, true)
	pub, priv, err := s.GenerateKeyPair(ctxT(t), pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil), pt, kt)
	if err != nil {
		t.Fatalf("GenerateKeyPair on %s: %v", s.Name(), err)
	}
	return pub, priv
}

// findOne finds the single object of class with label on s.
func findOne(t testing.TB, s *slot.Slot, class uint, label string) pkcs11.ObjectHandle {
	t.Helper()
	hs, err := s.FindObjects(ctxT(t), []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, class),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, label),
	})
	if err != nil {
		t.Fatalf("FindObjects(%s) on %s: %v", label, s.Name(), err)
	}
	if len(hs) != 1 {
		t.Fatalf("FindObjects(%s) on %s: %d objects, want 1", label, s.Name(), len(hs))
	}
	return hs[0]
}

// ecPublic reads the public key of an EC public key object.
func ecPublic(t testing.TB, s *slot.Slot, pub pkcs11.ObjectHandle) *ecdsa.PublicKey {
	t.Helper()
	attrs, err := s.GetAttributes(ctxT(t), pub, []uint{pkcs11.CKA_EC_POINT})
	if err != nil || attrs[0].Status != pkcs11.CKR_OK {
		t.Fatalf("read CKA_EC_POINT: %v (status %#x)", err, attrs[0].Status)
	}
	var point []byte
	if _, err := asn1.Unmarshal(attrs[0].Value, &point); err != nil {
		t.Fatalf("CKA_EC_POINT is not a DER OCTET STRING: %v", err)
	}
	x, y := elliptic.Unmarshal(elliptic.P256(), point)
	if x == nil {
		t.Fatalf("CKA_EC_POINT is not a P-256 point")
	}
	return &ecdsa.PublicKey{Curve: elliptic.P256(), X: x, Y: y}
}

// checkSig verifies a raw (r||s) ECDSA signature over sha256(msg) in Go.
func checkSig(t testing.TB, pub *ecdsa.PublicKey, msg, sig []byte) {
	t.Helper()
	if len(sig) != 64 {
		t.Fatalf("signature is %d bytes, want 64", len(sig))
	}
	h := sha256.Sum256(msg)
	r, s := new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])
	if !ecdsa.Verify(pub, h[:], r, s) {
		t.Fatalf("signature does not verify with the token's public key")
	}
}

var ecdsaMech = pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil)

// signDigest signs sha256(msg) on s with key.
func signDigest(ctx context.Context, s interface {
	Sign(context.Context, *pkcs11.Mechanism, pkcs11.ObjectHandle, []byte) ([]byte, error)
}, key pkcs11.ObjectHandle, msg []byte) ([]byte, error) {
	h := sha256.Sum256(msg)
	return s.Sign(ctx, ecdsaMech, key, h[:])
}
