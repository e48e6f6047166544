package signer

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/asn1"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/miekg/pkcs11"
)

// Four tests of three tokens, for -count=3.
func TestMain(m *testing.M) { os.Exit(testhsm.Main(m, 40)) }

var serials atomic.Int64

// fixture is a logged-in group of three SoftHSM members sharing a domain
// key, and a session on it.
type fixture struct {
	g    *group.Group
	s    *group.Session
	toks []testhsm.Token
}

func setup(t *testing.T) *fixture {
	t.Helper()
	ctx := testContext(t)
	f := &fixture{toks: testhsm.Take(t, 3)}
	serial := fmt.Sprintf("%d", 3000000+serials.Add(1))
	cfg := config.Group{Label: "signer-" + serial, Serial: serial}
	for _, tok := range f.toks {
		cfg.Members = append(cfg.Members, config.Member{Name: tok.Name, Module: tok.Module, ModuleEnv: tok.ModuleEnv, TokenLabel: tok.Label})
	}
	g, err := group.Open(ctx, cfg, config.Defaults(), group.Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { g.Close() })
	if err := g.Login(ctx, pkcs11.CKU_USER, secret.PINFromString(testhsm.UserPIN)); err != nil {
		t.Fatalf("Login: %v", err)
	}
	var targets []domainkey.Target
	for _, tok := range f.toks {
		m, _ := g.Member(tok.Name)
		targets = append(targets, domainkey.Target{Slot: m.Slot()})
	}
	if err := domainkey.Install(ctx, targets, serial); err != nil {
		t.Fatalf("install domain key: %v", err)
	}
	if f.s, err = g.OpenSession(ctx, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION); err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	t.Cleanup(func() { f.s.Close() })
	f.g = g
	return f
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func attr(t uint, v any) *pkcs11.Attribute { return pkcs11.NewAttribute(t, v) }

var p256 = []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}

// genEC generates a P-256 key pair through the group.
func (f *fixture) genEC(t *testing.T, label string, extraPriv ...*pkcs11.Attribute) (pub, priv group.ObjectHandle) {
	t.Helper()
	pub, priv, err := f.s.GenerateKeyPair(testContext(t), pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{attr(pkcs11.CKA_EC_PARAMS, p256), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_VERIFY, true), attr(pkcs11.CKA_LABEL, label)},
		append([]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SIGN, true),
			attr(pkcs11.CKA_SENSITIVE, true), attr(pkcs11.CKA_LABEL, label)}, extraPriv...))
	if err != nil {
		t.Fatalf("GenerateKeyPair %s: %v", label, err)
	}
	return pub, priv
}

// importEd25519 puts one Ed25519 key pair, made here, on every member's
// token directly (not through the group, which need not hold the kind).
func (f *fixture) importEd25519(t *testing.T, label string) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	point, _ := asn1.Marshal([]byte(pub))
	params := []byte{0x06, 0x03, 0x2b, 0x65, 0x70}
	id := []byte("id-" + label)
	for _, tok := range f.toks {
		m, _ := f.g.Member(tok.Name)
		ctx := testContext(t)
		if _, err := m.Slot().CreateObject(ctx, []*pkcs11.Attribute{
			attr(pkcs11.CKA_CLASS, pkcs11.CKO_PUBLIC_KEY), attr(pkcs11.CKA_KEY_TYPE, uint(0x40)),
			attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_VERIFY, true), attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_ID, id),
			attr(pkcs11.CKA_EC_PARAMS, params), attr(pkcs11.CKA_EC_POINT, point),
		}); err != nil {
			t.Fatalf("import Ed25519 public key on %s: %v", tok.Name, err)
		}
		if _, err := m.Slot().CreateObject(ctx, []*pkcs11.Attribute{
			attr(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY), attr(pkcs11.CKA_KEY_TYPE, uint(0x40)),
			attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SIGN, true),
			attr(pkcs11.CKA_SENSITIVE, true), attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_ID, id),
			attr(pkcs11.CKA_EC_PARAMS, params), attr(pkcs11.CKA_VALUE, priv.Seed()),
		}); err != nil {
			t.Fatalf("import Ed25519 private key on %s: %v", tok.Name, err)
		}
	}
}
