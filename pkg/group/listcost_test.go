package group

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
)

// TestListingReadsWhatMembersAloneKnow: pkcs11-tool -O reads each
// attribute of each object on its own, and through hsmserve every member
// call is a round trip. A read of attributes the group answers by itself
// — CKA_CLASS, CKA_KEY_TYPE and CKA_TOKEN, which no call changes, and the
// key attributes present gives every key whatever its copy says — costs
// no member call once the object is listed, and answers exactly what the
// same read answers beside an attribute only a member knows.
func TestListingReadsWhatMembersAloneKnow(t *testing.T) {
	ctx := testContext(t)
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{interceptor: faults, noHedge: true})
	s := openSession(t, f.g)
	for i, ext := range []bool{true, false} {
		label := fmt.Sprintf("k%d", i)
		if _, err := s.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), []*pkcs11.Attribute{
			attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SENSITIVE, !ext),
			attr(pkcs11.CKA_EXTRACTABLE, ext), attr(pkcs11.CKA_ENCRYPT, true), attr(pkcs11.CKA_VALUE_LEN, 32),
			attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_ID, []byte(label)),
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.CreateObject(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, true),
		attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_LABEL, "d"), attr(pkcs11.CKA_VALUE, []byte("d"))}); err != nil {
		t.Fatal(err)
	}
	hs, err := f.g.Find(ctx, nil)
	if err != nil || len(hs) != 3 {
		t.Fatalf("find all: %v, %d objects, want 3", err, len(hs))
	}
	calls := func() int {
		n := 0
		for _, tok := range f.toks {
			n += faults.Calls(tok.Name, slottest.All)
		}
		return n
	}
	keyTypes := []uint{pkcs11.CKA_CLASS, pkcs11.CKA_KEY_TYPE, pkcs11.CKA_TOKEN, pkcs11.CKA_LOCAL, pkcs11.CKA_KEY_GEN_MECHANISM,
		pkcs11.CKA_ALWAYS_SENSITIVE, pkcs11.CKA_NEVER_EXTRACTABLE, pkcs11.CKA_EXTRACTABLE, pkcs11.CKA_WRAP_WITH_TRUSTED}
	for _, h := range hs {
		id, err := f.g.Identity(h)
		if err != nil {
			t.Fatal(err)
		}
		types := []uint{pkcs11.CKA_CLASS, pkcs11.CKA_TOKEN}
		if id.Class == pkcs11.CKO_SECRET_KEY {
			types = keyTypes
		}
		// What a member answers beside an attribute only it knows; this
		// also learns what the copies say of CKA_WRAP_WITH_TRUSTED.
		want, err := f.g.GetAttributes(ctx, h, append([]uint{pkcs11.CKA_LABEL}, types...))
		if err != nil {
			t.Fatal(err)
		}
		before := calls()
		for i, ty := range types {
			got, err := f.g.GetAttributes(ctx, h, []uint{ty})
			if err != nil {
				t.Fatal(err)
			}
			if w := want[i+1]; got[0].Status != w.Status || !bytes.Equal(got[0].Value, w.Value) {
				t.Errorf("%s: attribute %#x alone reads %+v, beside CKA_LABEL %+v", id, ty, got[0], w)
			}
		}
		if n := calls() - before; n != 0 {
			t.Errorf("%s: %d member calls to read %d attributes the group answers itself", id, n, len(types))
		}
		// An attribute a member alone knows still goes to a member.
		before = calls()
		if _, err := f.g.GetAttributes(ctx, h, []uint{pkcs11.CKA_LABEL}); err != nil {
			t.Fatal(err)
		}
		if calls() == before {
			t.Errorf("%s: CKA_LABEL read with no member call", id)
		}
		if id.Class != pkcs11.CKO_SECRET_KEY {
			continue
		}
		// The material of a key the application made unextractable is
		// sensitive whatever a member's copy says: answered alone too.
		want, err = f.g.GetAttributes(ctx, h, []uint{pkcs11.CKA_LABEL, pkcs11.CKA_VALUE})
		if err != nil {
			t.Fatal(err)
		}
		before = calls()
		got, err := f.g.GetAttributes(ctx, h, []uint{pkcs11.CKA_VALUE})
		if err != nil {
			t.Fatal(err)
		}
		if got[0].Status != want[1].Status || !bytes.Equal(got[0].Value, want[1].Value) {
			t.Errorf("%s: CKA_VALUE alone reads %+v, beside CKA_LABEL %+v", id, got[0], want[1])
		}
		if unext := string(id.Label) == "k1"; unext != (calls() == before) || unext != (got[0].Status == pkcs11.CKR_ATTRIBUTE_SENSITIVE) {
			t.Errorf("%s: CKA_VALUE read with %d member calls, status %#x", id, calls()-before, got[0].Status)
		}
	}
}

