package daemon

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/config"
)

func (ta *testAgent) engine(label string) Engine {
	ta.d.mu.RLock()
	defer ta.d.mu.RUnlock()
	if gr := ta.d.groups[label]; gr != nil {
		return gr.engine()
	}
	return nil
}

func (ta *testAgent) reload(t *testing.T, cfg string) []string {
	t.Helper()
	cfg = strings.NewReplacer("$SOCK", ta.sock, "$STATE", ta.sock+".state").Replace(cfg)
	if err := os.WriteFile(ta.cfg, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := ta.d.Reload(t.Context())
	if err != nil {
		t.Fatalf("Reload: %v", err)
	}
	return res.Changes
}

func hasLine(lines []string, sub string) bool {
	return slices.ContainsFunc(lines, func(s string) bool { return strings.Contains(s, sub) })
}

// A reload that adds, removes and re-roles members changes the running
// group in place: the engine (and with it the work on the members that
// did not change) is the same before and after; a change the engine
// cannot take (command_timeout) reopens the group.
func TestReloadChangesMembersInPlace(t *testing.T) {
	toks := testhsm.Take(t, 3)
	pin := pinFile(t)
	head := "[agent]\nsocket = \"$SOCK\"\nstate_dir = \"$STATE\"\n\n[[group]]\nlabel = \"g\"\nserial = \"1000001\"\n"
	ta := startAgent(t, head+memberTOML("a", toks[0], pin, false)+memberTOML("b", toks[1], pin, false))
	eng := ta.engine("g")
	if eng == nil {
		t.Fatal("group g is not open")
	}
	state := func(name string) string {
		rep, err := ta.client.ListGroups(t.Context(), "g")
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range rep.Groups[0].Members {
			if m.Name == name {
				return m.State
			}
		}
		return "absent"
	}

	lines := ta.reload(t, head+memberTOML("a", toks[0], pin, false)+memberTOML("b", toks[1], pin, true)+memberTOML("c", toks[2], pin, false))
	if !hasLine(lines, "c: member_added (caught up") || !hasLine(lines, "b: member_standby") {
		t.Fatalf("reload changes: %q", lines)
	}
	if ta.engine("g") != eng {
		t.Fatal("the group was reopened for a member change")
	}
	if s := state("c"); s != agent.StateActive {
		t.Errorf("added member c is %s", s)
	}
	if s := state("b"); s != "standby" {
		t.Errorf("member b made standby is %s", s)
	}

	lines = ta.reload(t, head+memberTOML("c", toks[2], pin, false)+memberTOML("a", toks[0], pin, false))
	if !hasLine(lines, "b: member_removed") || !hasLine(lines, "order: c, a") {
		t.Fatalf("reload changes: %q", lines)
	}
	if ta.engine("g") != eng {
		t.Fatal("the group was reopened for a removal")
	}
	if s := state("b"); s != "absent" {
		t.Errorf("removed member b is %s", s)
	}
	rep, err := ta.client.ListGroups(t.Context(), "g")
	if err != nil || len(rep.Groups[0].Members) != 2 || !rep.Groups[0].Members[0].Primary || rep.Groups[0].Members[0].Name != "c" {
		t.Fatalf("after the removal and reorder: %+v, %v", rep, err)
	}

	lines = ta.reload(t, head+"command_timeout = \"7s\"\n"+memberTOML("c", toks[2], pin, false)+memberTOML("a", toks[0], pin, false))
	if !hasLine(lines, "reopened") || ta.engine("g") == eng {
		t.Fatalf("a new command_timeout did not reopen the group: %q", lines)
	}
}

// listgroups carries the engine's recovery figures: a served member that
// dies is retried retries times, then shown as given up with no attempts
// left and why the last attempt failed; a manual recovery after its server
// is back clears that.
func TestListGroupsRecoveryFigures(t *testing.T) {
	local := testhsm.Take(t, 1)[0]
	served := testhsm.ServeRemote(t, "figures-b")
	pin := pinFile(t)
	ta := startAgent(t, `[agent]
socket = "$SOCK"
state_dir = "$STATE"

[ha]
probe_interval = "100ms"
interval = "1s"
retries = 1

[[group]]
label = "g"
serial = "1000001"
`+memberTOML("a", local, pin, false)+memberTOML("b", served.Token(), pin, false))
	member := func(name string) agent.MemberStatus {
		rep, err := ta.client.ListGroups(t.Context(), "g")
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range rep.Groups[0].Members {
			if m.Name == name {
				return m
			}
		}
		t.Fatalf("no member %s in %+v", name, rep)
		return agent.MemberStatus{}
	}
	b := member("b")
	if b.State != agent.StateActive || b.AttemptsLeft == nil || *b.AttemptsLeft != 1 || b.GaveUp || b.NeedsSync || b.Since.IsZero() {
		t.Fatalf("member b before the kill: %+v", b)
	}

	served.Kill()
	waitFor(t, "member b given up", func() (bool, string) {
		b = member("b")
		return b.GaveUp, fmt.Sprintf("%+v", b)
	})
	if b.State == agent.StateActive || b.Attempts != 1 || b.AttemptsLeft == nil || *b.AttemptsLeft != 0 ||
		b.LastAttempt.IsZero() || b.LastAttemptError == "" || !strings.Contains(b.LastError, b.LastAttemptError) {
		t.Errorf("member b after its attempts ran out: %+v", b)
	}

	served.Restart(t)
	res, err := ta.client.Recover(t.Context(), agent.RecoverRequest{Group: "g", Member: "b"}, nil)
	if err != nil || len(res.Members) != 1 || !res.Members[0].OK {
		t.Fatalf("manual recovery: %+v, %v", res, err)
	}
	waitFor(t, "member b active again", func() (bool, string) {
		b = member("b")
		return b.State == agent.StateActive, fmt.Sprintf("%+v", b)
	})
	if b.GaveUp || b.LastAttemptError != "" || b.OutOfSync != 0 || b.LastError != "" {
		t.Errorf("member b after the manual recovery (no last error from before it came back): %+v", b)
	}
}

// An object a member lists but will not describe (SoftHSM's half-made
// object) is a difference synchronize reports, by member: the group is not
// in sync, and nothing is copied or deleted for it.
func TestSynchronizeReportsUnreadableObject(t *testing.T) {
	toks := testhsm.Take(t, 2)
	pin := pinFile(t)
	ta := startAgent(t, `[agent]
socket = "$SOCK"
state_dir = "$STATE"

[[group]]
label = "g"
serial = "1000001"
`+memberTOML("a", toks[0], pin, false)+memberTOML("b", toks[1], pin, false))
	testhsm.PlantUnreadableObject(t, toks[1])
	for _, check := range []bool{true, false} {
		rep, err := ta.client.Synchronize(t.Context(), agent.SyncRequest{Group: "g", Check: check}, nil)
		if err != nil {
			t.Fatalf("synchronize (check %v): %v", check, err)
		}
		var found []agent.Difference
		for _, d := range rep.Differences {
			if d.Kind == "unreadable" {
				found = append(found, d)
			}
		}
		if rep.InSync || len(found) != 1 || !slices.Equal(found[0].Members, []string{"b"}) ||
			!strings.Contains(found[0].Detail, "CKR_ATTRIBUTE_VALUE_INVALID") || rep.Applied != 0 {
			t.Fatalf("synchronize (check %v) with an unreadable object on b: %+v; want it reported on b, not in sync, nothing applied", check, rep)
		}
	}
}

// The periodic synchronisation check runs every interval, but not every
// second when the recovery interval is that short (soak: interval 1s made
// haagent list every object of every member every second).
func TestSyncCheckPeriod(t *testing.T) {
	for _, c := range []struct {
		interval, want time.Duration
	}{
		{time.Second, minSyncCheckEvery},
		{0, config.DefaultInterval},
		{5 * time.Minute, 5 * time.Minute},
	} {
		if got := syncCheckEvery(config.Settings{Interval: c.interval}); got != c.want {
			t.Errorf("interval %v: check every %v, want %v", c.interval, got, c.want)
		}
	}
}
