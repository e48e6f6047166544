package group

import (
	"bytes"
	"crypto/sha256"
	"testing"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/miekg/pkcs11"
)

func aesTemplate(label string, extra ...*pkcs11.Attribute) []*pkcs11.Attribute {
	return append([]*pkcs11.Attribute{
		attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES), attr(pkcs11.CKA_VALUE_LEN, 32),
		attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SENSITIVE, true), attr(pkcs11.CKA_LABEL, label),
		attr(pkcs11.CKA_ENCRYPT, true), attr(pkcs11.CKA_DECRYPT, true), attr(pkcs11.CKA_WRAP, true), attr(pkcs11.CKA_UNWRAP, true),
	}, extra...)
}

// onEveryMember checks that every member holds exactly one object with
// label and that the same key encrypts a block the same way on each.
func onEveryMember(t *testing.T, f *fixture, label string) {
	t.Helper()
	ctx := testContext(t)
	var first []byte
	for _, tok := range f.toks {
		d := openDirect(t, tok)
		hs := findDirect(t, d, label)
		if len(hs) != 1 {
			t.Errorf("%s holds %d objects labelled %q, want 1", tok.Name, len(hs), label)
			continue
		}
		ct, err := d.Encrypt(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_ECB, nil), hs[0], make([]byte, 16))
		if err != nil {
			t.Errorf("%s: encrypt with %q: %v", tok.Name, label, err)
			continue
		}
		if first == nil {
			first = ct
		} else if !bytes.Equal(ct, first) {
			t.Errorf("%s: key %q differs from the first member's", tok.Name, label)
		}
	}
}

func TestKeyManagementIsReplicated(t *testing.T) {
	f := setup(t, setupOpts{})
	ctx := testContext(t)
	s := openSession(t, f.g)
	gen := pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil)
	kek, err := s.GenerateKey(ctx, gen, aesTemplate("kek", attr(pkcs11.CKA_EXTRACTABLE, true)))
	if err != nil {
		t.Fatal(err)
	}
	data, err := s.GenerateKey(ctx, gen, aesTemplate("data", attr(pkcs11.CKA_EXTRACTABLE, true)))
	if err != nil {
		t.Fatal(err)
	}
	onEveryMember(t, f, "kek")

	t.Run("copy", func(t *testing.T) {
		if _, err := s.CopyObject(ctx, data, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, "data-copy")}); err != nil {
			t.Fatal(err)
		}
		onEveryMember(t, f, "data-copy")
		if _, err := s.CopyObject(ctx, data, nil); pkcs11.Error(CodeOf(err)) != pkcs11.CKR_TEMPLATE_INCONSISTENT {
			t.Errorf("copy under the same identity: %v, want CKR_TEMPLATE_INCONSISTENT", err)
		}
	})
	t.Run("unwrap", func(t *testing.T) {
		blob, err := f.g.WrapKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP_PAD, nil), kek, data)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.UnwrapKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP_PAD, nil), kek, blob,
			aesTemplate("data-unwrapped")[:2:2]); err != nil {
			// class and key type only: the rest from the token's defaults
			t.Fatal(err)
		}
		hs, err := f.g.Find(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES)})
		if err != nil {
			t.Fatal(err)
		}
		if len(hs) != 4 {
			t.Errorf("%d AES keys after unwrap, want 4", len(hs))
		}
	})
	t.Run("set attributes", func(t *testing.T) {
		if err := f.g.SetAttributes(ctx, data, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, "data-renamed")}); err != nil {
			t.Fatal(err)
		}
		onEveryMember(t, f, "data-renamed")
		hs, err := f.g.Find(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, "data-renamed")})
		if err != nil || len(hs) != 1 || hs[0] != data {
			t.Errorf("find the renamed key: %v %v, want [%d]", hs, err, data)
		}
		if err := f.g.SetAttributes(ctx, data, []*pkcs11.Attribute{attr(pkcs11.CKA_EXTRACTABLE, false)}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.g.WrapKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP_PAD, nil), kek, data); CodeOf(err) != pkcs11.CKR_KEY_UNEXTRACTABLE {
			t.Errorf("wrap after CKA_EXTRACTABLE=false: %v, want CKR_KEY_UNEXTRACTABLE", err)
		}
		if err := f.g.SetAttributes(ctx, data, []*pkcs11.Attribute{attr(pkcs11.CKA_EXTRACTABLE, true)}); CodeOf(err) != pkcs11.CKR_ATTRIBUTE_READ_ONLY {
			t.Errorf("CKA_EXTRACTABLE back to true: %v, want CKR_ATTRIBUTE_READ_ONLY", err)
		}
		if err := f.g.SetAttributes(ctx, data, []*pkcs11.Attribute{attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_DES3)}); CodeOf(err) == pkcs11.CKR_OK {
			t.Errorf("changing CKA_KEY_TYPE succeeded")
		}
	})
	t.Run("derive", func(t *testing.T) {
		pub, priv := genEC(t, s, "ecdh", attr(pkcs11.CKA_DERIVE, true))
		pt, err := f.g.GetAttributes(ctx, pub, []uint{pkcs11.CKA_EC_POINT})
		if err != nil {
			t.Fatal(err)
		}
		params := pkcs11.NewECDH1DeriveParams(pkcs11.CKD_NULL, nil, pt[0].Value)
		if _, err := s.DeriveKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_ECDH1_DERIVE, params), priv, aesTemplate("derived", attr(pkcs11.CKA_EXTRACTABLE, true))); err != nil {
			t.Fatal(err)
		}
		for _, e := range f.events.all() {
			if e.Kind == ReplicationFailed {
				t.Errorf("the derived key's replication failed: %v", e.Err)
			}
		}
		onEveryMember(t, f, "derived")
	})
	t.Run("digest and random", func(t *testing.T) {
		d, err := f.g.Digest(ctx, pkcs11.NewMechanism(pkcs11.CKM_SHA256, nil), []byte("abc"))
		want := sha256.Sum256([]byte("abc"))
		if err != nil || !bytes.Equal(d, want[:]) {
			t.Errorf("digest: %x %v", d, err)
		}
		if err := s.DigestInit(ctx, pkcs11.NewMechanism(pkcs11.CKM_SHA256, nil)); err != nil {
			t.Fatal(err)
		}
		s.DigestUpdate(ctx, []byte("a"))
		s.DigestUpdate(ctx, []byte("bc"))
		d, err = s.DigestFinal(ctx)
		if err != nil || !bytes.Equal(d, want[:]) {
			t.Errorf("multi-part digest: %x %v", d, err)
		}
		r, err := f.g.GenerateRandom(ctx, 32)
		if err != nil || len(r) != 32 {
			t.Errorf("random: %d bytes, %v", len(r), err)
		}
	})
	t.Run("multi-part encrypt", func(t *testing.T) {
		iv := make([]byte, 16)
		mech := pkcs11.NewMechanism(pkcs11.CKM_AES_CBC_PAD, iv)
		if err := s.EncryptInit(ctx, mech, kek); err != nil {
			t.Fatal(err)
		}
		var ct []byte
		for _, p := range []string{"sixteen byte blk", "and some more"} {
			out, err := s.EncryptUpdate(ctx, []byte(p))
			if err != nil {
				t.Fatal(err)
			}
			ct = append(ct, out...)
		}
		out, err := s.EncryptFinal(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ct = append(ct, out...)
		if err := s.DecryptInit(ctx, mech, kek); err != nil {
			t.Fatal(err)
		}
		pt, err := s.Decrypt(ctx, ct)
		if err != nil || string(pt) != "sixteen byte blkand some more" {
			t.Errorf("decrypt: %q %v", pt, err)
		}
		if err := s.EncryptInit(ctx, mech, kek); err != nil {
			t.Fatal(err)
		}
		if err := s.EncryptInit(ctx, mech, kek); CodeOf(err) != pkcs11.CKR_OPERATION_ACTIVE {
			t.Errorf("second EncryptInit: %v, want CKR_OPERATION_ACTIVE", err)
		}
	})
}

