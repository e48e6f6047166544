package sync

import (
	"bytes"
	"testing"

	"github.com/miekg/pkcs11"
)

// TestExtractableKeyTravelsAsMade: under a trusted domain key, a key made
// extractable without CKA_WRAP_WITH_TRUSTED is copied without it (the
// domain key's unwrap template would force it), so an application key can
// wrap the copy on its member as on the source, giving the same blob;
// the copy stays sensitive; no transit key is left on either member; and
// the copy is replicated onwards. A key with CKA_WRAP_WITH_TRUSTED keeps
// it and still refuses an application's wrapping key on the copy.
func TestExtractableKeyTravelsAsMade(t *testing.T) {
	ss, toks := openN(t, 3)
	installDomain(t, testSerial, true, ss, toks)
	src, dst, third := ss[0], ss[1], ss[2]
	ctx := testContext(t)
	open := genAES(t, src, "open", randomID(t))
	guarded := genAES(t, src, "guarded", randomID(t), attr(pkcs11.CKA_WRAP_WITH_TRUSTED, true))
	kwpApp := pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP_PAD, nil)
	value := bytes.Repeat([]byte{0x5a}, 32)
	kek := func(label string) []*pkcs11.Attribute {
		return []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
			attr(pkcs11.CKA_TOKEN, false), attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_WRAP, true), attr(pkcs11.CKA_VALUE, value)}
	}
	srcKEK, err := src.CreateObject(ctx, kek("app-kek"))
	if err != nil {
		t.Fatal(err)
	}
	dstKEK, err := dst.CreateObject(ctx, kek("app-kek"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := src.WrapKey(ctx, kwpApp, srcKEK, open)
	if err != nil {
		t.Fatalf("wrap the source under the application's key: %v", err)
	}

	cp := replicate(t, src, open, Target{Slot: dst})
	sameObject(t, src, open, dst, cp, keyAttrs...)
	for _, typ := range []uint{pkcs11.CKA_WRAP_WITH_TRUSTED, pkcs11.CKA_SENSITIVE, pkcs11.CKA_EXTRACTABLE} {
		sv, _ := getAttr(t, src, open, typ)
		dv, _ := getAttr(t, dst, cp, typ)
		if !bytes.Equal(sv, dv) {
			t.Errorf("attribute 0x%x: source %x, copy %x", typ, sv, dv)
		}
	}
	if v, ok := getAttr(t, dst, cp, pkcs11.CKA_VALUE); ok {
		t.Errorf("the copy's value is readable: %x", v)
	}
	if got, err := dst.WrapKey(ctx, kwpApp, dstKEK, cp); err != nil || !bytes.Equal(got, want) {
		t.Errorf("wrap the copy under the application's key: %x, %v; want the source's blob %x", got, err, want)
	}
	onwards := replicate(t, dst, cp, Target{Slot: third})
	if v, _ := getAttr(t, third, onwards, pkcs11.CKA_WRAP_WITH_TRUSTED); len(v) != 1 || v[0] != 0 {
		t.Errorf("the copy of the copy: CKA_WRAP_WITH_TRUSTED %x, want false", v)
	}

	gcp := replicate(t, src, guarded, Target{Slot: dst})
	if v, _ := getAttr(t, dst, gcp, pkcs11.CKA_WRAP_WITH_TRUSTED); len(v) != 1 || v[0] == 0 {
		t.Errorf("the guarded key's copy: CKA_WRAP_WITH_TRUSTED %x, want true", v)
	}
	if b, err := dst.WrapKey(ctx, kwpApp, dstKEK, gcp); err == nil {
		t.Errorf("the guarded key's copy was wrapped under the application's key (%d bytes)", len(b))
	}
	for _, s := range ss {
		if hs := findByLabel(t, s, transitLabel); len(hs) != 0 {
			t.Errorf("%s holds %d transit keys after the copies", s.Name(), len(hs))
		}
	}
}
