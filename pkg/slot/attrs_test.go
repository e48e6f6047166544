package slot_test

import (
	"bytes"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/miekg/pkcs11"
)

// TestGetAttributesAnswersAsTheToken: attribute reads answer what the
// token holds — values that fit one call, a value longer than the room
// one call gives (read the long way), an empty value, and a sensitive
// attribute's own status alone and among readable ones (pkg/slot reads
// them in one module call where they fit, and the long way otherwise).
func TestGetAttributesAnswersAsTheToken(t *testing.T) {
	tok := testhsm.Take(t, 1)[0]
	s := open(t, specOf(tok))
	ctx := ctxT(t)
	long := bytes.Repeat([]byte("0123456789abcdef"), 200) // 3,200 bytes
	data, err := s.CreateObject(ctx, []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, "long"), pkcs11.NewAttribute(pkcs11.CKA_VALUE, long),
		pkcs11.NewAttribute(pkcs11.CKA_APPLICATION, ""),
	})
	if err != nil {
		t.Fatal(err)
	}
	secret, err := s.CreateObject(ctx, []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false), pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, "key"), pkcs11.NewAttribute(pkcs11.CKA_VALUE, make([]byte, 32)),
	})
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.GetAttributes(ctx, data, []uint{pkcs11.CKA_LABEL, pkcs11.CKA_VALUE, pkcs11.CKA_APPLICATION})
	if err != nil {
		t.Fatal(err)
	}
	if string(a[0].Value) != "long" || !bytes.Equal(a[1].Value, long) || a[2].Value == nil || len(a[2].Value) != 0 {
		t.Errorf("data object read as label %q, %d value bytes, application %#v; want long, %d, empty", a[0].Value, len(a[1].Value), a[2].Value, len(long))
	}
	for _, x := range a {
		if x.Status != pkcs11.CKR_OK {
			t.Errorf("attribute %#x: status %#x", x.Type, x.Status)
		}
	}
	a, err = s.GetAttributes(ctx, secret, []uint{pkcs11.CKA_VALUE})
	if err != nil || a[0].Status != pkcs11.CKR_ATTRIBUTE_SENSITIVE || a[0].Value != nil {
		t.Errorf("a sensitive key's CKA_VALUE alone: %v, %+v; want CKR_ATTRIBUTE_SENSITIVE", err, a)
	}
	a, err = s.GetAttributes(ctx, secret, []uint{pkcs11.CKA_LABEL, pkcs11.CKA_VALUE, pkcs11.CKA_SENSITIVE})
	if err != nil || string(a[0].Value) != "key" || a[1].Status != pkcs11.CKR_ATTRIBUTE_SENSITIVE || a[2].Status != pkcs11.CKR_OK || !bytes.Equal(a[2].Value, []byte{1}) {
		t.Errorf("a sensitive key's label, CKA_VALUE and CKA_SENSITIVE: %v, %+v", err, a)
	}
}