// TestWrapExtractableKeyOnAnyMember wraps a key the application made
// extractable once per member in turn (round-robin): whichever member
// answers, the application gets the blob: the replicas lack
// CKA_WRAP_WITH_TRUSTED as the key's own copy does (they travelled under
// a transit key).
func TestWrapExtractableKeyOnAnyMember(t *testing.T) {
	f := setup(t, setupOpts{policy: config.PolicyRoundRobin})
	ctx := testContext(t)
	s := openSession(t, f.g)
	gen := pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil)
	kek, err := s.GenerateKey(ctx, gen, aesTemplate("kek", attr(pkcs11.CKA_EXTRACTABLE, true)))
	if err != nil {
		t.Fatal(err)
	}
	data, err := s.GenerateKey(ctx, gen, aesTemplate("data", attr(pkcs11.CKA_EXTRACTABLE, true)))
	if err != nil {
		t.Fatal(err)
	}
	onEveryMember(t, f, "data")
	kwp := pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP_PAD, nil)
	var first []byte
	for i := range 2 * len(f.toks) {
		blob, err := f.g.WrapKey(ctx, kwp, kek, data)
		if err != nil {
			t.Fatalf("WrapKey #%d: %v", i, err)
		}
		if first == nil {
			first = blob
		} else if !bytes.Equal(blob, first) {
			t.Errorf("WrapKey #%d gave another blob", i)
		}
	}
	a, err := f.g.GetAttributes(ctx, data, []uint{pkcs11.CKA_EXTRACTABLE})
	if err != nil || len(a) != 1 || len(a[0].Value) != 1 || a[0].Value[0] != 1 {
		t.Errorf("CKA_EXTRACTABLE of the extractable key: %v %v, want true", a, err)
	}
}
