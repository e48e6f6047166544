package security

// The domain key can wrap and unwrap and nothing else. The attacker holds
// the user PIN and calls the member token directly, bypassing the group:
// every step that would turn the domain key into a decryption key must be
// refused with the token's own CKR code, and a domain key made the old way
// (modifiable) is refused by the engine's audit.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/miekg/pkcs11"
)

var (
	domainKWP = pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP_PAD, nil)
	domainECB = pkcs11.NewMechanism(pkcs11.CKM_AES_ECB, nil)
)

// domainModes are the two ceremonies: by the SO (trusted) and by the user.
var domainModes = []struct {
	name    string
	trusted bool
}{{"trusted", true}, {"untrusted", false}}

// TestDomainKeyRefusesChanges: C_SetAttributeValue on the domain key, for
// every attribute that would widen what it can do, is refused
// (CKR_ACTION_PROHIBITED: the key is not modifiable) and the attribute
// reads back unchanged. On a key made the old way the first of them,
// CKA_DECRYPT=true, succeeds: the attack this closes.
func TestDomainKeyRefusesChanges(t *testing.T) {
	changes := []struct {
		name string
		a    *pkcs11.Attribute
	}{
		{"CKA_DECRYPT", pkcs11.NewAttribute(pkcs11.CKA_DECRYPT, true)},
		{"CKA_ENCRYPT", pkcs11.NewAttribute(pkcs11.CKA_ENCRYPT, true)},
		{"CKA_SIGN", pkcs11.NewAttribute(pkcs11.CKA_SIGN, true)},
		{"CKA_VERIFY", pkcs11.NewAttribute(pkcs11.CKA_VERIFY, true)},
		{"CKA_DERIVE", pkcs11.NewAttribute(pkcs11.CKA_DERIVE, true)},
		{"CKA_MODIFIABLE", pkcs11.NewAttribute(pkcs11.CKA_MODIFIABLE, true)},
		{"CKA_EXTRACTABLE", pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, true)},
		{"CKA_SENSITIVE", pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, false)},
		{"CKA_ALLOWED_MECHANISMS", pkcs11.NewAttribute(pkcs11.CKA_ALLOWED_MECHANISMS, []byte{1, 0x10, 0, 0, 0, 0, 0, 0})},
	}
	for _, mode := range domainModes {
		t.Run(mode.name, func(t *testing.T) {
			toks := domainTokens(t, 1)
			serial := domainSerial()
			domainInstall(t, serial, toks, mode.trusted)
			s := domainOpenUser(t, toks[0], "attacker")
			dk := domainFind(t, s, serial)
			ctx := domainContext(t)
			for _, c := range changes {
				err := s.SetAttributes(ctx, dk, []*pkcs11.Attribute{c.a})
				domainWantCode(t, "C_SetAttributeValue(domain key, "+c.name+")", err, pkcs11.CKR_ACTION_PROHIBITED)
				got, gerr := s.GetAttributes(ctx, dk, []uint{c.a.Type})
				if gerr != nil || len(got) != 1 || got[0].Status != pkcs11.CKR_OK {
					t.Fatalf("read %s back: %v %v", c.name, got, gerr)
				}
				if bytes.Equal(got[0].Value, c.a.Value) {
					t.Errorf("%s reads back as set: %x", c.name, got[0].Value)
				}
			}
		})
	}
	t.Run("old way", func(t *testing.T) {
		toks := domainTokens(t, 1)
		s := domainOpenUser(t, toks[0], "attacker")
		dk := domainCreate(t, s, domainOldTemplate(domainkey.Label(domainSerial()), domainValue(t)))
		err := s.SetAttributes(domainContext(t), dk, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_DECRYPT, true)})
		domainWantCode(t, "C_SetAttributeValue(old domain key, CKA_DECRYPT)", err, pkcs11.CKR_OK)
	})
}

