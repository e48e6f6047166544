package sync

import (
	"strings"
	"testing"

	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

func TestList(t *testing.T) {
	ss, toks := openN(t, 1)
	s := ss[0]
	ctx := testContext(t)
	installDomain(t, "1000001", false, ss, toks)
	ec := genEC(t, s, "list-ec", randomID(t))
	ed := genEd25519(t, s, "list-ed", randomID(t))
	aesKey := genAES(t, s, "list-aes", randomID(t))
	d, err := s.CreateObject(ctx, []*pkcs11.Attribute{
		attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, true),
		attr(pkcs11.CKA_VALUE, []byte("x")), attr(pkcs11.CKA_LABEL, "list-data")})
	if err != nil {
		t.Fatal(err)
	}
	want := []pkcs11.ObjectHandle{ec.Pub, ec.Priv, ed.Pub, ed.Priv, aesKey, d}

	objs, err := List(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != len(want) {
		t.Fatalf("List returned %d objects, want %d (everything but the domain key): %+v", len(objs), len(want), objs)
	}
	byHandle := map[pkcs11.ObjectHandle]object.Object{}
	for _, o := range objs {
		if strings.HasPrefix(o.Label, "hagroup-domain:") {
			t.Errorf("List returned the domain key %s", o.Identity)
		}
		byHandle[o.Handle] = o
	}
	for _, h := range want {
		o, ok := byHandle[h]
		if !ok {
			t.Errorf("List lacks handle %d", h)
			continue
		}
		fp := mustFingerprint(t, s, h)
		if !sameBytes(o.Fingerprint, fp) {
			t.Errorf("%s: List fingerprint %x, Fingerprint %x", o.Identity, o.Fingerprint, fp)
		}
		if !o.Token {
			t.Errorf("%s: Token=false, want true", o.Identity)
		}
	}
	if !byHandle[ec.Priv].Private || byHandle[ec.Pub].Label != "list-ec" {
		t.Errorf("EC private key listed as %+v", byHandle[ec.Priv])
	}
	if !sameBytes(byHandle[ec.Priv].Fingerprint, byHandle[ec.Pub].Fingerprint) {
		t.Error("the halves of the EC pair have different fingerprints in the listing")
	}
}
