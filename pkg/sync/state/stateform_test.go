package state

import (
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/miekg/pkcs11"
)

// tpm2-pkcs11 1.9 gives a new object the handle of a live one once an
// object other than the last made was destroyed (the quirk the group
// keys by the TPM's strings: tokenquirk.ReusesLiveHandles). Should a
// version number its objects apart, this fails, and the group may keep
// its state on the TPM again.
func TestTPMReusesLiveHandles(t *testing.T) {
	s := openSlot(t, testhsm.TPM(t, "tpm-handles"), nil)
	ctx := testContext(t)
	if Carries(s) {
		t.Fatalf("token %+v carries group state; want it keyed as reusing live handles", s.Token())
	}
	mk := func(label string) pkcs11.ObjectHandle {
		h, err := s.CreateObject(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, true),
			attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_VALUE, []byte(label))})
		if err != nil {
			t.Fatalf("create %s: %v", label, err)
		}
		return h
	}
	a := mk("first")
	b := mk("second")
	if err := s.DestroyObject(ctx, a); err != nil {
		t.Fatal(err)
	}
	c := mk("third")
	if c != b {
		t.Fatalf("the TPM numbered a new object %d apart from the live %d: it keeps handles apart now", c, b)
	}
	attrs, err := s.GetAttributes(ctx, c, []uint{pkcs11.CKA_LABEL})
	if err != nil || string(attrs[0].Value) != "second" {
		t.Fatalf("handle %d reads %v, %v", c, attrs, err)
	}
	t.Logf("the third object got handle %d, the second's, and reads as the second", c)
}