// TestDomainKeyRefusesCopies: C_CopyObject of the domain key into a key
// that can do more, or into a session object, is refused. The user's key
// is not copyable (CKR_ACTION_PROHIBITED). The trusted key stays
// CKA_COPYABLE=true on SoftHSM (its private copy cannot clear it), but it
// is not modifiable, and SoftHSM refuses any attribute in the copy of such
// a key (CKR_ATTRIBUTE_READ_ONLY).
func TestDomainKeyRefusesCopies(t *testing.T) {
	copies := []struct {
		name string
		tmpl []*pkcs11.Attribute
		// trustedCode is SoftHSM's answer for the trusted key when it is
		// not CKR_ATTRIBUTE_READ_ONLY.
		trustedCode uint
	}{
		{"CKA_DECRYPT=true", []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_DECRYPT, true)}, 0},
		{"CKA_DECRYPT=true as a session object", []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false), pkcs11.NewAttribute(pkcs11.CKA_DECRYPT, true)}, 0},
		{"CKA_ENCRYPT=true", []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_ENCRYPT, true)}, 0},
		{"CKA_MODIFIABLE=true", []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_MODIFIABLE, true)}, 0},
		{"CKA_EXTRACTABLE=true", []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, true)}, 0},
		{"a session object", []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false)}, 0},
		// A private object cannot be copied to a public one at all.
		{"a public object", []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, false)}, pkcs11.CKR_TEMPLATE_INCONSISTENT},
	}
	for _, mode := range domainModes {
		t.Run(mode.name, func(t *testing.T) {
			toks := domainTokens(t, 1)
			serial := domainSerial()
			domainInstall(t, serial, toks, mode.trusted)
			s := domainOpenUser(t, toks[0], "attacker")
			dk := domainFind(t, s, serial)
			for _, c := range copies {
				want := uint(pkcs11.CKR_ACTION_PROHIBITED)
				switch {
				case mode.trusted && c.trustedCode != 0:
					want = c.trustedCode
				case mode.trusted:
					want = pkcs11.CKR_ATTRIBUTE_READ_ONLY
				}
				_, err := s.CopyObject(domainContext(t), dk, c.tmpl)
				domainWantCode(t, "C_CopyObject(domain key, "+c.name+")", err, want)
			}
			if n := len(domainFindKey(t, s, pkcs11.CKO_SECRET_KEY, domainkey.Label(serial))); n != 1 {
				t.Errorf("%d keys labelled %q after the copies, want the domain key alone", n, domainkey.Label(serial))
			}
		})
	}
	t.Run("old way", func(t *testing.T) {
		toks := domainTokens(t, 1)
		s := domainOpenUser(t, toks[0], "attacker")
		dk := domainCreate(t, s, domainOldTemplate(domainkey.Label(domainSerial()), domainValue(t)))
		_, err := s.CopyObject(domainContext(t), dk, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false), pkcs11.NewAttribute(pkcs11.CKA_DECRYPT, true)})
		domainWantCode(t, "C_CopyObject(old domain key, CKA_DECRYPT=true)", err, pkcs11.CKR_OK)
	})
}

// TestDomainKeyRefusesCipherUse: the domain key encrypts, decrypts, signs
// and derives nothing: C_EncryptInit/C_DecryptInit answer
// CKR_KEY_FUNCTION_NOT_PERMITTED, as for any key without the usage.
func TestDomainKeyRefusesCipherUse(t *testing.T) {
	for _, mode := range domainModes {
		t.Run(mode.name, func(t *testing.T) {
			toks := domainTokens(t, 1)
			serial := domainSerial()
			domainInstall(t, serial, toks, mode.trusted)
			s := domainOpenUser(t, toks[0], "attacker")
			dk := domainFind(t, s, serial)
			ctx := domainContext(t)
			block := make([]byte, 16)
			for _, m := range []struct {
				name string
				mech *pkcs11.Mechanism
			}{
				{"CKM_AES_ECB", domainECB},
				{"CKM_AES_CBC_PAD", pkcs11.NewMechanism(pkcs11.CKM_AES_CBC_PAD, make([]byte, 16))},
			} {
				_, err := s.Decrypt(ctx, m.mech, dk, block)
				domainWantCode(t, "C_DecryptInit("+m.name+", domain key)", err, pkcs11.CKR_KEY_FUNCTION_NOT_PERMITTED)
				_, err = s.Encrypt(ctx, m.mech, dk, block)
				domainWantCode(t, "C_EncryptInit("+m.name+", domain key)", err, pkcs11.CKR_KEY_FUNCTION_NOT_PERMITTED)
			}
			_, err := s.Sign(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_CMAC, nil), dk, block)
			domainWantCode(t, "C_SignInit(CKM_AES_CMAC, domain key)", err, pkcs11.CKR_KEY_FUNCTION_NOT_PERMITTED)
		})
	}
}

