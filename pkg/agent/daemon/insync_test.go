package daemon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/ha"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync"
	"github.com/miekg/pkcs11"
)

// Issue 15: listgroups --check's NEEDS SYNC (through haagent and without it),
// synchronize --check, the hagroup_objects_out_of_sync metric and pkg/ha's
// Status (the Go API of a process on another host) say the same, in both
// directions (a member behind, a member ahead, a member holding an object
// twice, a member holding an object another host destroyed while it was
// away from that host), the moment the members change behind the agent's
// back (its periodic check is an hour away), and all say "in sync" once it
// is synchronised.
func TestStatusCheckAndMetricAgree(t *testing.T) {
	toks := testhsm.Take(t, 2)
	pin := pinFile(t)
	ta := startAgent(t, `[agent]
socket = "$SOCK"
state_dir = "$STATE"
metrics = "127.0.0.1:0"

[ha]
probe_interval = "1h"
interval = "1h"
retries = 0

[[group]]
label = "g"
serial = "1000015"
`+memberTOML("a", toks[0], pin, false)+memberTOML("b", toks[1], pin, false))
	cfg, err := config.Load(ta.cfg)
	if err != nil {
		t.Fatal(err)
	}
	gcfg, _ := cfg.Group("g")
	set := cfg.Settings(gcfg)
	// Another host: its own state directory, the Go API, logged in.
	other, err := ha.Open(t.Context(), *gcfg, set, ha.Options{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	if err := other.Engine().Login(t.Context(), pkcs11.CKU_USER, secret.PINFromString(testhsm.UserPIN)); err != nil {
		t.Fatal(err)
	}
	direct := make([]*slot.Slot, 2)
	for i, tok := range toks {
		s, err := slot.Open(t.Context(), slot.Spec{Name: fmt.Sprint("direct-", i), Module: tok.Module, ModuleEnv: tok.ModuleEnv,
			TokenLabel: tok.Label, PIN: secret.PINFromString(tok.UserPIN), CommandTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		direct[i] = s
	}
	data := func(s *slot.Slot, label string) pkcs11.ObjectHandle {
		h, err := s.CreateObject(t.Context(), []*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
			pkcs11.NewAttribute(pkcs11.CKA_LABEL, label), pkcs11.NewAttribute(pkcs11.CKA_VALUE, []byte(label))})
		if err != nil {
			t.Fatalf("create %s on %s: %v", label, s.Name(), err)
		}
		return h
	}
	agree := func(step string, want []string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), deadline)
		defer cancel()
		rep, err := ta.client.CompareGroups(ctx, "g")
		if err != nil {
			t.Fatal(err)
		}
		var listed []string
		for _, m := range rep.Groups[0].Members {
			if m.NeedsSync {
				listed = append(listed, m.Name)
			}
		}
		check, err := ta.client.Synchronize(ctx, agent.SyncRequest{Group: "g", Check: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		var checked []string
		for _, d := range check.Differences {
			for _, m := range d.Members {
				if !slices.Contains(checked, m) {
					checked = append(checked, m)
				}
			}
		}
		slices.Sort(checked)
		var goAPI []string
		st := other.Status(ctx)
		for _, m := range st.Members {
			if m.NeedsSync {
				goAPI = append(goAPI, m.Name)
			}
		}
		// listgroups without haagent: what hactl runs (compareLocal).
		local := agent.GroupStatus{Members: []agent.MemberStatus{{Name: "a"}, {Name: "b"}}}
		counts, err := ha.CompareConfigured(ctx, *gcfg, set, "")
		local.SetSync(time.Now(), counts, err)
		var unagented []string
		for _, m := range local.Members {
			if m.NeedsSync {
				unagented = append(unagented, m.Name)
			}
		}
		body := scrape(t, ta.d.MetricsAddr())
		var metric []string
		for _, m := range []string{"a", "b"} {
			if v, ok := metricValue(body, "hagroup_objects_out_of_sync", m); !ok {
				t.Fatalf("%s: no hagroup_objects_out_of_sync for %s", step, m)
			} else if v > 0 {
				metric = append(metric, m)
			}
		}
		if !slices.Equal(listed, want) || !slices.Equal(rep.Groups[0].NeedsSync, nonNil(want)) || !slices.Equal(checked, want) ||
			check.InSync != (len(want) == 0) || !slices.Equal(metric, want) || !slices.Equal(goAPI, want) ||
			st.OutOfSync() != (len(want) > 0) || !slices.Equal(unagented, want) || !slices.Equal(local.NeedsSync, nonNil(want)) {
			t.Fatalf("%s: want %v out of sync; listgroups says %v (group: %v), synchronize --check %v (in sync %v: %v), the metric %v, "+
				"another host's Status %v (%s), listgroups without haagent %v",
				step, want, listed, rep.Groups[0].NeedsSync, checked, check.InSync, check.Differences, metric, goAPI, st.SyncError, unagented)
		}
		for _, m := range st.Members {
			if n := rep.Groups[0].Members[slices.IndexFunc(rep.Groups[0].Members, func(x agent.MemberStatus) bool { return x.Name == m.Name })].OutOfSync; n != m.OutOfSync {
				t.Errorf("%s: %s is out of sync by %d through haagent, by %d in another host's Status", step, m.Name, n, m.OutOfSync)
			}
		}
	}
	synchronize := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), deadline)
		defer cancel()
		if rep, err := ta.client.Synchronize(ctx, agent.SyncRequest{Group: "g"}, nil); err != nil || rep.Failed > 0 {
			t.Fatalf("synchronize: %v %+v", err, rep)
		}
	}

	agree("at the start", nil)
	data(direct[0], "behind")
	agree("b lacks an object", []string{"b"})
	synchronize()
	agree("synchronised", nil)
	data(direct[1], "ahead")
	agree("b holds an object a lacks", []string{"a"})
	synchronize()
	agree("synchronised again", nil)
	// A second copy of one version on b, as two hosts copying at once
	// would leave: plans used to count it once and say "in sync".
	hs, err := direct[0].FindObjects(t.Context(), []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_LABEL, "ahead")})
	if err != nil || len(hs) != 1 {
		t.Fatalf("find ahead on a: %v %v", hs, err)
	}
	if _, err := (&sync.Replicator{}).Replicate(t.Context(), direct[0], hs[0], sync.Target{Slot: direct[1], Absent: true}); err != nil {
		t.Fatal(err)
	}
	agree("b holds an object twice", []string{"b"})
	synchronize()
	agree("duplicate removed", nil)

	// The other host destroys an object while b is away from it only: b
	// still holds it, a tombstone on a says it is gone.
	if err := other.Engine().FailMember("b", errors.New("test: away from the other host")); err != nil {
		t.Fatal(err)
	}
	sess, err := other.Engine().OpenSession(t.Context(), pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	found, err := sess.Find(t.Context(), []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_LABEL, "behind")})
	if err != nil || len(found) != 1 {
		t.Fatalf("the other host finds behind: %v %v", found, err)
	}
	if err := sess.DestroyObject(t.Context(), found[0]); err != nil {
		t.Fatal(err)
	}
	if hs, err := direct[1].FindObjects(t.Context(), []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_LABEL, "behind")}); err != nil || len(hs) != 1 {
		t.Fatalf("b holds %v (%v); the test needs the destroyed object there", hs, err)
	}
	agree("b holds an object another host destroyed", []string{"b"})
	synchronize()
	if _, err := other.Recover(t.Context(), "b"); err != nil {
		t.Fatalf("the other host recovers b: %v", err)
	}
	agree("the destroy applied on b", nil)
}

