package main

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/miekg/pkcs11"
)

// aheadRig is the library on a group of three SoftHSM tokens, its member
// calls counted at the pkg/slot boundary, with two sessions open.
type aheadRig struct {
	l        *library
	g        *group.Group
	toks     []testhsm.Token
	faults   *slottest.Faults
	one, two uint // application session handles
}

func newAheadRig(t *testing.T) *aheadRig {
	ctx := context.Background()
	r := &aheadRig{toks: testhsm.Take(t, 3), faults: slottest.NewFaults()}
	cfg := config.Group{Label: "ahead", Serial: "3200001"}
	for _, tok := range r.toks {
		cfg.Members = append(cfg.Members, config.Member{Name: tok.Name, Module: tok.Module, ModuleEnv: tok.ModuleEnv, TokenLabel: tok.Label})
	}
	set := config.Defaults()
	set.Hedge = false
	g, err := group.Open(ctx, cfg, set, group.Options{Interceptor: r.faults})
	if err != nil {
		t.Fatalf("open the group: %v", err)
	}
	t.Cleanup(func() { g.Close() })
	r.g = g
	var targets []domainkey.Target
	for _, m := range g.Members() {
		mm, _ := g.Member(m.Name)
		targets = append(targets, domainkey.Target{Slot: mm.Slot()})
	}
	e := &slotEntry{id: 1, tok: &virtual{g: g}}
	r.l = &library{ctx: ctx, slots: []*slotEntry{e}, byID: map[uint]*slotEntry{1: e}, sessions: map[uint]*appSession{}}
	for _, h := range []*uint{&r.one, &r.two} {
		if *h, err = r.l.openSession(1, true); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.l.login(r.one, pkcs11.CKU_USER, secret.PINFromString(r.toks[0].UserPIN)); err != nil {
		t.Fatal("login failed")
	}
	if err := domainkey.Install(ctx, targets, g.Serial()); err != nil {
		t.Fatalf("install the domain key: %v", err)
	}
	return r
}

// key makes a token AES key through session one.
func (r *aheadRig) key(t *testing.T, label string, extractable bool) uint {
	var h uint
	if err := r.l.withSession(r.one, func(s *appSession) (err error) {
		h, err = s.be.GenerateKey(r.l.ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), []*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true), pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
			pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true), pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, extractable),
			pkcs11.NewAttribute(pkcs11.CKA_ENCRYPT, true), pkcs11.NewAttribute(pkcs11.CKA_VALUE_LEN, 32),
			pkcs11.NewAttribute(pkcs11.CKA_LABEL, label), pkcs11.NewAttribute(pkcs11.CKA_ID, []byte(label)),
		})
		return err
	}); err != nil {
		t.Fatalf("generate %s: %v", label, err)
	}
	return h
}

// read is one C_GetAttributeValue of session h, as abi.go makes it.
func (r *aheadRig) read(t *testing.T, h, obj uint, lengths bool, types ...uint) ([]slot.Attribute, error) {
	t.Helper()
	var got []slot.Attribute
	err := r.l.withSession(h, func(s *appSession) (err error) {
		got, err = r.l.getAttributes(s, obj, types, lengths)
		return err
	})
	return got, err
}

func (r *aheadRig) calls() int {
	n := 0
	for _, tok := range r.toks {
		n += r.faults.Calls(tok.Name, slottest.All)
	}
	return n
}

// ckaUniqueID is PKCS#11 3.0's CKA_UNIQUE_ID, which miekg/pkcs11 does not name.
const ckaUniqueID = 0x4

// bareReads makes reads of the key labelled label, one attribute a call,
// on the first member's token itself.
func (r *aheadRig) bareReads(t *testing.T, label string, reads []keyRead) []slot.Attribute {
	t.Helper()
	ctx := r.l.ctx
	tok := r.toks[0]
	s, err := slot.Open(ctx, slot.Spec{Name: tok.Name + "-bare", Module: tok.Module, ModuleEnv: tok.ModuleEnv, TokenLabel: tok.Label,
		PIN: secret.PINFromString(tok.UserPIN), CommandTimeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("open %s itself: %v", tok.Name, err)
	}
	defer s.Close()
	hs, err := s.FindObjects(ctx, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_LABEL, label)})
	if err != nil || len(hs) != 1 {
		t.Fatalf("find %s on %s: %v, %d found", label, tok.Name, err, len(hs))
	}
	out := make([]slot.Attribute, len(reads))
	for i, rd := range reads {
		a, err := s.GetAttributes(ctx, hs[0], []uint{rd.typ})
		if err != nil {
			t.Fatalf("read %#x on %s: %v", rd.typ, tok.Name, err)
		}
		out[i] = a[0]
	}
	return out
}