// domainGroupKey makes a key pair through a group of toks (with the domain
// key of serial installed) and returns the handles of its private and
// public halves on the member that is not the primary: a replica, as an
// attacker on that member finds it.
func domainGroupKey(t *testing.T, serial string, toks []testhsm.Token, s *slot.Slot) (priv, pub pkcs11.ObjectHandle) {
	t.Helper()
	g, _ := domainOpenGroup(t, serial, toks)
	label := "victim-" + serial
	if err := domainGenEC(domainContext(t), g, label); err != nil {
		t.Fatalf("generate a key through the group: %v", err)
	}
	privs := domainFindKey(t, s, pkcs11.CKO_PRIVATE_KEY, label)
	pubs := domainFindKey(t, s, pkcs11.CKO_PUBLIC_KEY, label)
	if len(privs) != 1 || len(pubs) != 1 {
		t.Fatalf("the replica holds %d private and %d public keys %q, want 1 each", len(privs), len(pubs), label)
	}
	return privs[0], pubs[0]
}

// domainParsePKCS8 parses a PKCS#8 EC key that SoftHSM padded with zeros
// before wrapping.
func domainParsePKCS8(der []byte) (*ecdsa.PrivateKey, error) {
	var raw asn1.RawValue
	if _, err := asn1.Unmarshal(der, &raw); err != nil {
		return nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(raw.FullBytes)
	if err != nil {
		return nil, err
	}
	ec, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, errors.New("not an EC key")
	}
	return ec, nil
}