func nonNil(ss []string) []string {
	if ss == nil {
		return []string{}
	}
	return ss
}

// Issue 32: listgroups shows the agent's last comparison of the members,
// with when it was made, rather than listing every member on each call; a
// difference made behind the agent's back shows at the next comparison
// (CompareGroups makes one now), and a comparison older than compareTTL is
// never shown: the agent compares again first.
func TestListgroupsShowsTheLastComparisonWithinItsBound(t *testing.T) {
	toks := testhsm.Take(t, 2)
	pin := pinFile(t)
	ta := startAgent(t, `[agent]
socket = "$SOCK"
state_dir = "$STATE"

[ha]
probe_interval = "1h"
interval = "1h"
retries = 0

[[group]]
label = "g"
serial = "1000032"
`+memberTOML("a", toks[0], pin, false)+memberTOML("b", toks[1], pin, false))
	list := func(step string, now bool, want []string) agent.GroupStatus {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), deadline)
		defer cancel()
		call := ta.client.ListGroups
		if now {
			call = ta.client.CompareGroups
		}
		rep, err := call(ctx, "g")
		if err != nil {
			t.Fatal(err)
		}
		gs := rep.Groups[0]
		if !slices.Equal(gs.NeedsSync, nonNil(want)) || gs.CompareError != "" {
			t.Fatalf("%s: needs sync %v (%s), want %v", step, gs.NeedsSync, gs.CompareError, want)
		}
		if age, err := time.ParseDuration(gs.ComparedAgo); err != nil || gs.ComparedAt.IsZero() || age > time.Since(gs.ComparedAt)+time.Second {
			t.Fatalf("%s: compared at %v, %q ago (%v): want when and how long ago", step, gs.ComparedAt, gs.ComparedAgo, err)
		}
		return gs
	}
	first := list("at the start", false, nil)

	direct, err := slot.Open(t.Context(), slot.Spec{Name: "direct", Module: toks[0].Module, ModuleEnv: toks[0].ModuleEnv,
		TokenLabel: toks[0].Label, PIN: secret.PINFromString(toks[0].UserPIN), CommandTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close() })
	if _, err := direct.CreateObject(t.Context(), []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, "behind"), pkcs11.NewAttribute(pkcs11.CKA_VALUE, []byte("behind"))}); err != nil {
		t.Fatal(err)
	}
	if gs := list("after a change behind the agent's back", false, nil); !gs.ComparedAt.Equal(first.ComparedAt) {
		t.Fatalf("listgroups compared again (at %v, first at %v): it must show the last comparison", gs.ComparedAt, first.ComparedAt)
	}
	now := list("compared now", true, []string{"b"})
	if !now.ComparedAt.After(first.ComparedAt) {
		t.Fatalf("CompareGroups compared at %v, not after %v", now.ComparedAt, first.ComparedAt)
	}
	if gs := list("after CompareGroups", false, []string{"b"}); !gs.ComparedAt.Equal(now.ComparedAt) {
		t.Fatalf("listgroups shows the comparison of %v, want CompareGroups' of %v", gs.ComparedAt, now.ComparedAt)
	}

	// The members change back, and the agent's checks stall past the bound:
	// listgroups must not say "b needs sync" (nor anything) from that
	// comparison, however recent its answer looks.
	hs, err := direct.FindObjects(t.Context(), []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_LABEL, "behind")})
	if err != nil || len(hs) != 1 {
		t.Fatalf("find behind: %v %v", hs, err)
	}
	if err := direct.DestroyObject(t.Context(), hs[0]); err != nil {
		t.Fatal(err)
	}
	ttl := compareTTL(config.Settings{Interval: time.Hour})
	stale := ta.d.AgeComparison("g", ttl+time.Second)
	if gs := list("a comparison older than the bound", false, nil); time.Since(gs.ComparedAt) > ttl || !gs.ComparedAt.After(stale) {
		t.Fatalf("listgroups showed a comparison made at %v (bound %v, the stale one at %v)", gs.ComparedAt, ttl, stale)
	}

	// Stale again, and the new comparison does not finish before the
	// request gives up (a member that hangs): every member needs
	// synchronisation, and the answer says why and how old the last was.
	ta.d.AgeComparison("g", ttl+time.Second)
	release := ta.d.HoldComparison("g")
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	rep, err := ta.d.Groups(ctx, "g", false)
	cancel()
	release()
	if err != nil {
		t.Fatal(err)
	}
	if gs := rep.Groups[0]; !slices.Equal(gs.NeedsSync, []string{"a", "b"}) || !gs.ComparedAt.IsZero() ||
		!strings.Contains(gs.CompareError, "did not finish (the last: 3h0m") {
		t.Fatalf("with no comparison within the bound: needs sync %v, compared at %v, error %q", gs.NeedsSync, gs.ComparedAt, gs.CompareError)
	}
}
