package group

import (
	"bytes"
	"testing"

	"github.com/miekg/pkcs11"
)

// memberBools reads boolean attribute t of the object labelled label on
// every member, directly (as a user with the PIN on a member would).
func memberBools(t *testing.T, f *fixture, label string, typ uint) []bool {
	t.Helper()
	var out []bool
	for _, tok := range f.toks {
		d := openDirect(t, tok)
		hs := findDirect(t, d, label)
		if len(hs) != 1 {
			t.Fatalf("%s holds %d objects labelled %q, want 1", tok.Name, len(hs), label)
		}
		a, err := d.GetAttributes(testContext(t), hs[0], []uint{typ})
		if err != nil || len(a) != 1 || a[0].Status != pkcs11.CKR_OK {
			t.Fatalf("%s: read 0x%x of %q: %v %v", tok.Name, typ, label, a, err)
		}
		out = append(out, len(a[0].Value) > 0 && a[0].Value[0] != 0)
	}
	return out
}

// memberValues reads CKA_VALUE of the object labelled label on every
// member: nil where the member refuses it.
func memberValues(t *testing.T, f *fixture, label string) [][]byte {
	t.Helper()
	var out [][]byte
	for _, tok := range f.toks {
		d := openDirect(t, tok)
		hs := findDirect(t, d, label)
		if len(hs) != 1 {
			t.Fatalf("%s holds %d objects labelled %q, want 1", tok.Name, len(hs), label)
		}
		a, err := d.GetAttributes(testContext(t), hs[0], []uint{pkcs11.CKA_VALUE})
		if err == nil && len(a) == 1 && a[0].Status == pkcs11.CKR_OK {
			out = append(out, a[0].Value)
		} else {
			out = append(out, nil)
		}
	}
	return out
}

