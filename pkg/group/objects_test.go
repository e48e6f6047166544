package group

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/hagroup/hagroup/pkg/sync"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

func TestDestroyRemovesEverywhere(t *testing.T) {
	f := setup(t, setupOpts{})
	ctx := testContext(t)
	s := openSession(t, f.g)
	pub, priv := genEC(t, s, "doomed")
	for _, h := range []ObjectHandle{priv, pub} {
		if err := s.DestroyObject(ctx, h); err != nil {
			t.Fatalf("DestroyObject: %v", err)
		}
	}
	for _, tok := range f.toks {
		if n := len(findDirect(t, openDirect(t, tok), "doomed")); n != 0 {
			t.Errorf("%s still holds %d objects labelled doomed", tok.Name, n)
		}
	}
	if _, err := f.g.Sign(ctx, pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil), priv, make([]byte, 32)); CodeOf(err) != pkcs11.CKR_OBJECT_HANDLE_INVALID {
		t.Errorf("Sign with a destroyed key: %v, want CKR_OBJECT_HANDLE_INVALID (the token's C_SignInit code)", err)
	}
	if err := f.g.DestroyObject(ctx, priv); CodeOf(err) != pkcs11.CKR_OBJECT_HANDLE_INVALID {
		t.Errorf("second destroy: %v, want CKR_OBJECT_HANDLE_INVALID", err)
	}
	ts := f.tombs.All()
	if len(ts) != 2 {
		t.Fatalf("%d tombstones, want 2", len(ts))
	}
	for _, tb := range ts {
		if tb.Identity.Label != "doomed" || tb.GroupSerial != f.g.Serial() || len(tb.Fingerprint) == 0 {
			t.Errorf("tombstone %+v", tb)
		}
	}
}

func TestReplicationFailureLeavesNoHalfObject(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   slot.Op
	}{
		{"unwrap refused", slot.OpUnwrapKey},
		{"check after unwrap fails", slot.OpGetAttributes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			faults := slottest.NewFaults()
			f := setup(t, setupOpts{interceptor: faults})
			ctx := testContext(t)
			s := openSession(t, f.g)
			victim := f.toks[2].Name
			faults.Fail(victim, tc.op, errDevice)
			_, priv := genEC(t, s, "half")
			faults.Heal(victim)

			if st := memberState(f.g, victim); st != member.Failed {
				t.Errorf("member whose replication failed is %v, want failed", st)
			}
			if n := f.events.count(ReplicationFailed, victim); n == 0 {
				t.Errorf("no ReplicationFailed event for %s", victim)
			}
			if n := len(findDirect(t, openDirect(t, f.toks[2]), "half")); n != 0 {
				t.Errorf("%s holds %d objects labelled half after a failed replication, want 0", victim, n)
			}
			for _, tok := range f.toks[:2] {
				if n := len(findDirect(t, openDirect(t, tok), "half")); n != 2 {
					t.Errorf("%s holds %d objects labelled half, want 2", tok.Name, n)
				}
			}
			// The application's key works.
			if _, err := f.g.Sign(ctx, pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil), priv, make([]byte, 32)); err != nil {
				t.Errorf("sign with the key: %v", err)
			}
		})
	}
}