// TestFindAllReadsEachObjectOnce: a find-all (pkcs11-tool -O's first
// call) lists every serving member, and through hsmserve every member
// call is a round trip. It costs one search and one read per object on
// each member (the identity), and the first read of each object that
// follows one member call, which also reads the key material its handle
// is checked with there and the copy's CKA_WRAP_WITH_TRUSTED. Two different keys under one identity are still
// reported: on one member by the find-all, on two where the second is
// first read.
func TestFindAllReadsEachObjectOnce(t *testing.T) {
	ctx := testContext(t)
	toks := takeTokens(t, 3)
	const keys = 8
	for i := range keys {
		importSecret(t, toks, fmt.Sprintf("k%d", i))
	}
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{toks: toks, interceptor: faults, noHedge: true})
	held := make([]int, len(toks))
	for i, tok := range toks {
		hs, err := openDirect(t, tok).FindObjects(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		held[i] = len(hs) // the keys, and the group's own objects
	}
	count := func(op slot.Op) []int {
		out := make([]int, len(toks))
		for i, tok := range toks {
			out[i] = faults.Calls(tok.Name, op)
		}
		return out
	}
	reads, finds := count(slot.OpGetAttributes), count(slot.OpFindObjects)
	hs, err := f.g.Find(ctx, nil)
	if err != nil || len(hs) != keys {
		t.Fatalf("find all: %v, %d objects, want %d", err, len(hs), keys)
	}
	readsAfter, findsAfter := count(slot.OpGetAttributes), count(slot.OpFindObjects)
	for i, tok := range toks {
		r, s := readsAfter[i]-reads[i], findsAfter[i]-finds[i]
		t.Logf("%s: %d objects, %d reads, %d searches", tok.Name, held[i], r, s)
		if r > held[i] {
			t.Errorf("%s: the find-all made %d reads of %d objects, want one each", tok.Name, r, held[i])
		}
		if s != 1 {
			t.Errorf("%s: the find-all made %d searches, want 1", tok.Name, s)
		}
	}
	all := func() int {
		n := 0
		for _, tok := range toks {
			n += faults.Calls(tok.Name, slottest.All)
		}
		return n
	}
	for _, h := range hs {
		before := all()
		if _, err := f.g.GetAttributes(ctx, h, []uint{pkcs11.CKA_LABEL, pkcs11.CKA_SIGN}); err != nil {
			t.Fatal(err)
		}
		if n := all() - before; n != 1 {
			t.Errorf("the first read of object %d after the find-all made %d member calls, want 1", h, n)
		}
		// That read also learnt that a copy lacks CKA_WRAP_WITH_TRUSTED
		// (these keys were made on the tokens without it), all that
		// CKA_EXTRACTABLE needs.
		before = all()
		got, err := f.g.GetAttributes(ctx, h, []uint{pkcs11.CKA_EXTRACTABLE})
		if err != nil {
			t.Fatal(err)
		}
		if n := all() - before; n != 0 || got[0].Status != pkcs11.CKR_OK || !bytes.Equal(got[0].Value, []byte{1}) {
			t.Errorf("CKA_EXTRACTABLE of object %d after its first read: %+v, %d member calls; want true, 0 calls", h, got[0], n)
		}
	}

	// A second key under k0's identity on the first member: the find-all
	// reads both and leaves the identity out.
	importSecret(t, toks[:1], "k0")
	if hs, err = f.g.Find(ctx, nil); err != nil || len(hs) != keys-1 {
		t.Fatalf("find all with two keys under k0 on %s: %v, %d objects, want %d", toks[0].Name, err, len(hs), keys-1)
	}
	if n := f.events.count(ConflictFound, toks[0].Name); n != 1 {
		t.Errorf("%d ConflictFound events naming %s, want 1", n, toks[0].Name)
	}

	// k1 replaced by another key on the first member, behind the group's
	// back: its handle there is new, and the first read there finds the
	// material differs from what the group read of k1.
	d := openDirect(t, toks[0])
	for _, h := range findDirect(t, d, "k1") {
		if err := d.DestroyObject(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	importSecret(t, toks[:1], "k1")
	if hs, err = f.g.Find(ctx, nil); err != nil || len(hs) != keys-1 {
		t.Fatalf("find all after k1 was replaced on %s: %v, %d objects, want %d", toks[0].Name, err, len(hs), keys-1)
	}
	conflicts := 0
	for _, h := range hs {
		if _, err := f.g.GetAttributes(ctx, h, []uint{pkcs11.CKA_LABEL}); errors.Is(err, ErrConflict) {
			conflicts++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if n := f.events.count(ConflictFound, toks[0].Name); conflicts != 1 || n != 2 {
		t.Errorf("reading every object after k1 was replaced on %s: %d conflicts, %d ConflictFound events naming it; want 1 and 2", toks[0].Name, conflicts, n)
	}
}
