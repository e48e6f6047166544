package ha

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/recover"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/hagroup/hagroup/pkg/sync/state"
	"github.com/hagroup/hagroup/pkg/sync/tombstone"
	"github.com/miekg/pkcs11"
)

// Tests of the group state the members keep for every host: two Group
// values with two state directories over the same tokens are two hosts.

// hosts is one group's configuration over toks, opened as many times as a
// test asks, each time with a state directory of its own.
type hosts struct {
	t    *testing.T
	cfg  config.Group
	set  config.Settings
	toks []testhsm.Token
}

func newHosts(t *testing.T, n int) *hosts {
	toks := testhsm.Take(t, n)
	cfg := groupOn(t, toks)
	set := config.Defaults()
	set.CommandTimeout = 10 * time.Second
	set.Interval = time.Second
	set.Retries = 0 // recovery only when a test asks
	return &hosts{t: t, cfg: cfg, set: set, toks: toks}
}

// open opens the group as a fresh host: its own state directory, logged in.
func (h *hosts) open(ic slot.Interceptor) *Group {
	h.t.Helper()
	ctx := testCtx(h.t)
	g, err := Open(ctx, h.cfg, h.set, Options{StateDir: h.t.TempDir(), Interceptor: ic})
	if err != nil {
		h.t.Fatalf("Open: %v", err)
	}
	h.t.Cleanup(func() { g.Close() })
	if err := g.Engine().Login(ctx, pkcs11.CKU_USER, secret.PINFromString(testhsm.UserPIN)); err != nil {
		h.t.Fatalf("Login: %v", err)
	}
	return g
}