// A primary that dies while its new key is being copied is the one to
// blame: the targets stay in rotation (the chaos soak saw a healthy target
// failed for the source's CKR_DEVICE_ERROR, and with it the whole group).
func TestReplicationSourceFailureBlamesTheSource(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{interceptor: faults, policy: config.PolicyPrimaryBackup})
	s := openSession(t, f.g)
	primary := f.toks[0].Name
	// The key pair is generated on the primary; the copies of its private
	// half wrap it there, and that fails as on a killed member.
	faults.Fail(primary, slot.OpWrapKey, errDevice)
	_, _, err := s.GenerateKeyPair(testContext(t), pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{attr(pkcs11.CKA_EC_PARAMS, p256), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_VERIFY, true), attr(pkcs11.CKA_LABEL, "orphan")},
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SIGN, true),
			attr(pkcs11.CKA_SENSITIVE, true), attr(pkcs11.CKA_LABEL, "orphan")})
	faults.Heal(primary)
	t.Logf("GenerateKeyPair with the primary failing under the copy: %v", err)

	if st := memberState(f.g, primary); st != member.Failed {
		t.Errorf("primary that failed under the copy is %v, want failed", st)
	}
	for _, tok := range f.toks[1:] {
		if st := memberState(f.g, tok.Name); st == member.Failed {
			t.Errorf("target %s was failed for its source's error", tok.Name)
		}
		if n := len(findDirect(t, openDirect(t, tok), "orphan")); n != 0 && n != 2 {
			t.Errorf("%s holds %d objects labelled orphan, want all or nothing", tok.Name, n)
		}
	}
}

func TestDuplicateIdentityReportedNotUsed(t *testing.T) {
	toks := takeTokens(t, 3)
	// Two different keys under one identity: the duplicate-label hazard.
	importEC(t, toks[:2], "twin")
	importEC(t, toks[2:], "twin")
	f := setup(t, setupOpts{toks: toks, policy: config.PolicyPrimaryBackup})
	ctx := testContext(t)

	// A targeted find on the primary sees one key; when the primary fails
	// the group must not sign with the other member's different key.
	found, err := f.g.Find(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, "twin"), attr(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY)})
	if err != nil || len(found) != 1 {
		t.Fatalf("Find: %v, %d found", err, len(found))
	}
	mech := pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil)
	if _, err := f.g.Sign(ctx, mech, found[0], make([]byte, 32)); err != nil {
		t.Fatalf("sign on the primary: %v", err)
	}
	f.g.FailMember(toks[0].Name, errors.New("test"))
	f.g.FailMember(toks[1].Name, errors.New("test"))
	_, err = f.g.Sign(ctx, mech, found[0], make([]byte, 32))
	if !errors.Is(err, ErrConflict) {
		t.Fatalf("sign where only a different key under the same identity is left: %v, want ErrConflict", err)
	}
	if n := f.events.count(ConflictFound, toks[2].Name); n != 1 {
		t.Errorf("%d ConflictFound events naming %s, want 1", n, toks[2].Name)
	}
	var ev Event
	for _, e := range f.events.all() {
		if e.Kind == ConflictFound {
			ev = e
		}
	}
	if ev.Object.Label != "twin" || len(ev.Fingerprint) == 0 || len(ev.Other) == 0 || bytes.Equal(ev.Fingerprint, ev.Other) {
		t.Errorf("conflict event %+v", ev)
	}

	// A find-all over a fresh group joins the listings; the key material
	// is checked when a member's copy is first used, and the other key
	// under the same identity is refused there, never used.
	g2 := setup(t, setupOpts{toks: toks, noDomain: true, policy: config.PolicyPrimaryBackup})
	all, err := g2.g.Find(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var twin ObjectHandle
	for _, h := range all {
		attrs, err := g2.g.GetAttributes(ctx, h, []uint{pkcs11.CKA_LABEL, pkcs11.CKA_CLASS})
		if err != nil {
			t.Fatal(err)
		}
		if string(attrs[0].Value) == "twin" && attrs[1].Value[0] == byte(pkcs11.CKO_PRIVATE_KEY) {
			twin = h
		}
	}
	if twin == 0 {
		t.Fatal("find-all did not return the private key")
	}
	if _, err := g2.g.Sign(ctx, mech, twin, make([]byte, 32)); err != nil {
		t.Fatalf("sign on the primary after find-all: %v", err)
	}
	g2.g.FailMember(toks[0].Name, errors.New("test"))
	g2.g.FailMember(toks[1].Name, errors.New("test"))
	if _, err := g2.g.Sign(ctx, mech, twin, make([]byte, 32)); !errors.Is(err, ErrConflict) {
		t.Fatalf("sign after find-all where only the other key is left: %v, want ErrConflict", err)
	}
	if n := g2.events.count(ConflictFound, toks[2].Name); n != 1 {
		t.Errorf("%d ConflictFound events naming %s after find-all, want 1", n, toks[2].Name)
	}
	// Nothing was resolved by guessing: every key is still there.
	for _, tok := range toks {
		if n := len(findDirect(t, openDirect(t, tok), "twin")); n != 2 {
			t.Errorf("%s holds %d twin objects, want 2", tok.Name, n)
		}
	}
}