// keyRead is one C_GetAttributeValue of one attribute; lengths marks a
// length query.
type keyRead struct {
	typ     uint
	lengths bool
}

// What listing tools read of an AES key, a call each, in their order
// (pkcs11-spy traces on a bare SoftHSM token), and the member calls they
// cost through the group of an unextractable key before the read-ahead.
var listingKeyReads = []struct {
	tool   string
	reads  []keyRead
	before int
}{
	{"pkcs11-tool -O", []keyRead{
		{pkcs11.CKA_CLASS, false}, {pkcs11.CKA_KEY_TYPE, false}, {pkcs11.CKA_CLASS, false}, {pkcs11.CKA_VALUE_LEN, false},
		{pkcs11.CKA_VALUE, true}, {pkcs11.CKA_LABEL, true}, {pkcs11.CKA_LABEL, false}, {pkcs11.CKA_ID, true}, {pkcs11.CKA_ID, false},
		{pkcs11.CKA_ENCRYPT, false}, {pkcs11.CKA_DECRYPT, false}, {pkcs11.CKA_VERIFY, false}, {pkcs11.CKA_WRAP, false},
		{pkcs11.CKA_UNWRAP, false}, {pkcs11.CKA_DERIVE, false}, {pkcs11.CKA_SENSITIVE, false}, {pkcs11.CKA_ALWAYS_SENSITIVE, false},
		{pkcs11.CKA_EXTRACTABLE, false}, {pkcs11.CKA_NEVER_EXTRACTABLE, false}, {pkcs11.CKA_LOCAL, false}, {ckaUniqueID, true},
	}, 11},
	{"p11tool --list-all", []keyRead{
		{pkcs11.CKA_ID, false}, {pkcs11.CKA_CLASS, false}, {pkcs11.CKA_WRAP, false}, {pkcs11.CKA_UNWRAP, false},
		{pkcs11.CKA_PRIVATE, false}, {pkcs11.CKA_TRUSTED, false}, {pkcs11.CKA_SENSITIVE, false}, {pkcs11.CKA_EXTRACTABLE, false},
		{pkcs11.CKA_NEVER_EXTRACTABLE, false}, {pkcs11.CKA_CERTIFICATE_CATEGORY, false}, {pkcs11.CKA_ALWAYS_AUTHENTICATE, false},
		{pkcs11.CKA_LABEL, false}, {pkcs11.CKA_ID, false}, {pkcs11.CKA_VALUE, false},
	}, 10},
}

