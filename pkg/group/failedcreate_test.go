package group

import (
	"testing"

	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
)

// A creation that returns an error leaves nothing on a member in
// rotation (the soak's "objects left by failed creates"): a member where
// the failed creation's object could not be taken back leaves rotation,
// so that it serves nothing the group never made and no catch-up copies
// it from there; its recovery deletes it.
func TestFailedCreationLeavesNothingInRotation(t *testing.T) {
	refused := pkcs11.Error(pkcs11.CKR_TEMPLATE_INCONSISTENT)
	for _, tc := range []struct {
		name    string
		refuser int // the target that refuses its copy, so the creation fails
		stuck   int // the member whose object cannot be destroyed
	}{
		{"the primary cannot undo what it made", 2, 0},
		{"a target cannot give back its copy", 2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			faults := slottest.NewFaults()
			f := setup(t, setupOpts{interceptor: faults, policy: "primary-backup"})
			s := openSession(t, f.g)
			faults.Fail(f.toks[tc.refuser].Name, slot.OpCreateObject, refused)
			faults.Fail(f.toks[tc.stuck].Name, slot.OpDestroyObject, errDevice)
			label := "failed-create"
			_, err := s.CreateObject(testContext(t), []*pkcs11.Attribute{
				attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, false),
				attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_VALUE, []byte("v")),
			})
			if err == nil {
				t.Fatal("CreateObject with a target refusing its copy succeeded")
			}
			held := holdsLabel(t, f, label)
			if held[tc.stuck] == 0 {
				t.Fatalf("the planted fault did not keep the object on %s (holdings %v)", f.toks[tc.stuck].Name, held)
			}
			for i, n := range held {
				if st := memberState(f.g, f.toks[i].Name); n > 0 && st.Serving() {
					t.Errorf("member %s is %v and holds %d object(s) of the failed creation", f.toks[i].Name, st, n)
				}
			}
			if st := memberState(f.g, f.toks[tc.stuck].Name); st != member.Failed {
				t.Errorf("member %s, holding the failed creation's object, is %v; want failed", f.toks[tc.stuck].Name, st)
			}
			hs, err := f.g.Find(testContext(t), []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, label)})
			if err != nil || len(hs) != 0 {
				t.Errorf("Find after the failed creation = %v, %v; want none", hs, err)
			}
		})
	}
}