func TestFindAllJoinsOneListingPerMember(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{interceptor: faults})
	ctx := testContext(t)
	s := openSession(t, f.g)
	for i := range 10 {
		if _, err := s.CreateObject(ctx, []*pkcs11.Attribute{
			attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, true),
			attr(pkcs11.CKA_LABEL, fmt.Sprintf("data-%d", i)), attr(pkcs11.CKA_VALUE, []byte{byte(i), 1, 2}),
		}); err != nil {
			t.Fatal(err)
		}
	}
	// One object on the last member only (made behind the group's back).
	d := openDirect(t, f.toks[2])
	if _, err := d.CreateObject(ctx, []*pkcs11.Attribute{
		attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_LABEL, "lonely"), attr(pkcs11.CKA_VALUE, []byte("x")),
	}); err != nil {
		t.Fatal(err)
	}
	before := make([]int, 3)
	for i, tok := range f.toks {
		before[i] = faults.Calls(tok.Name, slot.OpFindObjects)
	}
	all, err := f.g.Find(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 11 {
		t.Errorf("find-all returned %d objects, want 11 (domain key hidden)", len(all))
	}
	for i, tok := range f.toks {
		if n := faults.Calls(tok.Name, slot.OpFindObjects) - before[i]; n != 1 {
			t.Errorf("find-all searched %s %d times, want 1", tok.Name, n)
		}
	}
	// The lonely object is served by the member that has it, without a
	// search on the others.
	lonely, err := f.g.Find(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, "lonely")})
	_ = lonely
	if err != nil {
		t.Fatal(err)
	}
	var lh ObjectHandle
	for _, h := range all {
		a, err := f.g.GetAttributes(ctx, h, []uint{pkcs11.CKA_LABEL})
		if err != nil {
			t.Fatalf("GetAttributes(%d): %v", h, err)
		}
		if string(a[0].Value) == "lonely" {
			lh = h
		}
	}
	if lh == 0 {
		t.Fatal("the object on one member only is not in find-all")
	}
	// Handles are stable: a second find-all returns the same ones.
	again, err := f.g.Find(ctx, nil)
	if err != nil || len(again) != len(all) {
		t.Fatalf("second find-all: %v, %d", err, len(again))
	}
	for i := range all {
		if all[i] != again[i] {
			t.Fatalf("handles changed between two find-alls: %v vs %v", all, again)
		}
	}
}

