package group

import (
	"context"
	"errors"
	"testing"

	"github.com/hagroup/hagroup/pkg/sync/tombstone"
	"github.com/miekg/pkcs11"
)

// refusingTombstones is a tombstone store whose writes all fail.
type refusingTombstones struct{}

func (refusingTombstones) Record(context.Context, tombstone.Tombstone) error {
	return errors.New("tombstone store refuses the write")
}

// TestDestroyOfAnObjectGoneUnderItsTombstone: a token object that every
// member lost between the group's listing and its destroy (as when a
// catch-up that read this destroy's own tombstone deletes it first: the
// conformance run under kill met it) is destroyed with CKR_OK, the bare
// token's answer, and its tombstone stands; without a recorded tombstone
// the answer is CKR_OBJECT_HANDLE_INVALID. Either way no member is
// failed and a second destroy is CKR_OBJECT_HANDLE_INVALID.
func TestDestroyOfAnObjectGoneUnderItsTombstone(t *testing.T) {
	for _, tc := range []struct {
		name   string
		refuse bool
		want   uint
	}{
		{"tombstone recorded", false, pkcs11.CKR_OK},
		{"tombstone refused", true, pkcs11.CKR_OBJECT_HANDLE_INVALID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := setup(t, setupOpts{})
			if tc.refuse {
				f.g.tombstones = refusingTombstones{}
			}
			ctx := testContext(t)
			s := openSession(t, f.g)
			const label = "gone-under-tombstone"
			h, err := s.CreateObject(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, true),
				attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_VALUE, []byte("payload"))})
			if err != nil {
				t.Fatal(err)
			}
			for _, tok := range f.toks {
				d := openDirect(t, tok)
				hs := findDirect(t, d, label)
				if len(hs) != 1 {
					t.Fatalf("%s holds %d objects labelled %s, want 1", tok.Name, len(hs), label)
				}
				if err := d.DestroyObject(ctx, hs[0]); err != nil {
					t.Fatalf("destroy on %s directly: %v", tok.Name, err)
				}
			}
			if err := s.DestroyObject(ctx, h); CodeOf(err) != tc.want {
				t.Fatalf("DestroyObject of an object gone from every member: %v (code %#x), want code %#x", err, CodeOf(err), tc.want)
			}
			if !tc.refuse {
				ts := f.tombs.All()
				if len(ts) != 1 || ts[0].Identity.Label != label || ts[0].Revoked {
					t.Errorf("tombstones %+v, want the destroy's one, standing", ts)
				}
			}
			wantServing(t, f, "after destroying an object gone from every member")
			if err := s.DestroyObject(ctx, h); CodeOf(err) != pkcs11.CKR_OBJECT_HANDLE_INVALID {
				t.Errorf("second destroy: %v, want CKR_OBJECT_HANDLE_INVALID", err)
			}
		})
	}
}
