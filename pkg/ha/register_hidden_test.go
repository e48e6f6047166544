package ha

import (
	"strings"
	"testing"

	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/sync/tombstone"
	"github.com/miekg/pkcs11"
)

// The tombstone registers are modifiable objects on the members (their
// label is changed in place). Through the virtual slot an application must
// neither find one nor change one by any handle it can name: a cleared
// register would let a destroyed key come back, a forged one would delete
// live keys everywhere.
func TestTombstoneRegistersOutOfTheApplicationsReach(t *testing.T) {
	h := newHosts(t, 2)
	ctx := testCtx(t)
	g := h.open(nil)
	s := openSession(t, g)
	pub, priv := genEC(t, s, "gone")
	for _, o := range []group.ObjectHandle{priv, pub} {
		if err := s.DestroyObject(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	for _, tok := range h.toks {
		if n := memberTombstones(t, h.cfg.Serial, tok).Len(); n != 2 {
			t.Fatalf("%s holds %d tombstones after the destroy of a key pair, want 2", tok.Name, n)
		}
	}

	for _, tmpl := range [][]*pkcs11.Attribute{
		nil,
		{pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_DATA)},
		{pkcs11.NewAttribute(pkcs11.CKA_APPLICATION, []byte(tombstone.Application))},
	} {
		found, err := s.Find(ctx, tmpl)
		if err != nil {
			t.Fatalf("find %v: %v", tmpl, err)
		}
		if len(found) != 0 {
			t.Errorf("a search through the virtual slot (template %v) found %d objects, want none: only state objects are left", tmpl, len(found))
		}
	}
	forged := "hagroup-state:" + h.cfg.Serial + ":tombstones"
	for vh := group.ObjectHandle(1); vh <= 256; vh++ {
		if _, err := s.GetAttributes(ctx, vh, []uint{pkcs11.CKA_LABEL}); err == nil {
			t.Errorf("virtual handle %d reads an object, want none: only state objects are left", vh)
		}
		if err := s.SetAttributes(ctx, vh, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_LABEL, forged)}); err == nil {
			t.Errorf("virtual handle %d took a label change, want none", vh)
		}
	}
	for _, tok := range h.toks {
		if n := memberTombstones(t, h.cfg.Serial, tok).Len(); n != 2 {
			t.Errorf("%s holds %d tombstones after the application's attempts, want the 2 it had", tok.Name, n)
		}
		for _, l := range findLabelled(t, direct(t, tok), "") {
			if strings.HasPrefix(l, "hagroup-state") {
				t.Errorf("%s: sync.List shows the state object %q as an application object", tok.Name, l)
			}
		}
	}
}