// TestFindByLabelCostsConstantCalls: a fresh process's search for one key
// by label, and its first use, cost the same member calls whether the
// members hold a few objects or ten times as many — one search, never a
// listing — counted at the pkg/slot boundary on every member.
func TestFindByLabelCostsConstantCalls(t *testing.T) {
	ctx := testContext(t)
	toks := takeTokens(t, 3)
	importSecret(t, toks, "wanted")
	fillDirect := func(from, to int) {
		for _, tok := range toks {
			d := openDirect(t, tok)
			for i := from; i < to; i++ {
				if _, err := d.CreateObject(ctx, []*pkcs11.Attribute{
					attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true),
					attr(pkcs11.CKA_LABEL, fmt.Sprintf("filler-%03d", i)), attr(pkcs11.CKA_VALUE, []byte{byte(i)}),
				}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	// calls opens a group as a fresh process would, finds "wanted" and
	// signs with it, and returns the member calls the find and the
	// signature made, per op, summed over the members. Primary-backup
	// places both on one member in either run, so that only the objects
	// differ between the runs.
	calls := func() map[slot.Op]int {
		faults := slottest.NewFaults()
		f := setup(t, setupOpts{toks: toks, interceptor: faults, noHedge: true, policy: config.PolicyPrimaryBackup})
		count := func() map[slot.Op]int {
			out := map[slot.Op]int{}
			for _, op := range []slot.Op{slot.OpFindObjects, slot.OpGetAttributes, slottest.All} {
				for _, tok := range toks {
					out[op] += faults.Calls(tok.Name, op)
				}
			}
			return out
		}
		before := count()
		hs, err := f.g.Find(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_LABEL, "wanted")})
		if err != nil || len(hs) != 1 {
			t.Fatalf("find by label: %v, %d handles", err, len(hs))
		}
		if _, err := f.g.Sign(ctx, pkcs11.NewMechanism(pkcs11.CKM_SHA256_HMAC, nil), hs[0], []byte("data")); err != nil {
			t.Fatalf("sign: %v", err)
		}
		after := count()
		for op := range after {
			after[op] -= before[op]
		}
		return after
	}
	fillDirect(0, 5)
	few := calls()
	fillDirect(5, 50)
	many := calls()
	if few[slot.OpFindObjects] != 1 {
		t.Errorf("find by label and first use searched the members %d times, want 1", few[slot.OpFindObjects])
	}
	for _, op := range []slot.Op{slot.OpFindObjects, slot.OpGetAttributes, slottest.All} {
		if few[op] != many[op] {
			t.Errorf("%q calls: %d with 6 objects per member, %d with 51: the cost of a find by label grows with the objects", op, few[op], many[op])
		}
	}
	t.Logf("member calls of a find by label and a signature: %v", many)
}

func TestApplicationObjectGetsRandomID(t *testing.T) {
	f := setup(t, setupOpts{})
	ctx := testContext(t)
	s := openSession(t, f.g)
	h, err := s.CreateObject(ctx, []*pkcs11.Attribute{
		attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES), attr(pkcs11.CKA_TOKEN, true),
		attr(pkcs11.CKA_ENCRYPT, true), attr(pkcs11.CKA_VALUE, make([]byte, 16)),
	})
	if err != nil {
		t.Fatal(err)
	}
	a, err := f.g.GetAttributes(ctx, h, []uint{pkcs11.CKA_ID})
	if err != nil {
		t.Fatal(err)
	}
	id := a[0].Value
	if len(id) != 16 {
		t.Fatalf("CKA_ID of a key made with neither ID nor label: %x, want 16 random bytes", id)
	}
	for _, tok := range f.toks {
		hs, err := openDirect(t, tok).FindObjects(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_ID, id)})
		if err != nil || len(hs) != 1 {
			t.Errorf("%s: %d keys with the assigned ID (err %v), want 1", tok.Name, len(hs), err)
		}
	}
	// A data object has no CKA_ID: it gets a random label.
	dh, err := s.CreateObject(ctx, []*pkcs11.Attribute{
		attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_VALUE, []byte("anonymous")),
	})
	if err != nil {
		t.Fatal(err)
	}
	a, err = f.g.GetAttributes(ctx, dh, []uint{pkcs11.CKA_LABEL})
	if err != nil {
		t.Fatal(err)
	}
	if l := string(a[0].Value); !strings.HasPrefix(l, AnonymousLabelPrefix) || len(l) != len(AnonymousLabelPrefix)+32 {
		t.Errorf("label of an anonymous data object: %q", l)
	}
	// A labelled object keeps what the application gave.
	h2, err := s.CreateObject(ctx, []*pkcs11.Attribute{
		attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_LABEL, "named"), attr(pkcs11.CKA_VALUE, []byte("x")),
	})
	if err != nil {
		t.Fatal(err)
	}
	a, _ = f.g.GetAttributes(ctx, h2, []uint{pkcs11.CKA_ID})
	if len(a[0].Value) != 0 {
		t.Errorf("labelled object got CKA_ID %x", a[0].Value)
	}
	// Identities are unique: a second object named the same is refused.
	_, err = s.CreateObject(ctx, []*pkcs11.Attribute{
		attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_LABEL, "named"), attr(pkcs11.CKA_VALUE, []byte("y")),
	})
	if CodeOf(err) != pkcs11.CKR_TEMPLATE_INCONSISTENT {
		t.Errorf("second object with the same identity: %v, want CKR_TEMPLATE_INCONSISTENT", err)
	}
	for _, tok := range f.toks {
		if n := len(findDirect(t, openDirect(t, tok), "named")); n != 1 {
			t.Errorf("%s holds %d objects labelled named, want 1", tok.Name, n)
		}
	}
}

