package ha

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/recover"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/miekg/pkcs11"
)

// A member that missed a change is not returned to rotation while the
// only members holding that change are down: the soak saw a member come
// back first after every member failed and serve without a key made
// while it was away (a destroy it missed would have been served again the
// same way). Both members are real tokens behind p11-kit servers: b's
// server is killed, an object is made through the group (on a only, b is
// marked behind there), a's server is killed, b's restarted. b's recovery
// must fail, naming a, and the group must not answer a search for the
// object with nothing. Once a is back, b is caught up and both serve it.
//
// When a is gone for good instead, the operator removes it from the group
// and b returns as it is.
func TestMissedChangesKeepAMemberOutWhileTheirHoldersAreDown(t *testing.T) {
	for _, holder := range []string{"back", "removed"} {
		t.Run("holder "+holder, func(t *testing.T) { missedWhileAway(t, holder == "removed") })
	}
}

func missedWhileAway(t *testing.T, removeHolder bool) {
	srvs := []*testhsm.Served{testhsm.Serve(t, "away-a"), testhsm.Serve(t, "away-b")}
	toks := []testhsm.Token{srvs[0].Token(), srvs[1].Token()}
	a, b := toks[0].Name, toks[1].Name
	r := newRig(t, rigOpts{toks: toks, noDomain: true})
	ctx := testCtx(t)
	s := r.session()

	srvs[1].Kill()
	if err := dataObject(ctx, s, "made-while-b-away"); err != nil {
		t.Fatalf("create with b's server killed: %v", err)
	}
	if st := r.state(b); st.Serving() {
		t.Fatalf("b is %v after its copy failed", st)
	}
	srvs[0].Kill()
	if _, err := s.Find(ctx, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_LABEL, "made-while-b-away")}); err == nil {
		t.Fatal("a search with every server killed succeeded")
	}
	r.ev.waitFor(t, "group down", func() bool { return len(r.ev.groupEvents(group.GroupDown, "")) == 1 })

	srvs[1].Restart(t)
	refused := func() (recover.Event, bool) {
		r.ev.mu.Lock()
		defer r.ev.mu.Unlock()
		for _, e := range r.ev.rec {
			if e.Member == b && e.Kind == recover.AttemptFailed && e.Err != nil && strings.Contains(e.Err.Error(), "behind") {
				return e, true
			}
		}
		return recover.Event{}, false
	}
	r.ev.waitFor(t, "b's recovery refused, or b back", func() bool {
		_, ok := refused()
		return ok || r.state(b).Serving()
	})
	if st := r.state(b); st.Serving() {
		t.Fatalf("b is %v, back in rotation without the object made while it was away (only a, down, holds it)", st)
	}
	e, _ := refused()
	if !strings.Contains(e.Err.Error(), a) {
		t.Fatalf("b's recovery failed with %q, which does not name %s, the member holding what it missed", e.Err, a)
	}
	_, err := s.Find(ctx, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_LABEL, "made-while-b-away")})
	if code := group.CodeOf(err); err == nil || code == pkcs11.CKR_OK {
		t.Fatal("the group answered a search while only b, which lacks the object, was up")
	}

	if removeHolder {
		if err := r.g.Engine().RemoveMember(ctx, a); err != nil {
			t.Fatalf("remove %s: %v", a, err)
		}
		r.ev.waitFor(t, "b back once a is removed", func() bool { return r.state(b) == member.Active })
		return
	}
	srvs[0].Restart(t)
	r.ev.waitFor(t, "a and b back", func() bool { return r.state(a) == member.Active && r.state(b) == member.Active })
	err = r.g.Engine().Login(ctx, pkcs11.CKU_USER, secret.PINFromString(testhsm.UserPIN))
	if err != nil && !errors.Is(err, group.ErrAlreadyLoggedIn) {
		t.Fatalf("login after the outage: %v", err)
	}
	if got := findLabelled(t, direct(t, toks[1]), "made-while"); !slices.Equal(got, []string{"made-while-b-away"}) {
		t.Fatalf("b holds %v after its catch-up, want the object made while it was away", got)
	}
}