// TestKeyViewOnEveryMember: a key the application made readable reads its
// value through the group and on every member alike; one it made
// sensitive or unextractable shows its value on no member; and when the
// application latches a readable key unextractable, every member's copy
// becomes sensitive in the same call, while the application's view moves
// as on a bare token; a key made from outside material is neither always
// sensitive nor never extractable (issue 30, items 2, 3 and 4).
func TestKeyViewOnEveryMember(t *testing.T) {
	f := setup(t, setupOpts{})
	ctx := testContext(t)
	s := openSession(t, f.g)
	value := bytes.Repeat([]byte{0x42}, 32)
	secret := func(label string, sens, ext bool) ObjectHandle {
		h, err := s.CreateObject(ctx, []*pkcs11.Attribute{
			attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_GENERIC_SECRET),
			attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_SIGN, true),
			attr(pkcs11.CKA_SENSITIVE, sens), attr(pkcs11.CKA_EXTRACTABLE, ext), attr(pkcs11.CKA_VALUE, value)})
		if err != nil {
			t.Fatalf("create %s: %v", label, err)
		}
		return h
	}
	view := func(h ObjectHandle, typ uint) (bool, []byte) {
		a, err := f.g.GetAttributes(ctx, h, []uint{typ})
		if err != nil && CodeOf(err) != pkcs11.CKR_ATTRIBUTE_SENSITIVE {
			t.Fatalf("GetAttributes 0x%x: %v", typ, err)
		}
		if a[0].Status != pkcs11.CKR_OK {
			return false, nil
		}
		return len(a[0].Value) > 0 && a[0].Value[0] != 0, a[0].Value
	}

	readable := secret("kv-readable", false, true)
	if _, v := view(readable, pkcs11.CKA_VALUE); !bytes.Equal(v, value) {
		t.Errorf("a readable key reads %x through the group, want its value", v)
	}
	for i, v := range memberValues(t, f, "kv-readable") {
		if !bytes.Equal(v, value) {
			t.Errorf("member %s: the readable key reads %x, want its value as through the group", f.toks[i].Name, v)
		}
	}
	for _, c := range []struct {
		label     string
		sens, ext bool
	}{{"kv-sensitive", true, true}, {"kv-unextractable", false, false}, {"kv-locked", true, false}} {
		h := secret(c.label, c.sens, c.ext)
		for i, v := range memberValues(t, f, c.label) {
			if v != nil {
				t.Errorf("member %s shows the value of %s (sensitive=%t extractable=%t): %x", f.toks[i].Name, c.label, c.sens, c.ext, v)
			}
		}
		// An unextractable key reads sensitive, as its copies are (docs/DESIGN.md,
		// "A key's protection is what every copy shows").
		if sens, _ := view(h, pkcs11.CKA_SENSITIVE); sens != (c.sens || !c.ext) {
			t.Errorf("%s: CKA_SENSITIVE reads %t through the group, want %t", c.label, sens, c.sens || !c.ext)
		}
		if always, _ := view(h, pkcs11.CKA_ALWAYS_SENSITIVE); always {
			t.Errorf("%s: CKA_ALWAYS_SENSITIVE true for a key made from outside material", c.label)
		}
		if never, _ := view(h, pkcs11.CKA_NEVER_EXTRACTABLE); never {
			t.Errorf("%s: CKA_NEVER_EXTRACTABLE true for a key made from outside material", c.label)
		}
	}

	// Latch the readable key unextractable: no member copy may show it.
	if err := f.g.SetAttributes(ctx, readable, []*pkcs11.Attribute{attr(pkcs11.CKA_EXTRACTABLE, false)}); err != nil {
		t.Fatalf("CKA_EXTRACTABLE true->false: %v", err)
	}
	for i, v := range memberValues(t, f, "kv-readable") {
		if v != nil {
			t.Errorf("member %s shows the value of a key the application made unextractable: %x", f.toks[i].Name, v)
		}
	}
	if _, v := view(readable, pkcs11.CKA_VALUE); v != nil {
		t.Errorf("the group shows the value of a key made unextractable: %x", v)
	}
	if sens, _ := view(readable, pkcs11.CKA_SENSITIVE); !sens {
		t.Error("CKA_SENSITIVE reads false after CKA_EXTRACTABLE went false, while every copy is sensitive")
	}
	if err := f.g.SetAttributes(ctx, readable, []*pkcs11.Attribute{attr(pkcs11.CKA_EXTRACTABLE, true)}); CodeOf(err) != pkcs11.CKR_ATTRIBUTE_READ_ONLY {
		t.Errorf("CKA_EXTRACTABLE false->true: %v, want CKR_ATTRIBUTE_READ_ONLY", err)
	}
	if _, err := f.g.WrapKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP_PAD, nil), readable, readable); CodeOf(err) != pkcs11.CKR_KEY_UNEXTRACTABLE {
		t.Errorf("wrap of a key made unextractable: %v, want CKR_KEY_UNEXTRACTABLE", err)
	}
	if err := f.g.SetAttributes(ctx, readable, []*pkcs11.Attribute{attr(pkcs11.CKA_SENSITIVE, false)}); CodeOf(err) != pkcs11.CKR_ATTRIBUTE_READ_ONLY {
		t.Errorf("CKA_SENSITIVE true->false: %v, want CKR_ATTRIBUTE_READ_ONLY", err)
	}
	// A readable key made sensitive: the view moves, and every copy.
	other := secret("kv-readable2", false, true)
	if err := f.g.SetAttributes(ctx, other, []*pkcs11.Attribute{attr(pkcs11.CKA_SENSITIVE, true)}); err != nil {
		t.Fatalf("CKA_SENSITIVE false->true: %v", err)
	}
	if sens, _ := view(other, pkcs11.CKA_SENSITIVE); !sens {
		t.Error("CKA_SENSITIVE reads false after it was set true")
	}
	if always, _ := view(other, pkcs11.CKA_ALWAYS_SENSITIVE); always {
		t.Error("CKA_ALWAYS_SENSITIVE true for a key that was readable")
	}
	for i, v := range memberValues(t, f, "kv-readable2") {
		if v != nil {
			t.Errorf("member %s shows the value of a key made sensitive: %x", f.toks[i].Name, v)
		}
	}
	for i, sens := range memberBools(t, f, "kv-readable", pkcs11.CKA_SENSITIVE) {
		if !sens {
			t.Errorf("member %s: the latched key is not sensitive", f.toks[i].Name)
		}
	}
}

// TestSessionCopyIsItsOwnObject: a copy of a session key shares its
// source's identity (class, key type, CKA_ID, CKA_LABEL), and each member
// must hold it as a new object with the protection the copy asked for:
// the replicas took the source for the copy and answered its attributes
// (a copy made sensitive read readable on them).
func TestSessionCopyIsItsOwnObject(t *testing.T) {
	f := setup(t, setupOpts{})
	ctx := testContext(t)
	s := openSession(t, f.g)
	src, err := s.CreateObject(ctx, []*pkcs11.Attribute{
		attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_GENERIC_SECRET),
		attr(pkcs11.CKA_TOKEN, false), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_LABEL, "session-copy"), attr(pkcs11.CKA_SIGN, true),
		attr(pkcs11.CKA_SENSITIVE, false), attr(pkcs11.CKA_EXTRACTABLE, true), attr(pkcs11.CKA_VALUE, bytes.Repeat([]byte{7}, 32))})
	if err != nil {
		t.Fatal(err)
	}
	cp, err := s.CopyObject(ctx, src, []*pkcs11.Attribute{attr(pkcs11.CKA_SENSITIVE, true)})
	if err != nil {
		t.Fatalf("copy made sensitive: %v", err)
	}
	o, err := f.g.object("test", cp)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range f.g.view().members {
		if sens, ok := f.g.boolOn(ctx, o, m, pkcs11.CKA_SENSITIVE); !ok || !sens {
			t.Errorf("member %s: the sensitive copy reads CKA_SENSITIVE %t (answered %t), want true", m.Name(), sens, ok)
		}
	}
}