func TestUnextractableHonouredAtVirtualSlot(t *testing.T) {
	f := setup(t, setupOpts{})
	ctx := testContext(t)
	s := openSession(t, f.g)
	aes := func(label string, extractable bool) ObjectHandle {
		h, err := s.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), []*pkcs11.Attribute{
			attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES), attr(pkcs11.CKA_VALUE_LEN, 32),
			attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SENSITIVE, true), attr(pkcs11.CKA_LABEL, label),
			attr(pkcs11.CKA_ENCRYPT, true), attr(pkcs11.CKA_DECRYPT, true), attr(pkcs11.CKA_WRAP, true), attr(pkcs11.CKA_UNWRAP, true),
			attr(pkcs11.CKA_EXTRACTABLE, extractable),
		})
		if err != nil {
			t.Fatalf("GenerateKey %s: %v", label, err)
		}
		return h
	}
	kek := aes("kek", true)
	secretKey := aes("secret", false)
	open := aes("open", true)

	a, err := f.g.GetAttributes(ctx, secretKey, []uint{pkcs11.CKA_EXTRACTABLE, pkcs11.CKA_NEVER_EXTRACTABLE, pkcs11.CKA_LABEL})
	if err != nil {
		t.Fatal(err)
	}
	// CKA_NEVER_EXTRACTABLE reads false for every key: only the copy the
	// call made could say otherwise (docs/DESIGN.md, "A key's protection is
	// what every copy shows").
	if len(a) != 3 || a[0].Value[0] != 0 || a[1].Value[0] != 0 || string(a[2].Value) != "secret" {
		t.Errorf("application view of an unextractable key: %+v, want EXTRACTABLE false, NEVER_EXTRACTABLE false", a)
	}
	wrapMech := pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP_PAD, nil)
	if _, err := f.g.WrapKey(ctx, wrapMech, kek, secretKey); CodeOf(err) != pkcs11.CKR_KEY_UNEXTRACTABLE {
		t.Errorf("WrapKey of an unextractable key: %v, want CKR_KEY_UNEXTRACTABLE", err)
	}
	if _, err := f.g.WrapKey(ctx, wrapMech, kek, open); err != nil {
		t.Errorf("WrapKey of an extractable key: %v", err)
	}
	// Physically the key is extractable only under trusted keys (the
	// domain key), and it was replicated.
	for _, tok := range f.toks {
		d := openDirect(t, tok)
		hs := findDirect(t, d, "secret")
		if len(hs) != 1 {
			t.Fatalf("%s holds %d keys labelled secret", tok.Name, len(hs))
		}
		pa, err := d.GetAttributes(ctx, hs[0], []uint{pkcs11.CKA_EXTRACTABLE, pkcs11.CKA_WRAP_WITH_TRUSTED})
		if err != nil {
			t.Fatal(err)
		}
		if pa[0].Value[0] != 1 || pa[1].Value[0] != 1 {
			t.Errorf("%s: physical EXTRACTABLE=%v WRAP_WITH_TRUSTED=%v, want both true", tok.Name, pa[0].Value, pa[1].Value)
		}
	}
	// A fresh group (another process, say) sees the same.
	g2 := setup(t, setupOpts{toks: f.toks, noDomain: true})
	hs, err := g2.g.Find(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, "secret")})
	if err != nil || len(hs) != 1 {
		t.Fatalf("find in a second group: %v %d", err, len(hs))
	}
	a, _ = g2.g.GetAttributes(ctx, hs[0], []uint{pkcs11.CKA_EXTRACTABLE})
	if a[0].Value[0] != 0 {
		t.Errorf("second group sees CKA_EXTRACTABLE=%v", a[0].Value)
	}
	kek2, _ := g2.g.Find(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, "kek")})
	if _, err := g2.g.WrapKey(ctx, wrapMech, kek2[0], hs[0]); CodeOf(err) != pkcs11.CKR_KEY_UNEXTRACTABLE {
		t.Errorf("second group WrapKey: %v, want CKR_KEY_UNEXTRACTABLE", err)
	}
}

