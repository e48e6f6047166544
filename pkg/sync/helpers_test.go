package sync

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

func TestMain(m *testing.M) { os.Exit(testhsm.Main(m, 320)) }

var (
	oidP256Params = []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}
	oidEd25519Der = []byte{0x06, 0x03, 0x2b, 0x65, 0x70}
)

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// openSlot opens tok logged in as the user.
func openSlot(t *testing.T, tok testhsm.Token, ic slot.Interceptor) *slot.Slot {
	t.Helper()
	s, err := slot.Open(testContext(t), slot.Spec{
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

// openN takes n fresh tokens and opens them.
func openN(t *testing.T, n int) ([]*slot.Slot, []testhsm.Token) {
	t.Helper()
	toks := testhsm.Take(t, n)
	ss := make([]*slot.Slot, n)
	for i, tok := range toks {
		ss[i] = openSlot(t, tok, nil)
	}
	return ss, toks
}

func attr(t uint, v any) *pkcs11.Attribute { return pkcs11.NewAttribute(t, v) }

func randomID(t *testing.T) []byte {
	id := make([]byte, 8)
	if _, err := rand.Read(id); err != nil {
		t.Fatal(err)
	}
	return id
}

type keyPair struct{ pub, priv pkcs11.ObjectHandle }

func genEC(t *testing.T, s *slot.Slot, label string, id []byte, extra ...*pkcs11.Attribute) keyPair {
	t.Helper()
	pub, priv, err := s.GenerateKeyPair(testContext(t), pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{attr(pkcs11.CKA_EC_PARAMS, oidP256Params), attr(pkcs11.CKA_TOKEN, true),
			attr(pkcs11.CKA_VERIFY, true), attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_ID, id)},
		append([]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true),
			attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_SENSITIVE, true), attr(pkcs11.CKA_EXTRACTABLE, true),
			attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_ID, id)}, extra...))
	if err != nil {
		t.Fatalf("generate EC key pair on %s: %v", s.Name(), err)
	}
	return keyPair{pub, priv}
}

func genEd25519(t *testing.T, s *slot.Slot, label string, id []byte) keyPair {
	t.Helper()
	pub, priv, err := s.GenerateKeyPair(testContext(t), pkcs11.NewMechanism(slot.CKMECEdwardsKeyPairGen, nil),
		[]*pkcs11.Attribute{attr(pkcs11.CKA_EC_PARAMS, oidEd25519Der), attr(pkcs11.CKA_TOKEN, true),
			attr(pkcs11.CKA_VERIFY, true), attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_ID, id)},
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true),
			attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_SENSITIVE, true), attr(pkcs11.CKA_EXTRACTABLE, true),
			attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_ID, id)})
	if err != nil {
		t.Fatalf("generate Ed25519 key pair on %s: %v", s.Name(), err)
	}
	return keyPair{pub, priv}
}

func genRSA(t testing.TB, s *slot.Slot, label string, id []byte) keyPair {
	t.Helper()
	pub, priv, err := s.GenerateKeyPair(testContext(t), pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{attr(pkcs11.CKA_MODULUS_BITS, 2048), attr(pkcs11.CKA_PUBLIC_EXPONENT, []byte{1, 0, 1}),
			attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_VERIFY, true), attr(pkcs11.CKA_ENCRYPT, true),
			attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_ID, id)},
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true),
			attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_DECRYPT, true), attr(pkcs11.CKA_SENSITIVE, true),
			attr(pkcs11.CKA_EXTRACTABLE, true), attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_ID, id)})
	if err != nil {
		t.Fatalf("generate RSA key pair on %s: %v", s.Name(), err)
	}
	return keyPair{pub, priv}
}

func genAES(t testing.TB, s *slot.Slot, label string, id []byte, extra ...*pkcs11.Attribute) pkcs11.ObjectHandle {
	t.Helper()
	h, err := s.GenerateKey(testContext(t), pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil),
		append([]*pkcs11.Attribute{attr(pkcs11.CKA_VALUE_LEN, 32), attr(pkcs11.CKA_TOKEN, true),
			attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SENSITIVE, true), attr(pkcs11.CKA_EXTRACTABLE, true),
			attr(pkcs11.CKA_ENCRYPT, true), attr(pkcs11.CKA_DECRYPT, true),
			attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_ID, id)}, extra...))
	if err != nil {
		t.Fatalf("generate AES key on %s: %v", s.Name(), err)
	}
	return h
}

// getAttr reads one attribute; ok is false unless the token returned it.
func getAttr(t *testing.T, s interface {
	GetAttributes(context.Context, pkcs11.ObjectHandle, []uint) ([]slot.Attribute, error)
}, h pkcs11.ObjectHandle, typ uint) ([]byte, bool) {
	t.Helper()
	got, err := s.GetAttributes(testContext(t), h, []uint{typ})
	if err != nil {
		t.Fatalf("read attribute 0x%x of %d: %v", typ, h, err)
	}
	if len(got) != 1 || got[0].Status != pkcs11.CKR_OK {
		return nil, false
	}
	return got[0].Value, true
}

// findByLabel returns every object labelled label that the login sees.
func findByLabel(t *testing.T, s *slot.Slot, label string) []pkcs11.ObjectHandle {
	t.Helper()
	hs, err := s.FindObjects(testContext(t), []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, label)})
	if err != nil {
		t.Fatalf("find %q on %s: %v", label, s.Name(), err)
	}
	return hs
}

func mustFingerprint(t *testing.T, s *slot.Slot, h pkcs11.ObjectHandle) []byte {
	t.Helper()
	fp, err := object.Fingerprint(testContext(t), s, h)
	if err != nil {
		t.Fatalf("fingerprint of %d on %s: %v", h, s.Name(), err)
	}
	return fp
}

func sameBytes(a, b []byte) bool { return len(a) > 0 && bytes.Equal(a, b) }

// installDomain installs the domain key of serial on the slots.
func installDomain(t *testing.T, serial string, trusted bool, ss []*slot.Slot, toks []testhsm.Token) {
	t.Helper()
	var ms []domainkey.Target
	for i, s := range ss {
		m := domainkey.Target{Slot: s}
		if trusted {
			m.SOPIN = secret.PINFromString(toks[i].SOPIN)
			m.UserPIN = secret.PINFromString(toks[i].UserPIN)
		}
		ms = append(ms, m)
	}
	if err := domainkey.Install(testContext(t), ms, serial); err != nil {
		t.Fatalf("install domain key: %v", err)
	}
}
