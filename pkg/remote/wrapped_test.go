package remote_test

import (
	"errors"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/miekg/pkcs11"
)

// A C_UnwrapKey of no wrapped key or an empty one is answered as SoftHSM
// answers it (CKR_ARGUMENTS_BAD, CKR_WRAPPED_KEY_LEN_RANGE), and the
// server's child serves the next call: it used to crash on it (miekg
// panics on an empty buffer), and a group of served members went down.
func TestUnwrapOfNothing(t *testing.T) {
	srv := testhsm.ServeRemote(t, "unwrap-nothing")
	c, sh := connect(t, srv)
	if err := c.Login(sh, pkcs11.CKU_USER, srv.Token().UserPIN); err != nil {
		t.Fatal(err)
	}
	k, err := c.GenerateKey(sh, []*pkcs11.Mechanism{pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil)}, []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false), pkcs11.NewAttribute(pkcs11.CKA_VALUE_LEN, 32), pkcs11.NewAttribute(pkcs11.CKA_UNWRAP, true)})
	if err != nil {
		t.Fatal(err)
	}
	mech := []*pkcs11.Mechanism{pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP, nil)}
	tmpl := []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY),
		pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES), pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false)}
	for _, c2 := range []struct {
		name string
		blob []byte
		want pkcs11.Error
	}{
		{"no wrapped key", nil, pkcs11.CKR_ARGUMENTS_BAD},
		{"an empty wrapped key", []byte{}, pkcs11.CKR_WRAPPED_KEY_LEN_RANGE},
		{"a one-byte wrapped key", []byte{0}, pkcs11.CKR_WRAPPED_KEY_LEN_RANGE},
	} {
		if _, err := c.UnwrapKey(sh, mech, k, c2.blob, tmpl); !errors.Is(err, c2.want) {
			t.Errorf("UnwrapKey of %s: %v, want %v", c2.name, err, c2.want)
		}
	}
	if _, err := c.GetSessionInfo(sh); err != nil {
		t.Errorf("the session after them: %v", err)
	}
}