func openSession(t testing.TB, g *Group) *group.Session {
	t.Helper()
	s, err := g.Engine().OpenSession(testCtx(t), pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// memberTombstones reads the tombstones one token holds, directly, as a
// process on a third host with nothing in memory would.
func memberTombstones(t testing.TB, serial string, tok testhsm.Token) *tombstone.Set {
	t.Helper()
	s := direct(t, tok)
	sh := tombstone.NewShared(&tombstone.Memory{}, serial, tombstone.SharedOptions{
		OnError: func(m string, err error) { t.Errorf("member %s: %v", m, err) },
	})
	sh.SetMembers(func(bool) []*slot.Slot { return []*slot.Slot{s} })
	set, err := sh.Snapshot(testCtx(t))
	if err != nil {
		t.Fatalf("tombstones on %s: %v", tok.Name, err)
	}
	return set
}

// The first finding: host A destroys a key while m2 is away; m2
// comes back and host B, which never saw the destroy, recovers it and
// synchronizes. The key used to be copied back to every member. It must
// stay gone, and host A, asked afterwards, must find nothing to do.
func TestDestroyOnOneHostStaysGoneWhenAnotherSynchronizes(t *testing.T) {
	h := newHosts(t, 3)
	ctx := testCtx(t)
	hostA := h.open(nil)
	sa := openSession(t, hostA)
	pub, priv := genEC(t, sa, "doomed")
	genEC(t, sa, "kept")
	away := h.toks[2].Name
	if err := hostA.Engine().FailMember(away, errors.New("test: away")); err != nil {
		t.Fatal(err)
	}
	for _, o := range []group.ObjectHandle{priv, pub} {
		if err := sa.DestroyObject(ctx, o); err != nil {
			t.Fatalf("host A destroys: %v", err)
		}
	}
	if got := findLabelled(t, direct(t, h.toks[2]), "doomed"); len(got) != 2 {
		t.Fatalf("%s, away during the destroy, holds %v; the test needs the pair there", away, got)
	}

	hostB := h.open(nil) // a fresh host: its own, empty, state directory
	// Its login found the member behind (host A's marks) and caught it up
	// before returning, with the tombstones on the members: the pair is
	// gone from it, not copied back.
	if m, _ := hostB.Engine().Member(away); m.State() != member.Active {
		t.Fatalf("%s is %v after host B's login, want caught up and active", away, m.State())
	}
	rep, err := hostB.Synchronize(ctx, recover.SyncOptions{})
	if err != nil {
		t.Fatalf("host B synchronizes: %v", err)
	}
	if len(rep.NotServing) != 0 {
		t.Fatalf("host B's synchronize left out %v", rep.NotServing)
	}
	for _, tok := range h.toks {
		got := findLabelled(t, direct(t, tok), "")
		sort.Strings(got)
		if fmt.Sprint(got) != "[kept kept]" {
			t.Errorf("%s holds %v after host B's recovery and synchronize (plan %v), want only the kept pair", tok.Name, got, rep.Plan.Actions)
		}
	}
	check, err := hostA.Synchronize(ctx, recover.SyncOptions{Check: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, act := range check.Plan.Actions {
		if act.Member != away { // A still holds m2 failed; it is not compared
			t.Errorf("host A plans %v after host B's synchronize", act)
		}
	}
	// The member that was away now holds the tombstones too: a host
	// that reaches only it knows of the destroy.
	if set := memberTombstones(t, h.cfg.Serial, h.toks[2]); set.Len() != 2 {
		t.Errorf("%s holds %d tombstones after the synchronize, want the 2 of the pair", away, set.Len())
	}
}

// Two hosts destroy at the same moment, round after round: every destroy
// has its tombstone on every member, none lost to the other host's write.
func TestConcurrentDestroysOnTwoHostsLoseNoTombstone(t *testing.T) {
	h := newHosts(t, 2)
	ctx := testCtx(t)
	hostA, hostB := h.open(nil), h.open(nil)
	sa, sb := openSession(t, hostA), openSession(t, hostB)
	const rounds, perHost = 8, 3
	var want []string
	for r := range rounds {
		var ha, hb []group.ObjectHandle
		for i := range perHost {
			for _, side := range []struct {
				s   *group.Session
				out *[]group.ObjectHandle
				tag string
			}{{sa, &ha, "a"}, {sb, &hb, "b"}} {
				label := fmt.Sprintf("r%d-%s%d", r, side.tag, i)
				o, err := side.s.CreateObject(ctx, dataTemplate(label))
				if err != nil {
					t.Fatal(err)
				}
				*side.out = append(*side.out, o)
				want = append(want, label)
			}
		}
		// Every destroy of the round at once, from both hosts: both
		// write the tombstone objects of the same members together.
		start := make(chan struct{})
		var wg sync.WaitGroup
		for _, side := range []struct {
			s  *group.Session
			hs []group.ObjectHandle
		}{{sa, ha}, {sb, hb}} {
			for _, o := range side.hs {
				wg.Go(func() {
					<-start
					if err := side.s.DestroyObject(ctx, o); err != nil {
						t.Errorf("destroy: %v", err)
					}
				})
			}
		}
		close(start)
		wg.Wait()
	}
	sort.Strings(want)
	for _, tok := range h.toks {
		set := memberTombstones(t, h.cfg.Serial, tok)
		var got []string
		for _, ts := range set.All() {
			got = append(got, ts.Identity.Label)
		}
		sort.Strings(got)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s holds tombstones %v, want %v", tok.Name, got, want)
		}
	}
}

// The tombstone objects are the group's: the application sees none of
// them through the virtual slot, whatever it searches for, and the plan
// neither copies nor counts them.
func TestGroupStateIsHiddenFromTheApplication(t *testing.T) {
	h := newHosts(t, 2)
	ctx := testCtx(t)
	hostA := h.open(nil)
	s := openSession(t, hostA)
	o, err := s.CreateObject(ctx, dataTemplate("gone"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DestroyObject(ctx, o); err != nil {
		t.Fatal(err)
	}
	label := state.Label(h.cfg.Serial, tombstone.StateKind)
	for _, tok := range h.toks {
		objs, err := direct(t, tok).FindObjects(ctx, []*pkcs11.Attribute{a(pkcs11.CKA_APPLICATION, tombstone.Application)})
		if err != nil || len(objs) == 0 {
			t.Fatalf("%s holds no tombstone object (%v); the test needs one", tok.Name, err)
		}
	}
	for _, tmpl := range [][]*pkcs11.Attribute{
		nil,
		{a(pkcs11.CKA_CLASS, pkcs11.CKO_DATA)},
		{a(pkcs11.CKA_LABEL, label)},
		{a(pkcs11.CKA_APPLICATION, tombstone.Application)},
	} {
		hs, err := s.Find(ctx, tmpl)
		if err != nil {
			t.Fatal(err)
		}
		for _, fh := range hs {
			attrs, err := hostA.Engine().GetAttributes(ctx, fh, []uint{pkcs11.CKA_LABEL})
			if err == nil && strings.HasPrefix(string(attrs[0].Value), "hagroup-state:") {
				t.Errorf("search %v shows the group's state object %q", tmpl, attrs[0].Value)
			}
		}
		if len(tmpl) > 0 && tmpl[0].Type != pkcs11.CKA_CLASS && len(hs) > 0 {
			t.Errorf("search %v finds %d objects, want none", tmpl, len(hs))
		}
	}
	rep, err := hostA.Synchronize(ctx, recover.SyncOptions{Check: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Plan.Empty() {
		t.Errorf("plan over members holding group state: %v", rep.Plan.Actions)
	}
}

// The third finding: a member that missed changes (here: key
// pairs made while it was away) was used by a new process at once, and
// signatures failed with "key not found" while other members held the
// key. A fresh host must keep it out of rotation — no signature reaches
// it — until it is caught up, and once it is, a fresh host uses it again.
func TestFreshHostKeepsABehindMemberOutOfRotation(t *testing.T) {
	h := newHosts(t, 3)
	ctx := testCtx(t)
	hostA := h.open(nil)
	sa := openSession(t, hostA)
	away := h.toks[2].Name
	if err := hostA.Engine().FailMember(away, errors.New("test: away")); err != nil {
		t.Fatal(err)
	}
	const missed = 6
	for i := range missed {
		genEC(t, sa, fmt.Sprintf("missed-%d", i))
	}
	if got := findLabelled(t, direct(t, h.toks[2]), "missed-"); len(got) != 0 {
		t.Fatalf("%s holds %v; the test needs it without the keys", away, got)
	}

	// The login catches a behind member up before it returns; here its
	// token refuses the copies, so it cannot be, and must stay out.
	// (The faults go in after the open, whose wrap probe they would fail.)
	faults := slottest.NewFaults()
	ev := newRecorder()
	hostB, err := Open(ctx, h.cfg, h.set, Options{StateDir: t.TempDir(), Interceptor: faults, Events: ev}) // fresh: nothing of host A's in its state directory
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { hostB.Close() })
	faults.Fail(away, slot.OpUnwrapKey, pkcs11.Error(pkcs11.CKR_DEVICE_ERROR))
	faults.Fail(away, slot.OpCreateObject, pkcs11.Error(pkcs11.CKR_DEVICE_ERROR))
	if err := hostB.Engine().Login(ctx, pkcs11.CKU_USER, secret.PINFromString(testhsm.UserPIN)); err != nil {
		t.Fatalf("Login: %v", err)
	}
	if m, _ := hostB.Engine().Member(away); m.State() != member.Failed {
		t.Fatalf("%s is %v in a fresh host, want failed until it is caught up", away, m.State())
	}
	kept := ev.groupEvents(group.MemberFailed, away)
	if len(kept) == 0 || kept[0].Err == nil || !strings.Contains(kept[0].Err.Error(), "behind") {
		t.Errorf("%s was kept out with %v, want the reason (behind) first", away, kept)
	}
	sb := openSession(t, hostB)
	before := faults.Calls(away, slot.OpSign)
	for i := range missed {
		key := findKey(t, sb, fmt.Sprintf("missed-%d", i))
		for range 6 {
			if err := signOnce(ctx, sb, key); err != nil {
				t.Fatalf("host B signs with missed-%d: %v", i, err)
			}
		}
	}
	if n := faults.Calls(away, slot.OpSign) - before; n != 0 {
		t.Errorf("%d signatures reached %s, which lacks every key signed with", n, away)
	}

	faults.Heal(away)
	if _, err := hostB.Recover(ctx, away); err != nil {
		t.Fatalf("host B recovers %s: %v", away, err)
	}
	if got := findLabelled(t, direct(t, h.toks[2]), "missed-"); len(got) != 2*missed {
		t.Fatalf("%s holds %d of the %d missed objects after its recovery", away, len(got), 2*missed)
	}
	for _, tok := range h.toks[:2] {
		ks, err := state.ReadMarks(ctx, direct(t, tok), h.cfg.Serial)
		if err != nil {
			t.Fatal(err)
		}
		if len(ks) != 0 {
			t.Errorf("%s still holds %d behind marks after the recovery", tok.Name, len(ks))
		}
	}
	hostC := h.open(nil)
	if m, _ := hostC.Engine().Member(away); m.State() != member.Active {
		t.Errorf("%s is %v in a fresh host after its recovery, want active", away, m.State())
	}
}

// Hosts cut off from different members: A works on m0 while m1 is away
// from it, B on m1 while m0 is away from it. Each member now holds what
// the other lacks, and each is marked behind by the other. A fresh host
// that reaches both keeps both in service (failing either would lose
// what only it holds) and says so; recovering one merges both sides.
func TestPartitionedHostsMarkEachOther(t *testing.T) {
	h := newHosts(t, 2)
	ctx := testCtx(t)
	m0, m1 := h.toks[0].Name, h.toks[1].Name
	hostA, hostB := h.open(nil), h.open(nil)
	if err := hostA.Engine().FailMember(m1, errors.New("test: partitioned")); err != nil {
		t.Fatal(err)
	}
	if err := hostB.Engine().FailMember(m0, errors.New("test: partitioned")); err != nil {
		t.Fatal(err)
	}
	if err := dataObject(ctx, openSession(t, hostA), "side-a"); err != nil {
		t.Fatal(err)
	}
	if err := dataObject(ctx, openSession(t, hostB), "side-b"); err != nil {
		t.Fatal(err)
	}
	ev := newRecorder()
	hostC, err := Open(ctx, h.cfg, h.set, Options{StateDir: t.TempDir(), Events: ev})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hostC.Close() })
	if err := hostC.Engine().Login(ctx, pkcs11.CKU_USER, secret.PINFromString(testhsm.UserPIN)); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{m0, m1} {
		if m, _ := hostC.Engine().Member(name); m.State() != member.Active {
			t.Errorf("%s is %v in a fresh host, want active (each member holds what the other lacks)", name, m.State())
		}
	}
	if evs := ev.groupEvents(group.GroupStateFailed, ""); len(evs) != 1 || !strings.Contains(evs[0].Err.Error(), "synchronize") {
		t.Errorf("group_state_failed events %v, want one saying to synchronize", evs)
	}
	rep, err := hostC.Synchronize(ctx, recover.SyncOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range h.toks {
		got := findLabelled(t, direct(t, tok), "side-")
		sort.Strings(got)
		if fmt.Sprint(got) != "[side-a side-b]" {
			t.Errorf("%s holds %v after the synchronize (plan %v), want both sides", tok.Name, got, rep.Plan.Actions)
		}
		if ks, err := state.ReadMarks(ctx, direct(t, tok), h.cfg.Serial); err != nil || len(ks) != 0 {
			t.Errorf("%s holds behind marks %v after the members were made equal (%v)", tok.Name, ks, err)
		}
	}
}
