package group

import (
	"bytes"
	"crypto/sha256"
	"testing"

	"github.com/hagroup/hagroup/pkg/group/tokeninfo"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
)

// C_DigestKey through the group digests the key's value on the digest's
// member, before or after other parts, as the token does; a handle that
// is no key is CKR_KEY_HANDLE_INVALID and the digest goes on.
func TestDigestKey(t *testing.T) {
	f := setup(t, setupOpts{})
	ctx := testContext(t)
	s := openSession(t, f.g)
	value := bytes.Repeat([]byte{0x5a, 0xa5}, 8)
	key, err := s.CreateObject(ctx, []*pkcs11.Attribute{
		attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
		attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_LABEL, "digested"),
		attr(pkcs11.CKA_SENSITIVE, false), attr(pkcs11.CKA_EXTRACTABLE, true), attr(pkcs11.CKA_ENCRYPT, true),
		attr(pkcs11.CKA_VALUE, value),
	})
	if err != nil {
		t.Fatal(err)
	}
	sha := pkcs11.NewMechanism(pkcs11.CKM_SHA256, nil)
	for _, c := range []struct {
		name  string
		first bool
		want  [32]byte
	}{
		{"after data", false, sha256.Sum256(append([]byte("abc"), value...))},
		{"first", true, sha256.Sum256(append(append([]byte{}, value...), "abc"...))},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := s.DigestInit(ctx, sha); err != nil {
				t.Fatal(err)
			}
			steps := []func() error{
				func() error { return s.DigestUpdate(ctx, []byte("abc")) },
				func() error { return s.DigestKey(ctx, key) },
			}
			if c.first {
				steps[0], steps[1] = steps[1], steps[0]
			}
			for _, step := range steps {
				if err := step(); err != nil {
					t.Fatal(err)
				}
			}
			d, err := s.DigestFinal(ctx)
			if err != nil || !bytes.Equal(d, c.want[:]) {
				t.Errorf("digest %x, %v; want %x", d, err, c.want)
			}
		})
	}
	if err := s.DigestInit(ctx, sha); err != nil {
		t.Fatal(err)
	}
	if err := s.DigestKey(ctx, key+1000); CodeOf(err) != pkcs11.CKR_KEY_HANDLE_INVALID {
		t.Errorf("DigestKey of no key: %v, want CKR_KEY_HANDLE_INVALID", err)
	}
	empty := sha256.Sum256(nil)
	if d, err := s.DigestFinal(ctx); err != nil || !bytes.Equal(d, empty[:]) {
		t.Errorf("digest after a refused key: %x, %v; want the empty digest %x, as the token", d, err, empty)
	}
}

// While no member answers, the virtual token keeps the identity its
// members last reported: it does not turn into another model mid-outage.
func TestTokenModelDuringOutage(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{interceptor: faults})
	ctx := testContext(t)
	before, err := f.g.TokenInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if before.ManufacturerID == tokeninfo.MixedManufacturer {
		t.Fatalf("manufacturer %q with every member answering, want the members'", before.ManufacturerID)
	}
	for _, tok := range f.toks {
		faults.FailAll(tok.Name, errDevice)
	}
	during, err := f.g.TokenInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if during.ManufacturerID != before.ManufacturerID || during.Model != before.Model {
		t.Errorf("during the outage %q/%q, want %q/%q as before", during.ManufacturerID, during.Model, before.ManufacturerID, before.Model)
	}
	if during.FreePublicMemory != tokeninfo.Unavailable {
		t.Errorf("free memory %d during the outage: the members did answer", during.FreePublicMemory)
	}
}