func TestSessionObjectsLiveInTheSession(t *testing.T) {
	f := setup(t, setupOpts{})
	ctx := testContext(t)
	s := openSession(t, f.g)
	h, err := s.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), []*pkcs11.Attribute{
		attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES), attr(pkcs11.CKA_VALUE_LEN, 16),
		attr(pkcs11.CKA_TOKEN, false), attr(pkcs11.CKA_LABEL, "ephemeral"), attr(pkcs11.CKA_ENCRYPT, true), attr(pkcs11.CKA_DECRYPT, true),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range f.toks {
		m, _ := f.g.Member(tok.Name)
		if n := len(findDirect(t, m.Slot(), "ephemeral")); n != 1 {
			t.Errorf("%s holds %d session keys labelled ephemeral, want 1", tok.Name, n)
		}
	}
	mech := pkcs11.NewMechanism(pkcs11.CKM_AES_ECB, nil)
	ct, err := f.g.Encrypt(ctx, mech, h, make([]byte, 16))
	if err != nil {
		t.Fatal(err)
	}
	// Decrypt on each member in turn (failing the others) gives the plaintext.
	for i, tok := range f.toks {
		if i > 0 {
			f.g.FailMember(f.toks[i-1].Name, errors.New("test"))
		}
		pt, err := f.g.Decrypt(ctx, mech, h, ct)
		if err != nil || !bytes.Equal(pt, make([]byte, 16)) {
			t.Errorf("decrypt on %s: %x, %v", tok.Name, pt, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	m, _ := f.g.Member(f.toks[2].Name)
	if n := len(findDirect(t, m.Slot(), "ephemeral")); n != 0 {
		t.Errorf("session key still on %s after the session closed", f.toks[2].Name)
	}
	if _, err := f.g.Encrypt(ctx, mech, h, make([]byte, 16)); CodeOf(err) != pkcs11.CKR_OBJECT_HANDLE_INVALID {
		t.Errorf("encrypt with a closed session's key: %v, want CKR_OBJECT_HANDLE_INVALID (the token's C_EncryptInit code)", err)
	}
}

func TestTokenInfoSynthesised(t *testing.T) {
	f := setup(t, setupOpts{})
	ctx := testContext(t)
	ti, err := f.g.TokenInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	phys, err := openDirect(t, f.toks[0]).TokenInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ti.Label != f.g.Label() || ti.SerialNumber != f.g.Serial() {
		t.Errorf("label/serial %q/%q, want %q/%q", ti.Label, ti.SerialNumber, f.g.Label(), f.g.Serial())
	}
	// The members agree on their model: the token behind the group shows.
	if ti.ManufacturerID != phys.ManufacturerID || ti.Model != phys.Model || !strings.HasPrefix(phys.Model, "SoftHSM") {
		t.Errorf("manufacturer/model %q/%q, want the members' %q/%q", ti.ManufacturerID, ti.Model, phys.ManufacturerID, phys.Model)
	}
	if ti.Flags&pkcs11.CKF_TOKEN_INITIALIZED == 0 || ti.Flags&pkcs11.CKF_LOGIN_REQUIRED == 0 || ti.Flags&pkcs11.CKF_RNG == 0 {
		t.Errorf("flags 0x%x", ti.Flags)
	}
	if ti.MinPinLen != phys.MinPinLen || ti.MaxPinLen != phys.MaxPinLen {
		t.Errorf("PIN range %d-%d, members %d-%d", ti.MinPinLen, ti.MaxPinLen, phys.MinPinLen, phys.MaxPinLen)
	}
	if ti.SessionCount < 3 {
		t.Errorf("session count %d: want the members' counts summed (each has at least one)", ti.SessionCount)
	}
	mechs, err := f.g.Mechanisms(ctx)
	if err != nil || len(mechs) == 0 {
		t.Fatalf("Mechanisms: %v", err)
	}
	// In the primary's order, as applications pick the first that fits,
	// less the generation of keys a member cannot hold (capability.go).
	primary, _ := f.g.Member(f.g.Primary())
	own, err := primary.Slot().Mechanisms(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := slices.DeleteFunc(slices.Clone(own), func(m uint) bool {
		k, gen := sync.GeneratedKind(m)
		return gen && len(f.g.cannotHold(k)) > 0
	})
	if !slices.Equal(mechs, want) || slices.IsSorted(own) {
		t.Errorf("mechanisms %#x, want the primary's own unsorted list %#x less what the members cannot hold", mechs, want)
	}
	found := false
	for _, m := range mechs {
		found = found || m == pkcs11.CKM_ECDSA
	}
	if !found {
		t.Errorf("CKM_ECDSA missing from the group's mechanisms")
	}
}

func TestCloseWaitsForInFlight(t *testing.T) {
	faults := slottest.NewFaults()
	// The set-up (log-in, key generation) runs under the normal command
	// timeout: a SoftHSM C_Login under -race on a loaded machine can take
	// longer than any short timeout. The hung signature's end is the
	// test's own: released after Close has begun, it answers as a member
	// that died before it answered (slot.ErrTimeout), as at command_timeout.
	f := setup(t, setupOpts{interceptor: faults, policy: config.PolicyPrimaryBackup})
	ctx := testContext(t)
	signer := ecSigner(t, f.g, "closing")
	a := f.toks[0].Name
	faults.Hang(a, slot.OpSign)
	faults.LoseAnswer(a, slot.OpSign)
	t.Cleanup(func() { faults.Heal(a) })
	digest := sha256.Sum256([]byte("x"))
	signed := make(chan error, 1)
	go func() {
		_, err := signer.sign(ctx, digest[:])
		signed <- err
	}()
	if err := faults.WaitHung(ctx, a, 1); err != nil {
		t.Fatal(err)
	}
	b := f.toks[1].Name
	closed := make(chan struct{})
	go func() { f.g.Close(); close(closed) }()
	if err := waitClosing(ctx, f.g); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
		t.Fatalf("Close returned while a signature was hung on %s", a)
	default:
	}
	if n := faults.Calls(b, slot.OpSign); n != 0 {
		t.Fatalf("%s took %d signatures before the hung call on %s ended", b, n, a)
	}
	faults.Release(a)
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatalf("Close did not return after the in-flight signature ended: %v", ctx.Err())
	}
	// Close returns only once the in-flight signature is over, and that
	// signature ends only after its retry on the next member. So by now
	// the retry was made. (Which of "signed" and "closed" a select sees
	// first is a coin toss: the signature's result is sent after the
	// engine has let Close go.)
	if n := faults.Calls(b, slot.OpSign); n < 1 {
		t.Fatalf("Close returned before the in-flight signature was retried on %s (%d calls there)", b, n)
	}
	if err := <-signed; err != nil {
		t.Errorf("in-flight sign during Close: %v", err)
	}
	if _, err := signer.sign(ctx, digest[:]); !errors.Is(err, ErrClosed) {
		t.Errorf("sign after Close: %v, want ErrClosed", err)
	}
}

// waitClosing waits until Close has shut g's gate to new operations (and
// so is waiting for those in flight), or ctx ends.
func waitClosing(ctx context.Context, g *Group) error {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !g.gate.Closed() {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("Close never shut the gate: %w", ctx.Err())
		}
	}
	return nil
}