// TestDomainExtraction runs the whole attack of issue 14 on a replica of
// a key made through the group: make the domain key decrypt, wrap the key
// under it, decrypt the blob. Against a domain key made the old way the
// attack yields the private key (its public key matches the token's);
// after the ceremony every step that gives decryption is refused, while
// wrapping (what the key is for) still works and the blob cannot be
// unwrapped into a readable key.
func TestDomainExtraction(t *testing.T) {
	for _, mode := range domainModes {
		t.Run(mode.name, func(t *testing.T) {
			toks := domainTokens(t, 2)
			serial := domainSerial()
			domainInstall(t, serial, toks, mode.trusted)
			s := domainOpenUser(t, toks[1], "attacker")
			priv, _ := domainGroupKey(t, serial, toks, s)
			dk := domainFind(t, s, serial)
			ctx := domainContext(t)

			err := s.SetAttributes(ctx, dk, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_DECRYPT, true)})
			domainWantCode(t, "step 1a, C_SetAttributeValue(domain key, CKA_DECRYPT=true)", err, pkcs11.CKR_ACTION_PROHIBITED)
			_, err = s.CopyObject(ctx, dk, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false), pkcs11.NewAttribute(pkcs11.CKA_DECRYPT, true)})
			if err == nil {
				t.Error("step 1b, C_CopyObject(domain key, CKA_DECRYPT=true): CKR_OK")
			}
			blob, err := s.WrapKey(ctx, domainKWP, dk, priv)
			if err != nil {
				t.Fatalf("step 2, C_WrapKey(CKM_AES_KEY_WRAP_PAD, domain key, group key): %v (replication needs it)", err)
			}
			_, err = domainUnwrapWithOracle(blob, func(b []byte) ([]byte, error) { return s.Decrypt(ctx, domainECB, dk, b) })
			domainWantCode(t, "step 3, C_DecryptInit(CKM_AES_ECB, domain key) on the blob", err, pkcs11.CKR_KEY_FUNCTION_NOT_PERMITTED)
			h, err := s.UnwrapKey(ctx, domainKWP, dk, blob, []*pkcs11.Attribute{
				pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY), pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_EC),
				pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false), pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, false), pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, true)})
			domainWantCode(t, "step 3', C_UnwrapKey(domain key, blob, CKA_SENSITIVE=false)", err, pkcs11.CKR_TEMPLATE_INCONSISTENT)
			if err == nil {
				s.DestroyObject(ctx, h)
			}
		})
	}
	t.Run("old way", func(t *testing.T) {
		toks := domainTokens(t, 2)
		serial := domainSerial()
		value := domainValue(t)
		var ss []*slot.Slot
		for _, tok := range toks {
			s := domainOpenUser(t, tok, "attacker")
			domainCreate(t, s, domainOldTemplate(domainkey.Label(serial), value))
			ss = append(ss, s)
		}
		s := ss[1]
		dk := domainFind(t, s, serial)
		ctx := domainContext(t)
		// The old key passes no audit, so the group replicates nothing under
		// it: the victim is made on the member directly, with the
		// attributes the group gave its keys before issue 14.
		_, priv, err := s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
			[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, domainP256), pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
				pkcs11.NewAttribute(pkcs11.CKA_VERIFY, true), pkcs11.NewAttribute(pkcs11.CKA_LABEL, "victim-"+serial)},
			[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true), pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
				pkcs11.NewAttribute(pkcs11.CKA_SIGN, true), pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true),
				pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, true), pkcs11.NewAttribute(pkcs11.CKA_LABEL, "victim-"+serial)})
		if err != nil {
			t.Fatal(err)
		}
		pub := domainFindKey(t, s, pkcs11.CKO_PUBLIC_KEY, "victim-"+serial)[0]
		if err := s.SetAttributes(ctx, dk, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_DECRYPT, true)}); err != nil {
			t.Fatalf("step 1, C_SetAttributeValue(old domain key, CKA_DECRYPT=true): %v", err)
		}
		blob, err := s.WrapKey(ctx, domainKWP, dk, priv)
		if err != nil {
			t.Fatalf("step 2, C_WrapKey: %v", err)
		}
		der, err := domainUnwrapWithOracle(blob, func(b []byte) ([]byte, error) { return s.Decrypt(ctx, domainECB, dk, b) })
		if err != nil {
			t.Fatalf("step 3, decrypt the blob: %v", err)
		}
		k, err := domainParsePKCS8(der)
		if err != nil {
			t.Fatalf("the decrypted blob is no PKCS#8 EC key: %v", err)
		}
		got, err := s.GetAttributes(ctx, pub, []uint{pkcs11.CKA_EC_POINT})
		if err != nil || len(got) != 1 {
			t.Fatalf("read CKA_EC_POINT: %v", err)
		}
		var point []byte
		if _, err := asn1.Unmarshal(got[0].Value, &point); err != nil {
			t.Fatalf("CKA_EC_POINT: %v", err)
		}
		ecdhPub, err := k.PublicKey.ECDH()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(ecdhPub.Bytes(), point) {
			t.Fatal("the key read from the blob is not the victim's")
		}
	})
}

