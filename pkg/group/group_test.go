package group

import (
	"bytes"
	"crypto/sha256"
	"testing"

	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

func TestKeyGenerationReplicatesToEveryMember(t *testing.T) {
	f := setup(t, setupOpts{})
	ctx := testContext(t)
	s := openSession(t, f.g)
	pubH, priv := genEC(t, s, "replicated")

	// Every member holds both halves, with equal fingerprints, and signs.
	var fps [][]byte
	digest := sha256.Sum256([]byte("hello"))
	if k := ecKeyOf(t, f.g, "replicated", nil); k.h != priv {
		t.Fatalf("Find found handle %d, GenerateKeyPair returned %d", k.h, priv)
	}
	pub := ecPublic(t, f.g, pubH)
	for _, tok := range f.toks {
		d := openDirect(t, tok)
		hs, err := d.FindObjects(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, "replicated"), attr(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY)})
		if err != nil || len(hs) != 1 {
			t.Fatalf("%s: %d private keys labelled replicated (err %v), want 1", tok.Name, len(hs), err)
		}
		if n := len(findDirect(t, d, "replicated")); n != 2 {
			t.Errorf("%s: %d objects labelled replicated, want 2", tok.Name, n)
		}
		fp, err := object.Fingerprint(ctx, d, hs[0])
		if err != nil {
			t.Fatalf("%s: fingerprint: %v", tok.Name, err)
		}
		fps = append(fps, fp)
		raw, err := d.Sign(ctx, pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil), hs[0], digest[:])
		if err != nil {
			t.Fatalf("%s: sign: %v", tok.Name, err)
		}
		if !verifyRaw(pub, digest[:], raw) {
			t.Errorf("%s: signature by its copy does not verify against the group's public key", tok.Name)
		}
	}
	for i := 1; i < len(fps); i++ {
		if !bytes.Equal(fps[i], fps[0]) {
			t.Errorf("fingerprint on %s = %x, on %s = %x", f.toks[i].Name, fps[i], f.toks[0].Name, fps[0])
		}
	}
	if n := f.events.count(ObjectReplicated, ""); n != 4 {
		t.Errorf("%d ObjectReplicated events, want 4 (2 objects × 2 members)", n)
	}
	for _, m := range f.g.Members() {
		if m.State != member.Active {
			t.Errorf("member %s is %v after key generation", m.Name, m.State)
		}
	}
}