func TestFailAndActivateMember(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{interceptor: faults, policy: config.PolicyPrimaryBackup})
	ctx := testContext(t)
	signer := ecSigner(t, f.g, "activate")
	a := f.toks[0].Name
	if err := f.g.FailMember(a, errors.New("probe failed")); err != nil {
		t.Fatal(err)
	}
	m, _ := f.g.Member(a)
	epoch := m.Epoch()
	if err := f.g.ActivateMember(ctx, a); err != nil {
		t.Fatalf("ActivateMember: %v", err)
	}
	if m.State() != member.Active || m.Epoch() == epoch {
		t.Errorf("after ActivateMember: %v, epoch %d → %d", m.State(), epoch, m.Epoch())
	}
	for _, k := range []EventKind{MemberFailed, MemberRecovering, MemberRecovered} {
		if f.events.count(k, a) != 1 {
			t.Errorf("want one %s event for %s", k, a)
		}
	}
	before := faults.Calls(a, slot.OpSign)
	digest := sha256.Sum256([]byte("back"))
	if _, err := signer.sign(ctx, digest[:]); err != nil {
		t.Fatal(err)
	}
	if faults.Calls(a, slot.OpSign) != before+1 {
		t.Errorf("the returned primary did not take the signature")
	}
	if err := f.g.ActivateMember(ctx, "nobody"); !errors.Is(err, ErrUnknownMember) {
		t.Errorf("ActivateMember(unknown): %v", err)
	}
	_ = object.NoKeyType
}