// TestListingReadAhead: listing tools read each attribute of an object in
// its own call (pkcs11-tool's 21 reads of an AES key cost 12 member calls
// before the read-ahead, docs/BENCHMARKS.md). With it, the first read a
// member must answer reads every attribute listing tools read of the
// class, and the reads after it are answered from that: what is left is
// that read, what a token refuses for the class (SoftHSM: CKA_UNIQUE_ID,
// p11tool's CKA_CERTIFICATE_CATEGORY and CKA_ALWAYS_AUTHENTICATE of a
// secret key) and an extractable key's material, which is never read
// ahead. Each answer is the one a read of that attribute alone answers,
// the sensitive material's status included.
func TestListingReadAhead(t *testing.T) {
	r := newAheadRig(t)
	for _, tool := range listingKeyReads {
		for _, ext := range []bool{false, true} {
			label := fmt.Sprintf("%s/extractable=%v", tool.tool, ext)
			t.Run(label, func(t *testing.T) {
				obj := r.key(t, label, ext)
				// The first CKA_EXTRACTABLE learns what every copy says
				// (pkg/group); the listing's count leaves it out.
				if _, err := r.read(t, r.two, obj, false, pkcs11.CKA_EXTRACTABLE); err != nil {
					t.Fatal(err)
				}
				before := r.calls()
				var got []slot.Attribute
				for _, rd := range tool.reads {
					a, err := r.read(t, r.one, obj, rd.lengths, rd.typ)
					if err != nil {
						t.Fatalf("read %#x: %v", rd.typ, err)
					}
					got = append(got, a[0])
				}
				calls := r.calls() - before
				bare := r.bareReads(t, label, tool.reads)
				refused := 0
				for i, rd := range tool.reads {
					alone, err := r.read(t, r.two, obj, false, rd.typ)
					if err != nil {
						t.Fatal(err)
					}
					a := alone[0]
					if got[i].Status != a.Status || !bytes.Equal(got[i].Value, a.Value) {
						t.Errorf("attribute %#x: read ahead %+v, alone %+v", rd.typ, got[i], a)
					}
					if a.Status == pkcs11.CKR_ATTRIBUTE_TYPE_INVALID {
						refused++
					}
					// A refused attribute is answered as a member's token
					// answers it alone (fillAttributes then gives its length
					// as unavailable): the sensitive CKA_VALUE among them.
					if b := bare[i]; (got[i].Status != pkcs11.CKR_OK || b.Status != pkcs11.CKR_OK) && (got[i].Status != b.Status || got[i].Value != nil) {
						t.Errorf("attribute %#x: %+v through the group, %+v on the member's token", rd.typ, got[i], b)
					}
					if rd.typ == pkcs11.CKA_VALUE && got[i].Status != pkcs11.CKR_ATTRIBUTE_SENSITIVE {
						t.Errorf("a sensitive key's CKA_VALUE: %+v, want CKR_ATTRIBUTE_SENSITIVE", got[i])
					}
				}
				want, was := 1+refused, tool.before
				if ext {
					want, was = want+1, was+1
				}
				if calls != want {
					t.Errorf("%d reads of a key cost %d member calls (%d before the read-ahead), want %d", len(tool.reads), calls, was, want)
				}
			})
		}
	}
}

// TestReadAheadIsKeptOnlyWhileNothingChanges: what one session read ahead
// never answers another session, nor a read after a change of the object
// or of the login through any session, nor a read after another call of
// the session, nor once older than aheadAge.
func TestReadAheadIsKeptOnlyWhileNothingChanges(t *testing.T) {
	r := newAheadRig(t)
	obj := r.key(t, "k", false)
	other := r.key(t, "other", false)
	label := func(h uint) string {
		t.Helper()
		got, err := r.read(t, h, obj, false, pkcs11.CKA_LABEL)
		if err != nil {
			t.Fatal(err)
		}
		return string(got[0].Value)
	}
	costs := func(name string, want bool, fn func()) {
		t.Helper()
		before := r.calls()
		fn()
		if asked := r.calls() > before; asked != want {
			t.Errorf("%s: asked a member %v, want %v", name, asked, want)
		}
	}
	costs("the first read", true, func() { label(r.one) })
	costs("the next read of the session", false, func() { label(r.one) })
	costs("the same read on another session", true, func() { label(r.two) })

	// A label set through the other session is read at once.
	label(r.one)
	if err := r.l.changing(r.two, func(s *appSession) error {
		return s.be.SetAttributes(r.l.ctx, obj, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_LABEL, "renamed")})
	}); err != nil {
		t.Fatal(err)
	}
	if got := label(r.one); got != "renamed" {
		t.Errorf("after C_SetAttributeValue on another session the label reads %q, want %q", got, "renamed")
	}

	label(r.one)
	costs("a read after a read of another object", true, func() {
		if _, err := r.read(t, r.one, other, false, pkcs11.CKA_LABEL); err != nil {
			t.Fatal(err)
		}
		label(r.one)
	})
	costs("a read after another call of the session", true, func() {
		if err := r.l.withSession(r.one, func(*appSession) error { return nil }); err != nil {
			t.Fatal(err)
		}
		label(r.one)
	})
	costs("a read after aheadAge", true, func() {
		if err := r.l.withSession(r.one, func(s *appSession) error {
			if s.ahead == nil {
				return fmt.Errorf("nothing read ahead")
			}
			s.ahead.at = s.ahead.at.Add(-aheadAge)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		label(r.one)
	})

	// After C_Logout on the other session the private key's attributes
	// are not answered from what was read while logged in.
	label(r.one)
	if err := r.l.logout(r.two); err != nil {
		t.Fatal(err)
	}
	got, err := r.read(t, r.one, obj, false, pkcs11.CKA_LABEL)
	if err == nil && got[0].Status == pkcs11.CKR_OK {
		t.Errorf("after C_Logout a private key's label reads %q", got[0].Value)
	}
}
