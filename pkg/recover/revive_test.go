package recover

import (
	"errors"
	"testing"

	"github.com/hagroup/hagroup/pkg/sync"
	"github.com/miekg/pkcs11"
)

// A plan deletes a tombstoned version wherever it remains, even on every
// member. An object destroyed through the group and then made again
// through it with the same material (a public key imported again) is
// alive: the creation revokes the tombstone, and a catch-up keeps it on
// every member instead of deleting it. Without that revocation the key
// would vanish at the next recovery.
func TestObjectMadeAgainThroughTheGroupSurvivesCatchUp(t *testing.T) {
	r := newRig(t, rigOpts{n: 3, retries: 0})
	s := r.session()
	ecPoint, _ := newP256(t)
	tmpl := []*pkcs11.Attribute{rigA(pkcs11.CKA_CLASS, pkcs11.CKO_PUBLIC_KEY), rigA(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_EC),
		rigA(pkcs11.CKA_TOKEN, true), rigA(pkcs11.CKA_EC_PARAMS, rigP256), rigA(pkcs11.CKA_EC_POINT, ecPoint),
		rigA(pkcs11.CKA_VERIFY, true), rigA(pkcs11.CKA_LABEL, "again"), rigA(pkcs11.CKA_ID, []byte("id-again"))}
	h, err := s.CreateObject(rigCtx(t), tmpl)
	if err != nil {
		t.Fatalf("import through the group: %v", err)
	}
	if err := r.g.DestroyObject(rigCtx(t), h); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	objs, err := sync.List(rigCtx(t), r.direct(r.toks[0], "-tomb"))
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 0 {
		t.Fatalf("%s holds %d objects after the destroy", r.name(0), len(objs))
	}
	if _, err := s.CreateObject(rigCtx(t), tmpl); err != nil {
		t.Fatalf("import again through the group: %v", err)
	}
	snap, err := r.journal.Snapshot(rigCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if snap.Len() != 0 {
		t.Fatalf("tombstones after the key was made again: %v", snap.All())
	}

	victim := r.name(2)
	if err := r.g.FailMember(victim, errors.New("test: away")); err != nil {
		t.Fatal(err)
	}
	r.recoverExpecting(victim, "again")
}