func TestOpenWithAMemberDown(t *testing.T) {
	toks := takeTokens(t, 2)
	serial := fmt.Sprintf("%d", 4000000+serials.Add(1))
	cfg := config.Group{Label: "down-" + serial, Serial: serial}
	for _, tok := range toks {
		cfg.Members = append(cfg.Members, memberCfg(tok))
	}
	cfg.Members = append(cfg.Members, config.Member{Name: "ghost", Module: toks[0].Module, TokenLabel: "no-such-token"})
	events := newEventLog()
	g, err := Open(testContext(t), cfg, config.Defaults(), Options{Events: events})
	if err != nil {
		t.Fatalf("Open with one member's token missing: %v", err)
	}
	defer g.Close()
	st := g.Status()
	if st.Active != 2 || st.Failed != 1 || !st.Degraded() || st.down() {
		t.Errorf("status %+v", st)
	}
	if events.count(MemberFailed, "ghost") != 1 {
		t.Errorf("no MemberFailed event for the member that could not be opened")
	}
	if err := g.Login(testContext(t), pkcs11.CKU_USER, pinOf(toks[0].UserPIN)); err != nil {
		t.Fatal(err)
	}
	if _, err := g.GenerateRandom(testContext(t), 8); err != nil {
		t.Errorf("degraded group: %v", err)
	}
	// Recovery of a member that was never opened opens it: still missing.
	if err := g.ActivateMember(testContext(t), "ghost"); err == nil {
		t.Errorf("ActivateMember of a missing token succeeded")
	}
	if s := memberState(g, "ghost"); s != member.Failed {
		t.Errorf("ghost is %v after a failed recovery", s)
	}

	for _, bad := range []config.Group{
		{Label: "x"},
		{Members: cfg.Members},
		{Label: "x", Members: []config.Member{cfg.Members[0], cfg.Members[0]}},
	} {
		if _, err := Open(testContext(t), bad, config.Defaults(), Options{}); err == nil {
			t.Errorf("Open(%+v) succeeded", bad)
		}
	}
	bad := config.Defaults()
	bad.Policy = "fastest"
	if _, err := Open(testContext(t), cfg, bad, Options{}); err == nil || !strings.Contains(err.Error(), "fastest") {
		t.Errorf("unknown policy: %v", err)
	}
}
