package domainkey

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

func TestInstallDomainKey(t *testing.T) {
	for _, trusted := range []bool{true, false} {
		name := map[bool]string{true: "trusted", false: "untrusted"}[trusted]
		t.Run(name, func(t *testing.T) {
			ss, toks := openN(t, 2)
			ctx := testContext(t)
			serial := "77" + name
			installDomain(t, serial, trusted, ss, toks)

			var kcvs [][]byte
			for _, s := range ss {
				h, err := Find(ctx, s, serial)
				if err != nil {
					t.Fatalf("%s: %v", s.Name(), err)
				}
				kcv, _ := getAttr(t, s, h, pkcs11.CKA_CHECK_VALUE)
				kcvs = append(kcvs, kcv)
				for typ, want := range map[uint]bool{
					pkcs11.CKA_TRUSTED: trusted, pkcs11.CKA_PRIVATE: true, pkcs11.CKA_TOKEN: true,
					pkcs11.CKA_SENSITIVE: true, pkcs11.CKA_EXTRACTABLE: false,
					pkcs11.CKA_WRAP: true, pkcs11.CKA_UNWRAP: true, pkcs11.CKA_DECRYPT: false, pkcs11.CKA_ENCRYPT: false,
					pkcs11.CKA_SIGN: false, pkcs11.CKA_VERIFY: false, pkcs11.CKA_DERIVE: false, pkcs11.CKA_MODIFIABLE: false,
					// SoftHSM cannot clear CKA_COPYABLE on the trusted key's
					// private copy; the audit then proves no copy can change it.
					pkcs11.CKA_COPYABLE: trusted,
				} {
					v, ok := getAttr(t, s, h, typ)
					if !ok || (v[0] != 0) != want {
						t.Errorf("%s: domain key attribute 0x%x = %x, want %v", s.Name(), typ, v, want)
					}
				}
				if mechs, ok := getAttr(t, s, h, pkcs11.CKA_ALLOWED_MECHANISMS); !ok || !sameMechanisms(mechs, []uint{pkcs11.CKM_AES_KEY_WRAP_PAD}) {
					t.Errorf("%s: CKA_ALLOWED_MECHANISMS %x, want CKM_AES_KEY_WRAP_PAD alone", s.Name(), mechs)
				}
				if d, err := Audit(ctx, s, serial); err != nil || !d.Found || len(d.Flaws) > 0 || d.Trusted != trusted {
					t.Errorf("%s: audit %+v, %v; want a sound key found", s.Name(), d, err)
				}
				if n := len(findByLabel(t, s, Label(serial))); n != 1 {
					t.Errorf("%s: %d objects labelled %q, want the private key only", s.Name(), n, Label(serial))
				}
			}
			if len(kcvs[0]) != 3 || !bytes.Equal(kcvs[0], kcvs[1]) {
				t.Fatalf("check values differ: %x vs %x", kcvs[0], kcvs[1])
			}

			// Installing again changes nothing.
			installDomain(t, serial, trusted, ss, toks)
			for _, s := range ss {
				if n := len(findByLabel(t, s, Label(serial))); n != 1 {
					t.Errorf("%s: after a second install %d domain keys, want 1", s.Name(), n)
				}
			}

			s := ss[0]
			dk, err := Find(ctx, s, serial)
			if err != nil {
				t.Fatal(err)
			}
			// The user cannot turn a blob into a readable key.
			plain, err := s.CreateObject(ctx, []*pkcs11.Attribute{
				attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
				attr(pkcs11.CKA_VALUE, bytes.Repeat([]byte{7}, 32)), attr(pkcs11.CKA_TOKEN, false),
				attr(pkcs11.CKA_SENSITIVE, false), attr(pkcs11.CKA_EXTRACTABLE, true)})
			if err != nil {
				t.Fatal(err)
			}
			blob, err := s.WrapKey(ctx, kwp, dk, plain)
			if err != nil {
				t.Fatalf("wrap a key under the domain key: %v", err)
			}
			base := []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY),
				attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES), attr(pkcs11.CKA_TOKEN, false), attr(pkcs11.CKA_EXTRACTABLE, true)}
			for _, tc := range []struct {
				name string
				tmpl []*pkcs11.Attribute
			}{
				{"sensitive=false", append(base, attr(pkcs11.CKA_SENSITIVE, false), attr(pkcs11.CKA_WRAP_WITH_TRUSTED, trusted))},
				{"sensitive unset", append(base, attr(pkcs11.CKA_WRAP_WITH_TRUSTED, trusted))},
			} {
				if h, err := s.UnwrapKey(ctx, kwp, dk, blob, tc.tmpl); err == nil {
					if v, ok := getAttr(t, s, h, pkcs11.CKA_VALUE); ok {
						t.Fatalf("unwrapped with %s and read the key value %x", tc.name, v)
					}
				}
			}
			forced := append(base, attr(pkcs11.CKA_SENSITIVE, true))
			if trusted {
				forced = append(forced, attr(pkcs11.CKA_WRAP_WITH_TRUSTED, true))
			}
			h, err := s.UnwrapKey(ctx, kwp, dk, blob, forced)
			if err != nil {
				t.Fatalf("unwrap as the domain key's unwrap template says: %v", err)
			}
			if v, ok := getAttr(t, s, h, pkcs11.CKA_VALUE); ok {
				t.Fatalf("read the value %x of a key unwrapped under the domain key", v)
			}
			tmpl, err := s.GetNestedAttribute(ctx, dk, pkcs11.CKA_UNWRAP_TEMPLATE)
			if err != nil {
				t.Fatalf("read the domain key's unwrap template: %v", err)
			}
			want := map[uint]bool{pkcs11.CKA_SENSITIVE: true}
			if trusted {
				want[pkcs11.CKA_WRAP_WITH_TRUSTED] = true
			}
			if len(tmpl) != len(want) {
				t.Errorf("unwrap template has %d attributes, want %d", len(tmpl), len(want))
			}
			for _, a := range tmpl {
				if !want[a.Type] || len(a.Value) != 1 || a.Value[0] != 1 {
					t.Errorf("unwrap template attribute 0x%x = %x", a.Type, a.Value)
				}
			}

			// A key with CKA_WRAP_WITH_TRUSTED can be wrapped by a trusted
			// domain key only.
			wwt := genAES(t, s, "wwt-"+name, randomID(t), attr(pkcs11.CKA_WRAP_WITH_TRUSTED, true))
			_, err = s.WrapKey(ctx, kwp, dk, wwt)
			if trusted && err != nil {
				t.Errorf("trusted domain key cannot wrap a CKA_WRAP_WITH_TRUSTED key: %v", err)
			}
			if !trusted && err == nil {
				t.Error("an untrusted domain key wrapped a CKA_WRAP_WITH_TRUSTED key")
			}
		})
	}
}

