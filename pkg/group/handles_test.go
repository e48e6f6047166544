package group

import (
	"testing"

	"github.com/miekg/pkcs11"
)

// TestBadKeyHandleAsTheToken: a key handle that names nothing is answered
// with the code the member token gives for that argument of that function
// (issue 16: the group answered CKR_KEY_HANDLE_INVALID everywhere).
func TestBadKeyHandleAsTheToken(t *testing.T) {
	ctx := testContext(t)
	f := setup(t, setupOpts{n: 1})
	s := openSession(t, f.g)
	key, err := s.CreateObject(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
		attr(pkcs11.CKA_VALUE, make([]byte, 32)), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_LABEL, "handles"),
		attr(pkcs11.CKA_ENCRYPT, true), attr(pkcs11.CKA_WRAP, true), attr(pkcs11.CKA_UNWRAP, true), attr(pkcs11.CKA_EXTRACTABLE, true)})
	if err != nil {
		t.Fatalf("CreateObject: %v", err)
	}
	d := openDirect(t, f.toks[0])
	hs := findDirect(t, d, "handles")
	if len(hs) != 1 {
		t.Fatalf("member holds %d keys labelled handles, want 1", len(hs))
	}
	phys := hs[0]
	const bad = 0x7ffffff0 // a handle neither the group nor the token gave
	cbc := pkcs11.NewMechanism(pkcs11.CKM_AES_CBC_PAD, make([]byte, 16))
	kw := pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP, nil)
	ecdh := pkcs11.NewMechanism(pkcs11.CKM_ECDH1_DERIVE, pkcs11.NewECDH1DeriveParams(pkcs11.CKD_NULL, nil, make([]byte, 65)))
	secret := []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_GENERIC_SECRET), attr(pkcs11.CKA_VALUE_LEN, 16), attr(pkcs11.CKA_TOKEN, false)}
	for _, c := range []struct {
		name   string
		group  func() error
		member func() error
	}{
		{"EncryptInit key", func() error { return s.EncryptInit(ctx, cbc, bad) },
			func() error { _, err := d.Encrypt(ctx, cbc, bad, make([]byte, 16)); return err }},
		{"Sign key", func() error {
			_, err := f.g.Sign(ctx, pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil), bad, make([]byte, 32))
			return err
		},
			func() error {
				_, err := d.Sign(ctx, pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil), bad, make([]byte, 32))
				return err
			}},
		{"WrapKey wrapping key", func() error { _, err := f.g.WrapKey(ctx, kw, bad, key); return err },
			func() error { _, err := d.WrapKey(ctx, kw, bad, phys); return err }},
		{"WrapKey key", func() error { _, err := f.g.WrapKey(ctx, kw, key, bad); return err },
			func() error { _, err := d.WrapKey(ctx, kw, phys, bad); return err }},
		{"UnwrapKey unwrapping key", func() error { _, err := s.UnwrapKey(ctx, kw, bad, make([]byte, 24), secret); return err },
			func() error { _, err := d.UnwrapKey(ctx, kw, bad, make([]byte, 24), secret); return err }},
		{"DeriveKey base", func() error { _, err := s.DeriveKey(ctx, ecdh, bad, secret); return err },
			func() error { _, err := d.DeriveKey(ctx, ecdh, bad, secret); return err }},
	} {
		want := CodeOf(c.member())
		if want == pkcs11.CKR_OK {
			t.Fatalf("%s: the token accepted handle %#x", c.name, bad)
		}
		if got := CodeOf(c.group()); got != want {
			t.Errorf("%s with a bad handle: group answers %#x, the token %#x", c.name, got, want)
		}
	}
}
