package ha

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/recover"
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

// holdAnswer is a slot.WrapInterceptor that lets the first op call on
// token run, tells made, and holds its answer until release is closed: a
// creation in flight with its objects on the member.
type holdAnswer struct {
	token         string
	op            slot.Op
	made, release chan struct{}
	once          sync.Once
}

func (h *holdAnswer) Before(context.Context, string, slot.Op) error { return nil }

func (h *holdAnswer) Wrap(_ context.Context, name string, op slot.Op, call func() error) error {
	err := call()
	if name == h.token && op == h.op {
		h.once.Do(func() {
			close(h.made)
			<-h.release
		})
	}
	return err
}

// Two processes of one host share the state directory, and a member
// serving in one may be returning in the other. While the first makes a
// key pair there (its intents standing in the shared journal, the pair
// on that member alone), the second's catch-up of the member must not
// take the pair for what a creation that died left: it waits for the
// creation (ErrCreationInFlight), and afterwards every member holds the
// pair the first process was told it made. The soak found the loss: the
// public half of a key pair whose creation returned OK was gone from
// every member.
func TestCatchUpLeavesACreationInFlightInAnotherProcess(t *testing.T) {
	h := newHosts(t, 3)
	ctx := testCtx(t)
	dir := t.TempDir()
	open := func(ic slot.Interceptor) *Group {
		g, err := Open(ctx, h.cfg, h.set, Options{StateDir: dir, Interceptor: ic})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Close() })
		if err := g.Engine().Login(ctx, pkcs11.CKU_USER, secret.PINFromString(testhsm.UserPIN)); err != nil {
			t.Fatal(err)
		}
		return g
	}
	hold := &holdAnswer{op: slot.OpGenerateKeyPair, made: make(chan struct{}), release: make(chan struct{})}
	maker := open(hold)
	primary := maker.Engine().Status().Primary
	hold.token = primary
	other := open(nil)
	if err := other.Engine().FailMember(primary, errors.New("test: returning in this process")); err != nil {
		t.Fatal(err)
	}
	pubT := []*pkcs11.Attribute{a(pkcs11.CKA_TOKEN, true), a(pkcs11.CKA_LABEL, "in-flight"), a(pkcs11.CKA_VERIFY, true),
		a(pkcs11.CKA_EC_PARAMS, []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07})}
	privT := []*pkcs11.Attribute{a(pkcs11.CKA_TOKEN, true), a(pkcs11.CKA_LABEL, "in-flight"), a(pkcs11.CKA_SIGN, true),
		a(pkcs11.CKA_PRIVATE, true), a(pkcs11.CKA_SENSITIVE, true)}
	s := openSession(t, maker)
	made := make(chan error, 1)
	go func() {
		_, _, err := s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil), pubT, privT)
		made <- err
	}()
	select {
	case <-hold.made:
	case err := <-made:
		t.Fatalf("GenerateKeyPair returned (%v) before it was held", err)
	}
	_, err := other.Recover(ctx, primary)
	close(hold.release)
	if !errors.Is(err, recover.ErrCreationInFlight) {
		t.Errorf("the other process's catch-up of %s during the creation: %v; want ErrCreationInFlight", primary, err)
	}
	if err := <-made; err != nil {
		t.Fatalf("GenerateKeyPair: %v", err)
	}
	if _, err := other.Recover(ctx, primary); err != nil {
		t.Fatalf("the catch-up of %s once the creation returned: %v", primary, err)
	}
	for _, tok := range h.toks {
		if got := findLabelled(t, direct(t, tok), "in-flight"); len(got) != 2 {
			t.Errorf("%s holds %v of the pair whose creation returned OK, want both halves", tok.Name, got)
		}
	}
}