// TestDomainAuditRefusesOldKey: a member whose domain key was made the old
// way (modifiable, copyable, any mechanism) with the very value the others
// hold gets nothing replicated to or from it; the group reports it by
// name in a domain_key_weak event at the first wrap or unwrap, before
// anything is replicated, and once only. An application's login audits
// nothing (its process may never wrap; the agent's login audits at once).
func TestDomainAuditRefusesOldKey(t *testing.T) {
	for _, tc := range []struct {
		name      string
		weakFirst bool // the weak member is the primary
	}{{"replica weak", false}, {"primary weak", true}} {
		t.Run(tc.name, func(t *testing.T) {
			toks := domainTokens(t, 2)
			serial := domainSerial()
			value := domainValue(t)
			sound, weak := toks[0], toks[1]
			if tc.weakFirst {
				toks[0], toks[1] = weak, sound
			}
			ss := domainOpenUser(t, sound, "setup")
			domainCreate(t, ss, domainHardTemplate(domainkey.Label(serial), value))
			ws := domainOpenUser(t, weak, "setup")
			domainCreate(t, ws, domainOldTemplate(domainkey.Label(serial), value))

			g, ev := domainOpenGroup(t, serial, toks)
			if evs := ev.of(group.DomainKeyWeak); len(evs) != 0 {
				t.Fatalf("after an application's login: domain_key_weak events %v, want none yet (audited at the first wrap or unwrap)", evs)
			}
			k1 := "k1-" + serial
			err := domainGenEC(domainContext(t), g, k1)
			if tc.weakFirst {
				if err == nil {
					t.Fatal("a key made on a primary with a weak domain key was replicated")
				}
				domainWantCode(t, "GenerateKeyPair through the group", err, pkcs11.CKR_KEY_FUNCTION_NOT_PERMITTED)
				if !strings.Contains(err.Error(), weak.Name) || !strings.Contains(err.Error(), domainkey.Label(serial)) {
					t.Errorf("the error names neither member %s nor key %q: %v", weak.Name, domainkey.Label(serial), err)
				}
				for _, s := range []*slot.Slot{ss, ws} {
					if n := len(domainFindKey(t, s, pkcs11.CKO_PRIVATE_KEY, k1)); n != 0 {
						t.Errorf("%s: %d private keys k1 left after the refused creation", s.Name(), n)
					}
				}
			} else {
				if err != nil {
					t.Fatalf("GenerateKeyPair through the group: %v", err)
				}
				if n := len(domainFindKey(t, ws, pkcs11.CKO_PRIVATE_KEY, k1)); n != 0 {
					t.Errorf("the member with the weak domain key holds %d private keys k1", n)
				}
				if n := len(domainFindKey(t, ss, pkcs11.CKO_PRIVATE_KEY, k1)); n != 1 {
					t.Errorf("the primary holds %d private keys k1, want 1", n)
				}
			}
			evs := ev.of(group.DomainKeyWeak)
			if len(evs) != 1 {
				t.Fatalf("%d domain_key_weak events, want 1: %v", len(evs), evs)
			}
			var we *domainkey.WeakError
			if evs[0].Member != weak.Name || !errors.As(evs[0].Err, &we) {
				t.Fatalf("domain_key_weak event for member %q (%v), want %s", evs[0].Member, evs[0].Err, weak.Name)
			}
			if we.Label != domainkey.Label(serial) || !slices.Contains(we.Flaws, "CKA_MODIFIABLE=true") {
				t.Errorf("the event names key %q and flaws %q, want %q and CKA_MODIFIABLE=true", we.Label, we.Flaws, domainkey.Label(serial))
			}
			for _, f := range []string{"CKA_MODIFIABLE=true", "CKA_COPYABLE=true", "CKA_ALLOWED_MECHANISMS"} {
				if !strings.Contains(evs[0].Err.Error(), f) {
					t.Errorf("the event does not say %s: %v", f, evs[0].Err)
				}
			}
		})
	}
}

// domainWindow is an Interceptor on the ceremony's slot that, at the
// moment the user copies the SO's public original (the one moment it is
// a public, modifiable object), lets an attacker with the user PIN at it.
type domainWindow struct {
	t      *testing.T
	tok    testhsm.Token
	label  string
	once   sync.Once
	opened bool
}

func (w *domainWindow) Before(ctx context.Context, _ string, op slot.Op) error {
	if op == slot.OpCopyObject {
		w.once.Do(func() { w.attack(ctx) })
	}
	return nil
}

