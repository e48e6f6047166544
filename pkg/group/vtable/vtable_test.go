package vtable

import (
	"testing"

	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

func key(label string) object.Identity {
	return object.Identity{Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_EC, ID: []byte{1}, Label: label}
}

func newMember(t *testing.T, name string, index int) *member.Member {
	t.Helper()
	m, err := member.New(member.Config{Name: name, Index: index}, nil, member.Failed, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A token object is one entry per identity, under a handle that is never
// 0 and never given again once the object is removed.
func TestInternRemoveRekey(t *testing.T) {
	tb := New(func() int { return 1 })
	a, created := tb.Intern(key("a"))
	if !created || a.Handle == 0 {
		t.Fatalf("first Intern: created=%v handle=%d, want a new object with a non-zero handle", created, a.Handle)
	}
	if again, created := tb.Intern(key("a")); created || again != a {
		t.Fatalf("second Intern of the same identity: created=%v, same object=%v; want the first entry", created, again == a)
	}
	tb.Rekey(a, key("b"))
	if o, created := tb.Intern(key("b")); created || o != a {
		t.Fatalf("after Rekey the new identity finds a new entry (created=%v)", created)
	}
	if _, created := tb.Intern(key("a")); !created {
		t.Fatal("after Rekey the old identity still finds the object")
	}
	tb.Remove(a)
	if _, live := tb.Get(a.Handle); live {
		t.Fatal("Get finds a removed object live")
	}
	b, _ := tb.Intern(key("b"))
	if b == a || b.Handle == a.Handle {
		t.Fatalf("an object made after Remove took the removed handle %d", a.Handle)
	}
}

// A reference is valid for one member epoch, the array grows for a member
// index beyond the width the object was made with, and an unverified
// reference is not a cached one until Verified.
func TestRefsByEpoch(t *testing.T) {
	tb := New(func() int { return 1 })
	o, _ := tb.Intern(key("a"))
	m := newMember(t, "m5", 5)
	if _, ok := o.Cached(m); ok {
		t.Fatal("Cached before anything was set")
	}
	o.SetUnverified(5, m.Epoch(), 42)
	r := o.Ref(5)
	if r == nil || !r.Unverified || r.Handle != 42 {
		t.Fatalf("Ref(5) = %+v, want unverified handle 42", r)
	}
	o.Verified(5, r)
	if h, ok := o.Cached(m); !ok || h != 42 || o.Ref(5).Unverified {
		t.Fatalf("after Verified: Cached = %d, %v; Ref = %+v", h, ok, o.Ref(5))
	}
	m.BumpEpoch()
	if _, ok := o.Cached(m); ok {
		t.Fatal("a handle of the member's previous epoch is still cached")
	}
	o.SetAbsent(5, m.Epoch())
	if _, ok := o.Cached(m); ok {
		t.Fatal("an absent reference is cached")
	}
	o.ForgetAbsent()
	if o.Ref(5) != nil {
		t.Fatalf("ForgetAbsent left %+v", o.Ref(5))
	}
}

// A session object is found by its physical handle on its member until it
// is removed or the member is purged.
func TestSessionObjects(t *testing.T) {
	tb := New(func() int { return 2 })
	m0, m1 := newMember(t, "m0", 0), newMember(t, "m1", 1)
	s := tb.AddSessionObject(key("s"))
	tb.SetSessionPhys(s, m0, 7)
	tb.SetSessionPhys(s, m1, 9)
	if got := tb.SessionObjectAt(m0, 7); got != s {
		t.Fatal("SessionObjectAt(m0, 7) does not find the session object")
	}
	if got := tb.SessionObjectAt(m0, 9); got != nil {
		t.Fatal("SessionObjectAt finds the object at another member's handle")
	}
	tb.Purge(1)
	if got := tb.SessionObjectAt(m1, 9); got != nil {
		t.Fatal("SessionObjectAt finds the object on a purged member")
	}
	tb.Remove(s)
	if got := tb.SessionObjectAt(m0, 7); got != nil {
		t.Fatal("SessionObjectAt finds a removed object")
	}
	if _, live := tb.Get(s.Handle); live {
		t.Fatal("Get finds a removed session object live")
	}
}
