package leftover

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/miekg/pkcs11"
)

// One test of one token, for -count=3.
func TestMain(m *testing.M) { os.Exit(testhsm.Main(m, 4)) }

// After a failed session-key creation the searches remove what the call
// left (an object of its identity, a nameless key of its class and type)
// and nothing else: not what had the identity before, not a named key of
// the class, not a token object of the class.
func TestRemoveTakesOnlyWhatTheCallLeft(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sl := testhsm.Take(t, 1)[0].Open(t)
	ss, err := sl.OpenSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	aes := func(token bool, extra ...*pkcs11.Attribute) pkcs11.ObjectHandle {
		t.Helper()
		h, err := ss.CreateObject(ctx, append([]*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
			pkcs11.NewAttribute(pkcs11.CKA_TOKEN, token), pkcs11.NewAttribute(pkcs11.CKA_VALUE, make([]byte, 16)),
		}, extra...))
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	label := pkcs11.NewAttribute(pkcs11.CKA_LABEL, "wanted")
	before := aes(false, label)
	otherNamed := aes(false, pkcs11.NewAttribute(pkcs11.CKA_LABEL, "other"))
	tokenNameless := aes(true)
	defer ss.DestroyObject(ctx, tokenNameless)

	l := New([]Call{{
		Template: []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES), label},
		Class:    pkcs11.CKO_SECRET_KEY, ClassKnown: true, ExplicitID: true,
	}}, nil)
	if err := l.Snapshot(ctx, sl); err != nil {
		t.Fatal(err)
	}
	leftNamed, leftNameless := aes(false, label), aes(false)
	if !l.Remove(ctx, sl, ss) {
		t.Fatal("Remove reports the member may still hold a leftover")
	}
	for h, want := range map[pkcs11.ObjectHandle]bool{
		before: true, otherNamed: true, tokenNameless: true, leftNamed: false, leftNameless: false,
	} {
		_, err := ss.GetAttributes(ctx, h, []uint{pkcs11.CKA_CLASS})
		if got := err == nil; got != want {
			t.Errorf("object %d: still there %v, want %v (%v)", h, got, want, err)
		}
	}
}

// Held tells, per call, whether the member had an object the call's
// search matches before the call: the group searches again for a
// duplicate after the call only then.
func TestHeldTellsWhatWasThere(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sl := testhsm.Take(t, 1)[0].Open(t)
	ss, err := sl.OpenSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	if _, err := ss.CreateObject(ctx, []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false), pkcs11.NewAttribute(pkcs11.CKA_VALUE, make([]byte, 16)),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, "taken"),
	}); err != nil {
		t.Fatal(err)
	}
	call := func(label string, explicit bool) Call {
		return Call{Template: []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_LABEL, label)},
			Class: pkcs11.CKO_SECRET_KEY, ClassKnown: true, ExplicitID: explicit}
	}
	l := New([]Call{call("taken", true), call("free", true), call("taken", false)}, nil)
	if err := l.Snapshot(ctx, sl); err != nil {
		t.Fatal(err)
	}
	// The third names its identity randomly (not explicit): nothing had
	// it, and it is not searched for.
	for i, want := range []bool{true, false, false} {
		if got := l.Held(i); got != want {
			t.Errorf("call %d: Held %v, want %v", i, got, want)
		}
	}
}
