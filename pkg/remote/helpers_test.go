package remote_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// 5 tokens a run: room for -count=3 and the benchmark.
func TestMain(m *testing.M) { os.Exit(testhsm.Main(m, 20)) }

// ctxT returns a context bounded by the test's deadline and 60 s.
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// specOf builds a slot.Spec naming tok by label, logging in as its user.
func specOf(tok testhsm.Token, timeout time.Duration) slot.Spec {
	return slot.Spec{
		Name:           tok.Name,
		Module:         tok.Module,
		ModuleEnv:      tok.ModuleEnv,
		TokenLabel:     tok.Label,
		PIN:            secret.PINFromString(tok.UserPIN),
		CommandTimeout: timeout,
	}
}

// open opens tok logged in as the user, closed when the test ends.
func open(t testing.TB, tok testhsm.Token, timeout time.Duration) *slot.Slot {
	t.Helper()
	s, err := slot.Open(ctxT(t), specOf(tok, timeout))
	if err != nil {
		t.Fatalf("Open(%s): %v", tok.Name, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func attr(t uint, v any) *pkcs11.Attribute { return pkcs11.NewAttribute(t, v) }

// p256 is the DER OID of NIST P-256 for CKA_EC_PARAMS.
var p256 = []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}

// genEC makes a token P-256 key pair labelled label; the private half is
// sensitive and extractable (it can leave only wrapped).
func genEC(t testing.TB, s *slot.Slot, label string) (pub, priv pkcs11.ObjectHandle) {
	t.Helper()
	pub, priv, err := s.GenerateKeyPair(ctxT(t), pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_EC_PARAMS, p256),
			attr(pkcs11.CKA_VERIFY, true), attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_ID, []byte(label))},
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true),
			attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_SENSITIVE, true), attr(pkcs11.CKA_EXTRACTABLE, true),
			attr(pkcs11.CKA_DERIVE, true), attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_ID, []byte(label))})
	if err != nil {
		t.Fatalf("%s: generate EC key pair: %v", s.Name(), err)
	}
	return pub, priv
}

// findOne returns the one object with label and class.
func findOne(t testing.TB, s *slot.Slot, label string, class uint) pkcs11.ObjectHandle {
	t.Helper()
	hs, err := s.FindObjects(ctxT(t), []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_CLASS, class)})
	if err != nil {
		t.Fatalf("%s: find %q: %v", s.Name(), label, err)
	}
	if len(hs) != 1 {
		t.Fatalf("%s: find %q: %d objects, want 1", s.Name(), label, len(hs))
	}
	return hs[0]
}

// signVerify signs data on s with priv and checks the signature with pub
// on verifier.
func signVerify(t testing.TB, s *slot.Slot, priv pkcs11.ObjectHandle, verifier *slot.Slot, pub pkcs11.ObjectHandle) {
	t.Helper()
	digest := make([]byte, 32)
	for i := range digest {
		digest[i] = byte(i)
	}
	m := pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil)
	sig, err := s.Sign(ctxT(t), m, priv, digest)
	if err != nil {
		t.Fatalf("%s: sign: %v", s.Name(), err)
	}
	if err := verifier.Verify(ctxT(t), m, pub, digest, sig); err != nil {
		t.Fatalf("%s: verify a signature of %s: %v", verifier.Name(), s.Name(), err)
	}
}
