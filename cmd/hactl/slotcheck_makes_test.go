package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
)

// slot check's word on the group's state is the truth for each make the
// rig has beyond SoftHSM (slot-check.txtar): NSS softokn carries it as
// private generic secret keys, opencryptoki's soft token as private data
// objects, and tpm2-pkcs11 carries none (it gives a new object a live
// one's handle) — said, not tried into corruption.
func TestSlotCheckGroupStateOnEachMake(t *testing.T) {
	slot.OwnEnvironment() // as hactl's main: the TPM's module_env is written while it loads
	for _, c := range []struct {
		make  string
		holds bool
		form  string // or the reason's words
	}{
		{"nss", true, "private generic secret keys"},
		{"opencryptoki", true, "private data objects"},
		{"tpm", false, "tpm2-pkcs11"},
	} {
		t.Run(c.make, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var tok testhsm.Token
			pin := testhsm.UserPIN
			switch c.make {
			case "nss":
				tok = testhsm.NSS(t, "nss-check")
			case "opencryptoki":
				tok, pin = testhsm.ServeOCK(t, "ock-check").Token(), testhsm.OCKUserPIN
			case "tpm":
				tok = testhsm.TPM(t, "tpm-check")
			}
			s, err := slot.Open(ctx, slot.Spec{Name: c.make, Module: tok.Module, ModuleEnv: tok.ModuleEnv, InitArgs: tok.InitArgs,
				TokenLabel: tok.Label, PIN: secret.PINFromString(pin), CommandTimeout: 30 * time.Second})
			if err != nil {
				t.Fatalf("open the %s token: %v", c.make, err)
			}
			defer s.Close()
			got := holdsGroupState(ctx, s)
			if got.Holds != c.holds || !strings.Contains(got.Form+got.Reason, c.form) {
				t.Fatalf("group state on %s: %+v; want holds=%v and %q", c.make, got, c.holds, c.form)
			}
			if c.holds && !got.InPlace {
				t.Errorf("group state on %s: %+v; want its registers rewritten in place (measured)", c.make, got)
			}
			hs, err := s.FindObjects(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range hs {
				attrs, err := s.GetAttributes(ctx, h, []uint{0x03}) // CKA_LABEL
				if err == nil && strings.HasPrefix(string(attrs[0].Value), "hagroup-state:") {
					t.Errorf("slot check left %q on the %s token", attrs[0].Value, c.make)
				}
			}
		})
	}
}
