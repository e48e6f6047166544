package domainkey

import (
	"context"
	"crypto/rand"
	"os"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

func TestMain(m *testing.M) { os.Exit(testhsm.Main(m, 32)) }

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

// installDomain installs the domain key of serial on the slots.
func installDomain(t *testing.T, serial string, trusted bool, ss []*slot.Slot, toks []testhsm.Token) {
	t.Helper()
	var ms []Target
	for i, s := range ss {
		m := Target{Slot: s}
		if trusted {
			m.SOPIN = secret.PINFromString(toks[i].SOPIN)
			m.UserPIN = secret.PINFromString(toks[i].UserPIN)
		}
		ms = append(ms, m)
	}
	if err := Install(testContext(t), ms, serial); err != nil {
		t.Fatalf("install domain key: %v", err)
	}
}

var kwp = pkcs11.NewMechanism(Mechanism, nil)
