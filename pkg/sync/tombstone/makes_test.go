package tombstone

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/state"
	"github.com/miekg/pkcs11"
)

// makeToken opens, logged in, a token of the named make.
func makeToken(t *testing.T, make string) *slot.Slot {
	t.Helper()
	var tok testhsm.Token
	pin := testhsm.UserPIN
	switch make {
	case "softhsm":
		tok = testhsm.Take(t, 1)[0]
	case "nss":
		tok = testhsm.NSS(t, "nss-state")
	case "opencryptoki":
		tok, pin = testhsm.ServeOCK(t, "ock-state").Token(), testhsm.OCKUserPIN
	case "tpm":
		tok = testhsm.TPM(t, "tpm-state")
	}
	s, err := slot.Open(context.Background(), slot.Spec{Name: make, Module: tok.Module, ModuleEnv: tok.ModuleEnv, InitArgs: tok.InitArgs,
		TokenLabel: tok.Label, PIN: secret.PINFromString(pin), CommandTimeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("open the %s token: %v", make, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// The group's state — tombstone registers and chunks, behind marks — is
// carried on every make of token the rig has that can keep objects apart
// by handle, in the form that make takes (NSS softokn takes no data token
// object: private generic secret keys there; tpm2-pkcs11 carries none),
// and none of it can be read, changed or forged from the
// token's public session: every state object is private, so an attacker
// without the PIN finds none, and an object it plants (public, as it
// must be) is not read as state.
func TestStateOnEveryMake(t *testing.T) {
	for _, make := range []string{"softhsm", "nss", "opencryptoki", "tpm"} {
		t.Run(make, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			s := makeToken(t, make)
			inPlace, err := state.Probe(ctx, s)
			if make == "tpm" {
				// It carries none (tokenquirk.ReusesLiveHandles), and says so.
				if !errors.Is(err, state.ErrNotCarried) || state.Carries(s) {
					t.Fatalf("Probe on the TPM: %v; want ErrNotCarried", err)
				}
				if _, err := state.WriteMark(ctx, s, "900", "m-away", "writer-1"); !errors.Is(err, state.ErrNotCarried) {
					t.Fatalf("WriteMark on the TPM: %v; want ErrNotCarried", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Probe: %v", err)
			}
			t.Logf("%s: group state as %s, registers in place: %v", make, state.FormName(s), inPlace)
			const serial = "900"
			const n = DefaultChunkRecords + 5 // a chunk and a register
			w := shared(t, serial, []*slot.Slot{s})
			var all []Tombstone
			for i := range n {
				tb := tomb(fmt.Sprintf("%s-%d", make, i), []byte{byte(i), 7})
				tb.GroupSerial = serial
				if err := w.Record(ctx, tb); err != nil {
					t.Fatalf("record tombstone %d: %v", i, err)
				}
				all = append(all, tb)
			}
			if _, err := state.WriteMark(ctx, s, serial, "m-away", "writer-1"); err != nil {
				t.Fatalf("WriteMark: %v", err)
			}
			readBack := func(when string) {
				t.Helper()
				set, err := shared(t, serial, []*slot.Slot{s}).Snapshot(ctx)
				if err != nil {
					t.Fatalf("%s: read the tombstones: %v", when, err)
				}
				if set.Len() != n {
					t.Fatalf("%s: another process reads %d tombstones, want %d", when, set.Len(), n)
				}
				for _, tb := range all {
					if !set.Contains(tb.Identity, tb.Fingerprint) {
						t.Fatalf("%s: tombstone %s lost", when, tb.Identity.Label)
					}
				}
				marks, err := state.ReadMarks(ctx, s, serial)
				if err != nil || len(marks) != 1 || marks[0].Member != "m-away" || marks[0].Writer != "writer-1" {
					t.Fatalf("%s: ReadMarks = %+v, %v; want the one mark of m-away by writer-1", when, marks, err)
				}
			}
			readBack("written")

			// The attacker: the token's public session.
			if err := s.Logout(ctx); err != nil {
				t.Fatal(err)
			}
			attack(t, ctx, s, serial)
			if err := s.Login(ctx, pkcs11.CKU_USER, secret.PINFromString(pinOf(make))); err != nil {
				t.Fatal(err)
			}
			readBack("after the public session's attack")

			marks, _ := state.ReadMarks(ctx, s, serial)
			if err := state.ClearMark(ctx, serial, marks[0]); err != nil {
				t.Fatalf("ClearMark: %v", err)
			}
			if marks, err := state.ReadMarks(ctx, s, serial); err != nil || len(marks) != 0 {
				t.Fatalf("ReadMarks after ClearMark = %+v, %v; want none", marks, err)
			}
		})
	}
}

func pinOf(make string) string {
	if make == "opencryptoki" {
		return testhsm.OCKUserPIN
	}
	return testhsm.UserPIN
}

// attack is what a caller of the token without its PIN tries: find the
// group's state objects (to read, change or destroy them), and plant
// forged ones in every form, naming a victim.
func attack(t *testing.T, ctx context.Context, s *slot.Slot, serial string) {
	t.Helper()
	hs, err := s.FindObjects(ctx, nil)
	if err != nil {
		t.Fatalf("public session: find every object: %v", err)
	}
	for _, h := range hs {
		attrs, err := s.GetAttributes(ctx, h, []uint{pkcs11.CKA_LABEL})
		if err == nil && len(attrs) == 1 && strings.HasPrefix(string(attrs[0].Value), "hagroup-state:") {
			t.Fatalf("the public session finds group state object %d (%q)", h, attrs[0].Value)
		}
	}
	forged := tomb("victim", []byte{1})
	forged.GroupSerial = serial
	records := encodeRecords([]Tombstone{forged})
	label := state.Label(serial, StateKind)
	mark := state.MarkLabel(serial, "m-victim")
	planted := 0
	for _, tmpl := range [][]*pkcs11.Attribute{
		{pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
			pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, false), pkcs11.NewAttribute(pkcs11.CKA_LABEL, label),
			pkcs11.NewAttribute(pkcs11.CKA_APPLICATION, Application), pkcs11.NewAttribute(pkcs11.CKA_VALUE, records)},
		{pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
			pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, false), pkcs11.NewAttribute(pkcs11.CKA_LABEL, mark),
			pkcs11.NewAttribute(pkcs11.CKA_APPLICATION, state.MarkApplication), pkcs11.NewAttribute(pkcs11.CKA_VALUE, []byte("forger"))},
		keyForm(label, Application, records),
		keyForm(mark, state.MarkApplication, []byte("forger")),
	} {
		if _, err := s.CreateObject(ctx, tmpl); err == nil {
			planted++
		}
	}
	t.Logf("the public session planted %d forged state objects", planted)
}

// keyForm is a public generic secret key laid out as a key-form state
// object (CKA_ID: application, NUL, an 8-byte tag, value).
func keyForm(label, app string, value []byte) []*pkcs11.Attribute {
	id := append(append([]byte(app), 0), bytes.Repeat([]byte{'t'}, 8)...)
	return []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_GENERIC_SECRET),
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true), pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, false),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, label), pkcs11.NewAttribute(pkcs11.CKA_ID, append(id, value...)),
		pkcs11.NewAttribute(pkcs11.CKA_VALUE, bytes.Repeat([]byte{1}, 32)),
	}
}
