package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/member"
)

// fakeGroup is a statsSource whose first member's op count the test moves.
type fakeGroup struct{ ops atomic.Uint64 }

func (f *fakeGroup) Label() string { return "signing" }
func (f *fakeGroup) Members() []member.Snapshot {
	return []member.Snapshot{
		{Name: "hsm-a", State: member.Active, Ops: f.ops.Load()},
		{Name: "hsm-b", State: member.Failed, Since: time.Unix(1700000000, 0).UTC(), Errors: 3, Failovers: 1},
	}
}

func env(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

func readStats(t *testing.T, path string) []statsLine {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []statsLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l statsLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		lines = append(lines, l)
	}
	return lines
}

func TestStatsOffByDefault(t *testing.T) {
	w, err := startStats(env(nil), []statsSource{&fakeGroup{}})
	if w != nil || err != nil {
		t.Fatalf("startStats without %s = %v, %v; want nil, nil", statsFileEnv, w, err)
	}
	if err := w.stop(); err != nil {
		t.Fatalf("stop on a nil writer: %v", err)
	}
}

func TestStatsLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stats.jsonl")
	g := &fakeGroup{}
	g.ops.Store(5)
	w, err := startStats(env(map[string]string{statsFileEnv: path, statsIntervalEnv: "10ms"}), []statsSource{g})
	if err != nil {
		t.Fatal(err)
	}
	// Wait (with a deadline) for the ticker to have written past the first line.
	deadline := time.Now().Add(10 * time.Second)
	for len(readStats(t, path)) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than 3 lines in %v", 10*time.Second)
		}
		time.Sleep(5 * time.Millisecond)
	}
	g.ops.Store(42)
	if err := w.stop(); err != nil {
		t.Fatal(err)
	}
	if err := w.stop(); err != nil {
		t.Fatalf("second stop: %v", err)
	}
	lines := readStats(t, path)
	first, last := lines[0], lines[len(lines)-1]
	if first.Group != "signing" || first.PID != os.Getpid() || len(first.Members) != 2 {
		t.Fatalf("first line %+v", first)
	}
	if first.Members[0].Ops != 5 {
		t.Errorf("first line counts %d ops for hsm-a, want 5", first.Members[0].Ops)
	}
	if last.Members[0].Ops != 42 {
		t.Errorf("the line written at stop counts %d ops for hsm-a, want 42", last.Members[0].Ops)
	}
	b := last.Members[1]
	if b.Name != "hsm-b" || b.State != member.Failed.String() || !b.Since.Equal(time.Unix(1700000000, 0)) || b.Errors != 3 || b.Failovers != 1 {
		t.Errorf("hsm-b = %+v", b)
	}
	for i := 1; i < len(lines); i++ {
		if lines[i].Time.Before(lines[i-1].Time) {
			t.Errorf("line %d goes back in time", i)
		}
	}
	raw, _ := os.ReadFile(path)
	if !strings.Contains(string(raw), `"state":"failed"`) {
		t.Errorf("states are not written by name:\n%s", raw)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("stats file mode %v, want 0600", fi.Mode().Perm())
	}
}

func TestStatsBadSettings(t *testing.T) {
	dir := t.TempDir()
	for name, kv := range map[string]map[string]string{
		"interval not a duration": {statsFileEnv: filepath.Join(dir, "a"), statsIntervalEnv: "often"},
		"interval too short":      {statsFileEnv: filepath.Join(dir, "b"), statsIntervalEnv: "1ms"},
		"file in a missing dir":   {statsFileEnv: filepath.Join(dir, "nodir", "c")},
	} {
		t.Run(name, func(t *testing.T) {
			w, err := startStats(env(kv), []statsSource{&fakeGroup{}})
			if err == nil {
				w.stop()
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), "HAGROUP_STATS_") {
				t.Errorf("error %q does not name the variable", err)
			}
		})
	}
}
