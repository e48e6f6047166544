package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
)

// TestStallKeptAcrossRuns: a stall written by one run is read by the next
// (a restart), a resolved one is gone, and a record that cannot be read is
// a stall still, naming its file — never a silent "none".
func TestStallKeptAcrossRuns(t *testing.T) {
	d := &Daemon{}
	d.agent.StateDir = t.TempDir()
	const group = "signing/α" // any character a label may hold
	if st := d.keptStall(group); st != nil {
		t.Fatalf("a fresh state directory holds a stall: %+v", st)
	}
	want := agent.TombstoneStall{Time: time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC), Member: "hsm-a", Detail: "13h0m0s", Program: "app", PID: 42}
	if err := d.keepStall(group, &want); err != nil {
		t.Fatal(err)
	}
	if got := d.keptStall(group); got == nil || *got != want {
		t.Fatalf("kept stall %+v, want %+v", got, want)
	}
	if err := d.keepStall(group, nil); err != nil {
		t.Fatal(err)
	}
	if st := d.keptStall(group); st != nil {
		t.Fatalf("a resolved stall is still kept: %+v", st)
	}
	path := d.stallPath(group)
	if err := os.WriteFile(path, []byte("{half"), 0o600); err != nil {
		t.Fatal(err)
	}
	st := d.keptStall(group)
	if st == nil || !strings.Contains(st.Detail, path) {
		t.Fatalf("an unreadable record reads as %+v, want a stall naming %s", st, path)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".stall-*")); len(leftovers) != 0 {
		t.Errorf("temporary files left: %v", leftovers)
	}
}
