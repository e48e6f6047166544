package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/group"
)

// TestKeptStallOutlivesTheAgent: an unresolved tombstone stall kept in the
// state directory is shown by the next agent, also when the record is
// damaged (only a synchronisation may clear a stall), and a reload of the
// group's settings keeps it.
func TestKeptStallOutlivesTheAgent(t *testing.T) {
	toks := testhsm.Take(t, 1)
	state := t.TempDir()
	kept := filepath.Join(state, "1000001", "tombstone-stall.json")
	if err := os.MkdirAll(filepath.Dir(kept), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kept, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := "[agent]\nsocket = \"$SOCK\"\nstate_dir = \"" + state + "\"\n\n[[group]]\nlabel = \"g\"\nserial = \"1000001\"\n" + memberTOML("a", toks[0], pinFile(t), false)
	ta := startAgent(t, base)
	stall := func() *agent.TombstoneStall {
		t.Helper()
		rep, err := ta.client.ListGroups(t.Context(), "g")
		if err != nil {
			t.Fatal(err)
		}
		return rep.Groups[0].TombstoneStall
	}
	if st := stall(); st == nil || !strings.Contains(st.Detail, "cannot be read") {
		t.Fatalf("a damaged kept stall: listgroups shows %+v, want a stall saying the record cannot be read", st)
	}
	ta.d.noteStall(agent.Event{Time: time.Now(), Group: "g", Member: "a", Event: string(group.TombstoneStalled), Detail: "stalled in mid-write"})
	if b, err := os.ReadFile(kept); err != nil || !strings.Contains(string(b), "stalled in mid-write") {
		t.Fatalf("kept stall after the event: %q, %v", b, err)
	}
	cfg, err := os.ReadFile(ta.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ta.cfg, []byte(strings.Replace(string(cfg), "[[group]]", "[ha]\ninterval = \"2m\"\n\n[[group]]", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ta.d.Reload(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st := stall(); st == nil || st.Detail != "stalled in mid-write" || st.Member != "a" {
		t.Errorf("after a reload: listgroups shows stall %+v, want the one noted", st)
	}
}
