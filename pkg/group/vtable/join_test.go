package vtable

import (
	"testing"

	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

func listed(id object.Identity, h uint, fp string) object.Object {
	var f []byte
	if fp != "" {
		f = []byte(fp)
	}
	return object.Object{Identity: id, Handle: pkcs11.ObjectHandle(h), Fingerprint: f, Token: true}
}

// Join enters an object once however many members list it: verified
// where it was listed with its fingerprint, unverified elsewhere, absent
// where a member did not list it.
func TestJoinRecordsEveryMember(t *testing.T) {
	tb := New(func() int { return 3 })
	m0, m1, m2 := newMember(t, "m0", 0), newMember(t, "m1", 1), newMember(t, "m2", 2)
	a := key("a")
	hs, conflicts := tb.Join([]Listing{
		{Member: m0, Epoch: m0.Epoch(), Objects: []object.Object{listed(a, 10, "fp")}},
		{Member: m1, Epoch: m1.Epoch(), Objects: []object.Object{listed(a, 11, "")}},
		{Member: m2, Epoch: m2.Epoch()},
	})
	if len(conflicts) != 0 || len(hs) != 1 {
		t.Fatalf("Join = %v, conflicts %v; want one object, no conflict", hs, conflicts)
	}
	o, live := tb.Get(hs[0])
	if !live || string(o.Fingerprint()) != "fp" {
		t.Fatalf("the joined object: live=%v fingerprint=%q", live, o.Fingerprint())
	}
	if r := o.Ref(0); r == nil || r.Handle != 10 || r.Unverified {
		t.Errorf("m0's reference = %+v, want verified handle 10", r)
	}
	if r := o.Ref(1); r == nil || r.Handle != 11 || !r.Unverified {
		t.Errorf("m1's reference = %+v, want unverified handle 11", r)
	}
	if r := o.Ref(2); r == nil || !r.Absent {
		t.Errorf("m2's reference = %+v, want absent", r)
	}
}

// Two keys under one identity, on one member or on two, are a conflict:
// the object is left out of the result, for the caller to report.
func TestJoinLeavesConflictsOut(t *testing.T) {
	tb := New(func() int { return 2 })
	m0, m1 := newMember(t, "m0", 0), newMember(t, "m1", 1)
	a, b, c := key("a"), key("b"), key("c")
	hs, conflicts := tb.Join([]Listing{
		{Member: m0, Epoch: m0.Epoch(), Objects: []object.Object{
			listed(a, 1, "fa"), listed(a, 2, "other"), listed(b, 3, "fb"), listed(c, 4, "fc"),
		}},
		{Member: m1, Epoch: m1.Epoch(), Objects: []object.Object{
			listed(b, 5, "fb2"), listed(c, 6, "fc"),
		}},
	})
	if len(hs) != 1 {
		t.Fatalf("Join returned %d handles, want only c's", len(hs))
	}
	if o, _ := tb.Get(hs[0]); o.Identity().Label != "c" {
		t.Fatalf("Join returned %q, want c", o.Identity().Label)
	}
	got := map[string]string{}
	for _, x := range conflicts {
		got[x.Object.Identity().Label] = x.Member.Name() + ":" + string(x.A) + "/" + string(x.B)
	}
	want := map[string]string{"a": "m0:fa/other", "b": "m1:fb/fb2"}
	if len(got) != len(want) || got["a"] != want["a"] || got["b"] != want["b"] {
		t.Fatalf("conflicts = %v, want %v", got, want)
	}
}
