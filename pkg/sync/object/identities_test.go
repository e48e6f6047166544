package object

import (
	"context"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/miekg/pkcs11"
)

// ListIdentities names every object the application may see, by the
// identity the group keys it on (a data object without CKA_ID has a nil
// ID and no key type), and leaves the group's own state out; TokenTemplate
// finds exactly the token object of an identity.
func TestListIdentities(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := testhsm.Take(t, 1)[0].Open(t)
	attr := pkcs11.NewAttribute
	mk := func(tmpl ...*pkcs11.Attribute) pkcs11.ObjectHandle {
		t.Helper()
		h, err := s.CreateObject(ctx, tmpl)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	key := mk(attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES), attr(pkcs11.CKA_TOKEN, true),
		attr(pkcs11.CKA_ID, []byte{1, 2}), attr(pkcs11.CKA_LABEL, "k"), attr(pkcs11.CKA_VALUE, make([]byte, 16)))
	data := mk(attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, false), attr(pkcs11.CKA_LABEL, "d"), attr(pkcs11.CKA_VALUE, []byte("v")))
	mk(attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, false), attr(pkcs11.CKA_LABEL, StateLabelPrefix+"mark"))

	objs, err := ListIdentities(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	want := map[pkcs11.ObjectHandle]Object{
		key:  {Identity: Identity{Class: pkcs11.CKO_SECRET_KEY, KeyType: pkcs11.CKK_AES, ID: []byte{1, 2}, Label: "k"}, Handle: key, Token: true},
		data: {Identity: Identity{Class: pkcs11.CKO_DATA, KeyType: NoKeyType, Label: "d"}, Handle: data},
	}
	if len(objs) != len(want) {
		t.Fatalf("listed %v, want the key and the data object only", objs)
	}
	for _, o := range objs {
		w := want[o.Handle]
		if !o.Identity.Equal(w.Identity) || o.Token != w.Token || (o.ID == nil) != (w.ID == nil) {
			t.Errorf("object %d: %v token %v, want %v token %v", o.Handle, o.Identity, o.Token, w.Identity, w.Token)
		}
	}
	hs, err := s.FindObjects(ctx, TokenTemplate(want[key].Identity))
	if err != nil || len(hs) != 1 || hs[0] != key {
		t.Errorf("TokenTemplate found %v (%v), want [%d]", hs, err, key)
	}
	t.Cleanup(func() { s.DestroyObject(context.Background(), key) })
}