// attack tries every change on the public original, and checks that none
// of them makes it decrypt. It leaves CKA_DECRYPT=true on the original,
// so that the ceremony's private copy inherits it.
func (w *domainWindow) attack(ctx context.Context) {
	t := w.t
	w.opened = true
	// Not domainOpenUser: this runs on the ceremony's call goroutine, where
	// t.Fatal must not be called.
	s, err := slot.Open(ctx, slot.Spec{Name: w.tok.Name + "-window", Module: w.tok.Module, TokenLabel: w.tok.Label,
		PIN: secret.PINFromString(w.tok.UserPIN), CommandTimeout: 20 * time.Second})
	if err != nil {
		t.Errorf("open %s for the attacker: %v", w.tok.Name, err)
		return
	}
	t.Cleanup(func() { s.Close() })
	orig, err := s.FindObjects(ctx, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, w.label), pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, false)})
	if err != nil || len(orig) != 1 {
		t.Errorf("find the SO's public original: %d objects, %v", len(orig), err)
		return
	}
	o := orig[0]
	block := make([]byte, 16)
	// SoftHSM makes this copy (the original is modifiable); it must not
	// decrypt.
	c, err := s.CopyObject(ctx, o, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false), pkcs11.NewAttribute(pkcs11.CKA_DECRYPT, true)})
	if err != nil {
		t.Errorf("C_CopyObject(original, CKA_DECRYPT=true): %v; SoftHSM makes it, and the test needs it", err)
	} else {
		_, err = s.Decrypt(ctx, domainECB, c, block)
		domainWantCode(t, "C_DecryptInit(CKM_AES_ECB, a copy of the original with CKA_DECRYPT=true)", err, pkcs11.CKR_MECHANISM_INVALID)
		s.DestroyObject(ctx, c)
	}
	err = s.SetAttributes(ctx, o, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_ALLOWED_MECHANISMS, []byte{1, 0x10, 0, 0, 0, 0, 0, 0})})
	domainWantCode(t, "C_SetAttributeValue(original, CKA_ALLOWED_MECHANISMS=CKM_AES_ECB)", err, pkcs11.CKR_ATTRIBUTE_READ_ONLY)
	err = s.SetAttributes(ctx, o, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_UNWRAP_TEMPLATE, nil)})
	domainWantCode(t, "C_SetAttributeValue(original, empty CKA_UNWRAP_TEMPLATE)", err, pkcs11.CKR_ATTRIBUTE_READ_ONLY)
	_, err = s.CopyObject(ctx, o, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false), pkcs11.NewAttribute(pkcs11.CKA_ALLOWED_MECHANISMS, []byte{1, 0x10, 0, 0, 0, 0, 0, 0})})
	domainWantCode(t, "C_CopyObject(original, CKA_ALLOWED_MECHANISMS=CKM_AES_ECB)", err, pkcs11.CKR_ATTRIBUTE_READ_ONLY)
	if err := s.SetAttributes(ctx, o, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_DECRYPT, true)}); err != nil {
		t.Errorf("C_SetAttributeValue(original, CKA_DECRYPT=true): %v (the original is modifiable: SoftHSM copies no other)", err)
		return
	}
	_, err = s.Decrypt(ctx, domainECB, o, block)
	domainWantCode(t, "C_DecryptInit(CKM_AES_ECB, original with CKA_DECRYPT=true)", err, pkcs11.CKR_MECHANISM_INVALID)
}

// TestDomainCeremonyWindow: during a trusted ceremony the SO's original is
// a public object that must stay modifiable until the user's copy (SoftHSM
// copies a non-modifiable object with no attribute changed at all). An
// attacker at it in that moment cannot make it, or a copy of it, decrypt
// (CKA_ALLOWED_MECHANISMS is read-only and allows CKM_AES_KEY_WRAP_PAD
// alone), cannot widen its unwrap template, and the usage it did change
// shows in the private copy: the ceremony reads it back, refuses, and
// leaves no domain key.
func TestDomainCeremonyWindow(t *testing.T) {
	tok := domainTokens(t, 1)[0]
	serial := domainSerial()
	w := &domainWindow{t: t, tok: tok, label: domainkey.Label(serial)}
	s, err := slot.Open(domainContext(t), slot.Spec{
		Name: tok.Name + "-ceremony", Module: tok.Module, TokenLabel: tok.Label,
		PIN: secret.PINFromString(tok.UserPIN), CommandTimeout: 20 * time.Second, Interceptor: w,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	err = domainkey.Install(domainContext(t), []domainkey.Target{{
		Slot: s, SOPIN: secret.PINFromString(tok.SOPIN), UserPIN: secret.PINFromString(tok.UserPIN),
	}}, serial)
	if !w.opened {
		t.Fatal("the ceremony made no copy of the SO's original")
	}
	if !errors.Is(err, domainkey.ErrWeak) || !strings.Contains(err.Error(), "CKA_DECRYPT=true") || !strings.Contains(err.Error(), tok.Name) {
		t.Fatalf("ceremony after a change to the original: %v, want domainkey.ErrWeak naming %s and CKA_DECRYPT=true", err, tok.Name)
	}
	if n := len(domainFindKey(t, s, pkcs11.CKO_SECRET_KEY, domainkey.Label(serial))); n != 0 {
		t.Errorf("%d keys %q left after the refused ceremony", n, domainkey.Label(serial))
	}
}