func TestInstallDomainKeyRefuses(t *testing.T) {
	ss, toks := openN(t, 3)
	a, b, c := ss[0], ss[1], ss[2]
	ctx := testContext(t)
	const serial = "4242"
	installDomain(t, serial, false, []*slot.Slot{a}, toks[:1])
	installDomain(t, serial, false, []*slot.Slot{b}, toks[1:2])

	err := Install(ctx, []Target{{Slot: a}, {Slot: b}}, serial)
	if !errors.Is(err, object.ErrConflict) || !strings.Contains(err.Error(), b.Name()) {
		t.Errorf("install over two different domain keys: %v, want ErrConflict naming %s", err, b.Name())
	}
	err = Install(ctx, []Target{{Slot: a}, {Slot: c}}, serial)
	if !errors.Is(err, ErrPartial) || !strings.Contains(err.Error(), c.Name()) {
		t.Errorf("install where one member lacks the key: %v, want ErrPartial naming %s", err, c.Name())
	}
	if _, err := Find(ctx, c, serial); !errors.Is(err, ErrNotFound) {
		t.Errorf("after a refused install %s: %v, want ErrNotFound", c.Name(), err)
	}
}

func TestInstallDomainKeyFailureRollsBack(t *testing.T) {
	ss, toks := openN(t, 2)
	a, b := ss[0], ss[1]
	ctx := testContext(t)
	const serial = "5151"
	err := Install(ctx, []Target{
		{Slot: a, SOPIN: secret.PINFromString(toks[0].SOPIN), UserPIN: secret.PINFromString(toks[0].UserPIN)},
		{Slot: b, SOPIN: secret.PINFromString("wrong-so-pin"), UserPIN: secret.PINFromString(toks[1].UserPIN)},
	}, serial)
	if err == nil || !strings.Contains(err.Error(), b.Name()) {
		t.Fatalf("install with a wrong SO PIN on %s: %v, want an error naming it", b.Name(), err)
	}
	if strings.Contains(err.Error(), "wrong-so-pin") || strings.Contains(err.Error(), toks[0].SOPIN) {
		t.Fatalf("error reveals a PIN: %v", err)
	}
	for _, s := range ss {
		if n := len(findByLabel(t, s, Label(serial))); n != 0 {
			t.Errorf("%s: %d domain key objects left after a failed install", s.Name(), n)
		}
		// The user is logged in again: a private object can be made and found.
		genAES(t, s, "after-failed-install", randomID(t))
		if n := len(findByLabel(t, s, "after-failed-install")); n != 1 {
			t.Errorf("%s: user session unusable after the failed install", s.Name())
		}
	}
	// A retry with the right PINs works.
	installDomain(t, serial, true, ss, toks)
}

