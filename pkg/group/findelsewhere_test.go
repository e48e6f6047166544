package group

import (
	"crypto/sha256"
	"testing"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
)

// A serving member that answers a search without a key the group made
// (SoftHSM behind one process per connection now and then hides from one
// connection an object another process made: the soak's "missing after
// its creation returned") does not make a find by label answer "no such
// key": the key is found on a member that holds it and signs there. Here
// the primary, where primary-backup sends the find, loses the private key
// behind the group's back.
func TestFindAnswersFromAMemberThatHoldsTheKey(t *testing.T) {
	ctx := testContext(t)
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{interceptor: faults, noHedge: true, policy: config.PolicyPrimaryBackup})
	s := openSession(t, f.g)
	genEC(t, s, "made-everywhere")

	primary := openDirect(t, f.toks[0])
	hs := findDirect(t, primary, "made-everywhere")
	for _, h := range hs {
		if class, err := primary.GetAttributes(ctx, h, []uint{pkcs11.CKA_CLASS}); err != nil {
			t.Fatal(err)
		} else if ulong(class[0].Value) == pkcs11.CKO_PRIVATE_KEY {
			if err := primary.DestroyObject(ctx, h); err != nil {
				t.Fatal(err)
			}
		}
	}

	tmpl := []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY), attr(pkcs11.CKA_LABEL, "made-everywhere")}
	before := faults.Calls(f.toks[0].Name, slot.OpFindObjects)
	found, err := f.g.Find(ctx, tmpl)
	if err != nil {
		t.Fatalf("Find: %v", err)
	}
	if faults.Calls(f.toks[0].Name, slot.OpFindObjects) == before {
		t.Fatalf("the find did not ask %s, the member that lacks the key: the test proves nothing", f.toks[0].Name)
	}
	if len(found) != 1 {
		t.Fatalf("Find by label found %d private keys, want the 1 that %s and %s hold", len(found), f.toks[1].Name, f.toks[2].Name)
	}
	digest := sha256.Sum256([]byte("signed where the key is"))
	if _, err := f.g.Sign(ctx, pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil), found[0], digest[:]); err != nil {
		t.Fatalf("Sign with the key found: %v", err)
	}

	// A key no member holds is still not found, and the search fails no
	// member.
	none, err := f.g.Find(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY), attr(pkcs11.CKA_LABEL, "made-nowhere")})
	if err != nil || len(none) != 0 {
		t.Fatalf("Find of a key no member holds: %d found, error %v; want none, no error", len(none), err)
	}
	for _, tok := range f.toks {
		if st := memberState(f.g, tok.Name); !st.Serving() {
			t.Errorf("member %s is %v after the finds, want it serving", tok.Name, st)
		}
	}
}
