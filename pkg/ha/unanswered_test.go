package ha

import (
	"errors"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
)

// Issue 15: a key generation sent to the primary and never answered (the
// primary made the key pair, then died before its answer) fails for the
// application, and the pair it left on the primary is not the group's.
// When the primary returns, its catch-up — by another host, which knows
// of the creation only from the intent published on the members — must
// destroy that pair, not spread it: afterwards no member holds it and no
// process finds it.
func TestUnansweredGenerationLeavesNoKey(t *testing.T) {
	h := newHosts(t, 3)
	ctx := testCtx(t)
	faults := slottest.NewFaults()
	hostA, err := Open(ctx, h.cfg, h.set, Options{StateDir: t.TempDir(), Interceptor: faults})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hostA.Close() })
	if err := hostA.Engine().Login(ctx, pkcs11.CKU_USER, secret.PINFromString(testhsm.UserPIN)); err != nil {
		t.Fatal(err)
	}
	primary := hostA.Engine().Status().Primary
	sa := openSession(t, hostA)
	faults.LoseAnswer(primary, slot.OpGenerateKeyPair)
	pubT := []*pkcs11.Attribute{a(pkcs11.CKA_TOKEN, true), a(pkcs11.CKA_LABEL, "unanswered"), a(pkcs11.CKA_VERIFY, true),
		a(pkcs11.CKA_EC_PARAMS, []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07})}
	privT := []*pkcs11.Attribute{a(pkcs11.CKA_TOKEN, true), a(pkcs11.CKA_LABEL, "unanswered"), a(pkcs11.CKA_SIGN, true),
		a(pkcs11.CKA_PRIVATE, true), a(pkcs11.CKA_SENSITIVE, true)}
	if _, _, err := sa.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil), pubT, privT); err == nil {
		t.Fatal("GenerateKeyPair succeeded although the primary's answer was lost")
	}
	var ptok testhsm.Token
	for _, tok := range h.toks {
		if tok.Name == primary {
			ptok = tok
		}
	}
	if got := findLabelled(t, direct(t, ptok), "unanswered"); len(got) != 2 {
		t.Fatalf("%s holds %v; the test needs the pair the lost call made there", primary, got)
	}
	if m, _ := hostA.Engine().Member(primary); m.State().Serving() {
		t.Fatalf("%s still serves in host A after it did not answer", primary)
	}
	faults.Heal(primary)

	// Another host catches the primary up: it knows of the creation only
	// from the members.
	hostB := h.open(nil)
	if m, _ := hostB.Engine().Member(primary); m.State() == member.Active {
		if err := hostB.Engine().FailMember(primary, errors.New("test: host B catches it up")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := hostB.Recover(ctx, primary); err != nil {
		t.Fatalf("host B recovers %s: %v", primary, err)
	}
	if _, err := hostA.Recover(ctx, primary); err != nil {
		t.Fatalf("host A recovers %s: %v", primary, err)
	}
	for _, tok := range h.toks {
		if got := findLabelled(t, direct(t, tok), "unanswered"); len(got) != 0 {
			t.Errorf("%s holds %v after the primary came back", tok.Name, got)
		}
	}
	for name, g := range map[string]*Group{"host A": hostA, "host B": hostB, "a fresh host": h.open(nil)} {
		hs, err := openSession(t, g).Find(ctx, []*pkcs11.Attribute{a(pkcs11.CKA_LABEL, "unanswered")})
		if err != nil || len(hs) != 0 {
			t.Errorf("%s finds %d objects labelled unanswered (%v)", name, len(hs), err)
		}
	}
}
