package group

import (
	"bytes"
	"errors"
	"testing"

	"github.com/miekg/pkcs11"
)

// TestExtractableWhileItsCopyIsAway: a key the application made
// extractable stays extractable while the copy it was made as is away:
// its replicas carry no CKA_WRAP_WITH_TRUSTED (they travelled under a
// transit key), so any member wraps it under the application's key, with
// the blob the key's own copy gives (issue 16: just after the primary
// restarted, the wrap answered CKR_KEY_UNEXTRACTABLE).
func TestExtractableWhileItsCopyIsAway(t *testing.T) {
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
	onEveryMember(t, f, "away-key")
	origin := f.g.Primary() // where both were made
	wrapMech := pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP_PAD, nil)
	want, err := f.g.WrapKey(ctx, wrapMech, kek, key)
	if err != nil {
		t.Fatalf("WrapKey: %v", err)
	}
	if err := f.g.FailMember(origin, errors.New("test: the key's own copy is away")); err != nil {
		t.Fatal(err)
	}
	// A fresh group (another process, say) knows nothing of the key's
	// origin: only the members' copies tell.
	g2 := setup(t, setupOpts{toks: f.toks, noDomain: true})
	for _, g := range []*Group{f.g, g2.g} {
		k, w := key, kek
		if g != f.g {
			k, w = findOne(t, g, "away-key"), findOne(t, g, "away-kek")
			if err := g.FailMember(origin, errors.New("test: the key's own copy is away")); err != nil {
				t.Fatal(err)
			}
		}
		if got, err := g.WrapKey(ctx, wrapMech, w, k); err != nil || !bytes.Equal(got, want) {
			t.Errorf("WrapKey with the key's own copy away: %x, %v; want %x", got, err, want)
		}
		a, err := g.GetAttributes(ctx, k, []uint{pkcs11.CKA_EXTRACTABLE})
		if err != nil || len(a) != 1 || len(a[0].Value) != 1 || a[0].Value[0] != 1 {
			t.Errorf("CKA_EXTRACTABLE with the key's own copy away: %+v, %v; want true", a, err)
		}
	}
}

func findOne(t *testing.T, g *Group, label string) ObjectHandle {
	t.Helper()
	hs, err := g.Find(testContext(t), []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, label)})
	if err != nil || len(hs) != 1 {
		t.Fatalf("find %q: %v, %d objects", label, err, len(hs))
	}
	return hs[0]
}
