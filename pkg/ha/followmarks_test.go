package ha

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
)

// Issue 15: a long-lived process follows the marks, not only at its
// login. Host A runs on with m2 in rotation; host B, to which m2 is away,
// destroys key K, which leaves m2 marked behind on m0 and m1. Within one
// interval host A takes m2 out, catches it up (K destroyed there, from the
// tombstones on the members) and puts it back: no signature with K
// reaches m2 again, and m2 ends without K.
func TestLongLivedHostFollowsBehindMarks(t *testing.T) {
	h := newHosts(t, 3)
	ctx := testCtx(t)
	faults := slottest.NewFaults()
	ev := newRecorder()
	hostA, err := Open(ctx, h.cfg, h.set, Options{StateDir: t.TempDir(), Interceptor: faults, Events: ev})
	if err != nil {
		t.Fatalf("Open host A: %v", err)
	}
	t.Cleanup(func() { hostA.Close() })
	if err := hostA.Engine().Login(ctx, pkcs11.CKU_USER, secret.PINFromString(testhsm.UserPIN)); err != nil {
		t.Fatalf("host A login: %v", err)
	}
	sa := openSession(t, hostA)
	_, keyA := genEC(t, sa, "doomed")
	if err := signOnce(ctx, sa, keyA); err != nil {
		t.Fatalf("host A signs with K: %v", err)
	}
	away := h.toks[2].Name

	hostB := h.open(nil)
	if err := hostB.Engine().FailMember(away, errors.New("test: away from host B only")); err != nil {
		t.Fatal(err)
	}
	sb := openSession(t, hostB)
	for _, class := range []uint{pkcs11.CKO_PRIVATE_KEY, pkcs11.CKO_PUBLIC_KEY} {
		hs, err := sb.Find(ctx, []*pkcs11.Attribute{a(pkcs11.CKA_CLASS, class), a(pkcs11.CKA_LABEL, "doomed")})
		if err != nil || len(hs) != 1 {
			t.Fatalf("host B finds K (class %d): %v %v", class, hs, err)
		}
		if err := sb.DestroyObject(ctx, hs[0]); err != nil {
			t.Fatalf("host B destroys K: %v", err)
		}
	}
	destroyed := time.Now()

	// Host A: m2 out as behind, caught up, back in rotation without K.
	behind := func() []group.Event {
		var out []group.Event
		for _, e := range ev.groupEvents(group.MemberFailed, away) {
			if e.Err != nil && strings.Contains(e.Err.Error(), "behind") {
				out = append(out, e)
			}
		}
		return out
	}
	// Host B's destroy must not have reached m2. K is still there, or host
	// A already took m2 out as behind (its interval may fire first on a
	// loaded machine) and is catching it up: the event comes before the
	// catch-up deletes K.
	if got := findLabelled(t, direct(t, h.toks[2]), "doomed"); len(got) != 2 && len(behind()) == 0 {
		t.Fatalf("%s, away from host B, holds %v and host A has not taken it out as behind: host B's destroy reached it", away, got)
	}
	ev.waitFor(t, "host A takes "+away+" out as behind and catches it up", func() bool {
		m, _ := hostA.Engine().Member(away)
		return len(behind()) > 0 && m.State() == member.Active && len(findLabelled(t, direct(t, h.toks[2]), "doomed")) == 0
	})
	// One tick of the interval, plus the tick's own bounded read.
	if took, limit := behind()[0].Time.Sub(destroyed), h.set.Interval+h.set.CommandTimeout; took > limit {
		t.Errorf("host A took %v to take %s out, want within one interval (%v) and its read", took, away, h.set.Interval)
	}
	before := faults.Calls(away, slot.OpSign)
	if err := signOnce(ctx, sa, keyA); err == nil {
		t.Errorf("host A still signs with K, which host B destroyed")
	}
	if n := faults.Calls(away, slot.OpSign) - before; n != 0 {
		t.Errorf("%d signatures with K reached %s after host B destroyed it", n, away)
	}
	for _, tok := range h.toks {
		if got := findLabelled(t, direct(t, tok), "doomed"); len(got) != 0 {
			t.Errorf("%s still holds %v", tok.Name, got)
		}
	}
}
