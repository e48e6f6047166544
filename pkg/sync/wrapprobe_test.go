package sync

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// TestProbeWrap: on a SoftHSM token the probe tries the kinds the token
// generates, finds AES and EC keys wrappable, and leaves no object behind
// (the token was empty; a session object it forgot would be found too, as
// session objects are visible to every session of the process). A token
// behind p11-kit 0.24 offers no CKM_AES_KEY_WRAP_PAD: nothing is tried and
// it can hold no private or secret key.
func TestProbeWrap(t *testing.T) {
	ctx := testContext(t)
	s := openSlot(t, testhsm.Take(t, 1)[0], nil)
	mechs, err := s.Mechanisms(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ProbeWrap(ctx, s, mechs)
	if err != nil {
		t.Fatal(err)
	}
	aes := Kind{pkcs11.CKO_SECRET_KEY, pkcs11.CKK_AES}
	ec := Kind{pkcs11.CKO_PRIVATE_KEY, pkcs11.CKK_EC}
	if !c.Mechanism || !slices.Contains(c.Probed, aes) || !slices.Contains(c.Probed, ec) {
		t.Fatalf("probe of SoftHSM: %+v; want the mechanism, AES and EC keys tried", c)
	}
	for _, k := range []Kind{aes, ec} {
		if err := c.Holds(k); err != nil {
			t.Errorf("SoftHSM cannot hold a %s: %v", k, err)
		}
	}
	if left, err := s.FindObjects(ctx, nil); err != nil || len(left) != 0 {
		t.Errorf("after the probe the token holds %d objects (%v), want none", len(left), err)
	}

	served := openSlot(t, testhsm.Serve(t, "probe-served").Token(), nil)
	if mechs, err = served.Mechanisms(ctx); err != nil {
		t.Fatal(err)
	}
	c, err = ProbeWrap(ctx, served, mechs)
	if err != nil {
		t.Fatal(err)
	}
	if c.Mechanism || len(c.Probed) != 0 {
		t.Errorf("probe through p11-kit: %+v, want no mechanism and nothing tried", c)
	}
	if got := c.Unholdable(); len(got) != 2 || got[0].Class != pkcs11.CKO_PRIVATE_KEY || got[1].Class != pkcs11.CKO_SECRET_KEY {
		t.Errorf("through p11-kit the token cannot hold %v, want private and secret keys", got)
	}
}

// BenchmarkProbeWrap measures what the probe adds to a member's join.
func BenchmarkProbeWrap(b *testing.B) {
	tok := testhsm.Take(b, 1)[0]
	ctx, cancel := context.WithTimeout(b.Context(), time.Minute)
	defer cancel()
	s, err := slot.Open(ctx, slot.Spec{Name: tok.Name, Module: tok.Module, ModuleEnv: tok.ModuleEnv, TokenLabel: tok.Label,
		PIN: secret.PINFromString(tok.UserPIN), CommandTimeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	mechs, err := s.Mechanisms(ctx)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := ProbeWrap(ctx, s, mechs); err != nil {
			b.Fatal(err)
		}
	}
}
