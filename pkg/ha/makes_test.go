package ha

import (
	"crypto/rand"
	"crypto/rsa"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// otherMake is a token of the named make beside the rig's SoftHSM tokens,
// as a member (its own PIN file where its PIN differs from the group's).
func otherMake(t *testing.T, make string) (testhsm.Token, config.Member) {
	t.Helper()
	var tok testhsm.Token
	switch make {
	case "nss":
		tok = testhsm.NSS(t, "nss-member")
	case "opencryptoki":
		tok = testhsm.ServeOCK(t, "ock-member").Token()
		tok.UserPIN = testhsm.OCKUserPIN
	case "tpm":
		tok = testhsm.TPM(t, "tpm-member")
	}
	mc := config.Member{Name: make, Module: tok.Module, ModuleEnv: tok.ModuleEnv, InitArgs: tok.InitArgs, TokenLabel: tok.Label}
	if tok.UserPIN != testhsm.UserPIN {
		mc.PINFile = filepath.Join(t.TempDir(), "pin")
		if err := os.WriteFile(mc.PINFile, []byte(tok.UserPIN+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tok.Name = make
	return tok, mc
}

// A destroy through a group of SoftHSM and another make is never undone
// by a catch-up, whichever member was away, on every make that carries
// the group's state; on the TPM, which carries none, while the TPM is the
// member away (with the TPM serving alone the destroy is refused: no
// member could carry the news). Host B is a fresh host (empty state
// directory): what it knows of the destroy it reads on the members — the
// tombstones and the behind mark left where host A's destroy ran.
func TestDestroyThroughAGroupOfTwoMakesStaysGone(t *testing.T) {
	for _, c := range []struct {
		make string
		away []string // the member away during the destroy: "softhsm", or the other make
	}{
		{"nss", []string{"nss", "softhsm"}},
		{"opencryptoki", []string{"opencryptoki", "softhsm"}},
		{"tpm", []string{"tpm"}},
	} {
		t.Run(c.make, func(t *testing.T) {
			soft := testhsm.Take(t, 1)[0]
			soft.Name = "softhsm"
			other, om := otherMake(t, c.make)
			for i, away := range c.away {
				serial := fmt.Sprintf("%d", 4900000+serials.Add(1))
				h := &hosts{t: t, set: config.Defaults(), toks: []testhsm.Token{soft, other},
					cfg: config.Group{Label: "ha-" + serial, Serial: serial, Members: []config.Member{
						{Name: soft.Name, Module: soft.Module, TokenLabel: soft.Label}, om}}}
				h.set.CommandTimeout = 30 * time.Second
				h.set.Interval = time.Second
				h.set.Retries = 0
				ctx := testCtx(t)
				label := fmt.Sprintf("doomed-%d", i)
				// Provisioned on both out of band, as keys are on makes
				// between which replication carries none.
				for _, l := range []string{label, fmt.Sprintf("kept-%d", i)} {
					tmpl := rsaPublic(t, l)
					for _, tok := range h.toks {
						if _, err := directAs(t, tok).CreateObject(ctx, tmpl); err != nil {
							t.Fatalf("an RSA public key on %s: %v", tok.Name, err)
						}
					}
				}
				hostA := h.open(nil)
				sa := openSession(t, hostA)
				found, err := sa.Find(ctx, []*pkcs11.Attribute{a(pkcs11.CKA_LABEL, label)})
				if err != nil || len(found) != 1 {
					t.Fatalf("host A finds %v, %v; want the one key", found, err)
				}
				o := found[0]
				if c.make == "tpm" {
					// With the SoftHSM member away, the TPM alone serves:
					// it carries no state, so no mark could tell another
					// host, and the destroy waits for a member that can.
					if err := hostA.Engine().FailMember(soft.Name, fmt.Errorf("test: away")); err != nil {
						t.Fatal(err)
					}
					err := sa.DestroyObject(ctx, o)
					if group.CodeOf(err) != pkcs11.CKR_DEVICE_ERROR {
						t.Fatalf("destroy with only the TPM serving: %v, want CKR_DEVICE_ERROR (no member to carry the state)", err)
					}
					for _, tok := range h.toks {
						if got := findLabelled(t, directAs(t, tok), label); len(got) != 1 {
							t.Fatalf("%s holds %v after the refused destroy, want the key", tok.Name, got)
						}
					}
					if err := hostA.Engine().ActivateMember(ctx, soft.Name); err != nil {
						t.Fatal(err)
					}
				}
				if err := hostA.Engine().FailMember(away, fmt.Errorf("test: away")); err != nil {
					t.Fatal(err)
				}
				if err := sa.DestroyObject(ctx, o); err != nil {
					t.Fatalf("destroy with %s away: %v", away, err)
				}
				hostB := h.open(nil) // its login catches the marked member up
				if m, _ := hostB.Engine().Member(away); m.State() != member.Active {
					t.Fatalf("%s is %v after host B's login, want caught up and active", away, m.State())
				}
				for _, tok := range h.toks {
					if got := findLabelled(t, directAs(t, tok), label); len(got) != 0 {
						t.Errorf("%s holds %v after host B caught %s up: the destroy was undone", tok.Name, got, away)
					}
					if got := findLabelled(t, directAs(t, tok), fmt.Sprintf("kept-%d", i)); len(got) != 1 {
						t.Errorf("%s holds %v of the kept key, want it", tok.Name, got)
					}
				}
			}
		})
	}
}

// directAs opens tok as direct does, with its init arguments.
func directAs(t testing.TB, tok testhsm.Token) *slot.Slot {
	t.Helper()
	s, err := slot.Open(testCtx(t), slot.Spec{
		Name: tok.Name + "-direct", Module: tok.Module, ModuleEnv: tok.ModuleEnv, InitArgs: tok.InitArgs, TokenLabel: tok.Label,
		PIN: secret.PINFromString(tok.UserPIN), CommandTimeout: 30 * time.Second,
	})
	if err != nil {
		t.Fatalf("open %s directly: %v", tok.Name, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// rsaPublic is a fresh RSA public key labelled label: an object every
// make takes (the TPM imports RSA public keys and data objects alone).
func rsaPublic(t *testing.T, label string) []*pkcs11.Attribute {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return []*pkcs11.Attribute{
		a(pkcs11.CKA_CLASS, pkcs11.CKO_PUBLIC_KEY), a(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_RSA), a(pkcs11.CKA_TOKEN, true),
		a(pkcs11.CKA_LABEL, label), a(pkcs11.CKA_ID, []byte(label)), a(pkcs11.CKA_VERIFY, true),
		a(pkcs11.CKA_MODULUS, k.N.Bytes()), a(pkcs11.CKA_PUBLIC_EXPONENT, big.NewInt(int64(k.E)).Bytes()),
	}
}
