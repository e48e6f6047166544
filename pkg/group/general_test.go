package group

import (
	"testing"

	"github.com/miekg/pkcs11"
)

// TestAmbiguousRefusalFailsNoMember: requests a token refuses with
// CKR_GENERAL_ERROR (unwrapping garbage, ECDH with a point not on the
// curve, CBC_PAD with bad padding) get the token's own answer and fail no
// member, however many members the group has: every member refuses them
// alike, so none served them (issue 16: the group answered
// CKR_DEVICE_ERROR and, with one member, lost the session).
func TestAmbiguousRefusalFailsNoMember(t *testing.T) {
	for _, n := range []int{1, 3} {
		ctx := testContext(t)
		f := setup(t, setupOpts{n: n})
		s := openSession(t, f.g)
		key, err := s.CreateObject(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
			attr(pkcs11.CKA_VALUE, make([]byte, 32)), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_LABEL, "general"),
			attr(pkcs11.CKA_ENCRYPT, true), attr(pkcs11.CKA_DECRYPT, true), attr(pkcs11.CKA_UNWRAP, true)})
		if err != nil {
			t.Fatalf("%d members: CreateObject: %v", n, err)
		}
		_, ecPriv := genEC(t, s, "general-ec", attr(pkcs11.CKA_DERIVE, true))
		secret := []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_GENERIC_SECRET), attr(pkcs11.CKA_VALUE_LEN, 16), attr(pkcs11.CKA_TOKEN, false)}
		garbage := make([]byte, 40)
		for i := range garbage {
			garbage[i] = byte(3 + i)
		}
		for _, c := range []struct {
			name string
			do   func() error
		}{
			{"unwrap garbage", func() error {
				_, err := s.UnwrapKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP, nil), key, garbage, secret)
				return err
			}},
			{"ECDH with a bad point", func() error {
				_, err := s.DeriveKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_ECDH1_DERIVE, pkcs11.NewECDH1DeriveParams(pkcs11.CKD_NULL, nil, []byte{1, 2})), ecPriv, secret)
				return err
			}},
			{"CBC_PAD decrypt with bad padding", func() error {
				if err := s.DecryptInit(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_CBC_PAD, make([]byte, 16)), key); err != nil {
					return err
				}
				_, err := s.Decrypt(ctx, make([]byte, 32))
				return err
			}},
		} {
			if err := c.do(); CodeOf(err) != pkcs11.CKR_GENERAL_ERROR {
				t.Errorf("%d members: %s: %v (%#x), want the token's CKR_GENERAL_ERROR", n, c.name, err, CodeOf(err))
			}
			for _, tok := range f.toks {
				if st := memberState(f.g, tok.Name); !st.Serving() {
					t.Errorf("%d members: after %s, %s is %v", n, c.name, tok.Name, st)
				}
			}
			if err := s.Check(); err != nil {
				t.Errorf("%d members: session after %s: %v", n, c.name, err)
			}
		}
	}
}