// TestReplaceDomainKey: a weak domain key (made the old way: modifiable,
// any mechanism) fails the audit and Install keeps it refused;
// Replace puts a new, sound value on every member and leaves one
// key per member.
func TestReplaceDomainKey(t *testing.T) {
	ss, _ := openN(t, 2)
	ctx := testContext(t)
	serial := "88replace"
	value := bytes.Repeat([]byte{9}, 32)
	for _, s := range ss {
		old := []*pkcs11.Attribute{
			attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
			attr(pkcs11.CKA_VALUE, value), attr(pkcs11.CKA_LABEL, Label(serial)),
			attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SENSITIVE, true),
			attr(pkcs11.CKA_EXTRACTABLE, false), attr(pkcs11.CKA_WRAP, true), attr(pkcs11.CKA_UNWRAP, true),
			attr(pkcs11.CKA_DECRYPT, false), attr(pkcs11.CKA_ENCRYPT, false),
		}
		if _, err := s.CreateObject(ctx, old); err != nil {
			t.Fatal(err)
		}
		d, err := Audit(ctx, s, serial)
		if err != nil || !d.Weak() || !slices.Contains(d.Flaws, "CKA_MODIFIABLE=true") {
			t.Fatalf("%s: audit of the old key %+v, %v; want weak with CKA_MODIFIABLE=true", s.Name(), d, err)
		}
	}
	targets := []Target{{Slot: ss[0]}, {Slot: ss[1]}}
	err := Install(ctx, targets, serial)
	var we *WeakError
	if !errors.As(err, &we) || we.Member != ss[0].Name() {
		t.Fatalf("install over a weak key: %v, want a *WeakError naming %s", err, ss[0].Name())
	}
	if err := Replace(ctx, targets, serial); err != nil {
		t.Fatalf("replace: %v", err)
	}
	oldKCV, _ := aesKCV(value)
	var kcvs [][]byte
	for _, s := range ss {
		d, err := Audit(ctx, s, serial)
		if err != nil || !d.Found || len(d.Flaws) > 0 {
			t.Fatalf("%s: audit after replace %+v, %v", s.Name(), d, err)
		}
		if bytes.Equal(d.CheckValue, oldKCV) {
			t.Errorf("%s: the old value is still the domain key", s.Name())
		}
		if n := len(findByLabel(t, s, Label(serial))); n != 1 {
			t.Errorf("%s: %d objects labelled %q after replace, want 1", s.Name(), n, Label(serial))
		}
		kcvs = append(kcvs, d.CheckValue)
	}
	if !bytes.Equal(kcvs[0], kcvs[1]) {
		t.Errorf("check values differ after replace: %x, %x", kcvs[0], kcvs[1])
	}
}

// TestReplaceDomainKeyFailure: a replacement that fails on one member (a
// wrong SO PIN there) leaves no domain key on any member, says so and names
// the member; a retry installs one everywhere.
func TestReplaceDomainKeyFailure(t *testing.T) {
	ss, toks := openN(t, 2)
	ctx := testContext(t)
	const serial = "88replacefail"
	installDomain(t, serial, false, ss, toks)
	err := Replace(ctx, []Target{
		{Slot: ss[0], SOPIN: secret.PINFromString(toks[0].SOPIN), UserPIN: secret.PINFromString(toks[0].UserPIN)},
		{Slot: ss[1], SOPIN: secret.PINFromString("wrong-so-pin"), UserPIN: secret.PINFromString(toks[1].UserPIN)},
	}, serial)
	if err == nil || !strings.Contains(err.Error(), ss[1].Name()) || !strings.Contains(err.Error(), "not installed on any") {
		t.Fatalf("replace with a wrong SO PIN on %s: %v, want an error naming it and saying no key is left", ss[1].Name(), err)
	}
	if strings.Contains(err.Error(), "wrong-so-pin") || strings.Contains(err.Error(), toks[0].SOPIN) {
		t.Fatalf("error reveals a PIN: %v", err)
	}
	for _, s := range ss {
		if n := len(findByLabel(t, s, Label(serial))); n != 0 {
			t.Errorf("%s: %d domain key objects left after the failed replacement", s.Name(), n)
		}
	}
	installDomain(t, serial, true, ss, toks)
}
