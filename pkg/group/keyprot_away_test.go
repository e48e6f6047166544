package group

import (
	"errors"
	"testing"

	"github.com/miekg/pkcs11"
)

// TestExtractableAgainWhenItsCopyReturns: a key the application made
// extractable reads unextractable while the copy it was made as is away
// (the replicas carry CKA_WRAP_WITH_TRUSTED: the safe side), and
// extractable again once that member serves: what the members answered
// while one was away is not kept for the life of the key.
func TestExtractableAgainWhenItsCopyReturns(t *testing.T) {
	f := setup(t, setupOpts{})
	ctx := testContext(t)
	s := openSession(t, f.g)
	gen := pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil)
	kek, err := s.GenerateKey(ctx, gen, aesTemplate("away-kek", attr(pkcs11.CKA_EXTRACTABLE, true)))
	if err != nil {
		t.Fatal(err)
	}
	key, err := s.GenerateKey(ctx, gen, aesTemplate("away-key", attr(pkcs11.CKA_EXTRACTABLE, true)))
	if err != nil {
		t.Fatal(err)
	}
	origin := f.g.Primary() // where both were made
	if err := f.g.FailMember(origin, errors.New("test: the key's own copy is away")); err != nil {
		t.Fatal(err)
	}
	wrapMech := pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP_PAD, nil)
	if _, err := f.g.WrapKey(ctx, wrapMech, kek, key); CodeOf(err) != pkcs11.CKR_KEY_UNEXTRACTABLE {
		t.Errorf("WrapKey with the key's own copy away: %v, want CKR_KEY_UNEXTRACTABLE (the safe side)", err)
	}
	if err := f.g.ActivateMember(ctx, origin); err != nil {
		t.Fatalf("ActivateMember %s: %v", origin, err)
	}
	if _, err := f.g.WrapKey(ctx, wrapMech, kek, key); err != nil {
		t.Errorf("WrapKey with the key's own copy back: %v", err)
	}
	a, err := f.g.GetAttributes(ctx, key, []uint{pkcs11.CKA_EXTRACTABLE})
	if err != nil || len(a) != 1 || len(a[0].Value) != 1 || a[0].Value[0] != 1 {
		t.Errorf("CKA_EXTRACTABLE with the key's own copy back: %+v, %v; want true", a, err)
	}
}
