package daemon

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/agent"
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
