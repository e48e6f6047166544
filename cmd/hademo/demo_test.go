package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hagroup/hagroup/test/load"
)

// fakeRun is a failover run with a kill at 2 s, a restart at 4 s and the
// member back at 4.5 s, and module counters every 100 ms to match.
func fakeRun(t *testing.T) (*failoverRun, []load.StatsLine) {
	t.Helper()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	r := &failoverRun{victim: "hsm-a", start: t0, kill: t0.Add(2 * time.Second), dropped: t0.Add(2100 * time.Millisecond),
		restart: t0.Add(4 * time.Second), back: t0.Add(4500 * time.Millisecond), end: t0.Add(6 * time.Second),
		interval: time.Second, verified: 600, syncCode: 0, rate: 100}
	r.result = &load.Result{Ops: 600}
	var lines []load.StatsLine
	var a, b uint64
	for i := 0; i <= 60; i++ {
		at := t0.Add(time.Duration(i) * 100 * time.Millisecond)
		stateA := "active"
		if at.After(r.dropped) && at.Before(r.back) {
			stateA = "failed"
		} else {
			a += 5
		}
		b += 5
		lines = append(lines, load.StatsLine{Time: at, PID: 1, Group: groupLabel, Members: []load.StatsMember{
			{Name: "hsm-a", State: stateA, Ops: a}, {Name: "hsm-b", State: "active", Ops: b}, {Name: "hsm-c", State: "standby"}}})
		r.result.Ticks = append(r.result.Ticks, load.Tick{At: at, OK: 10, MaxLat: time.Duration(i) * time.Millisecond})
	}
	return r, lines
}

func TestSummary(t *testing.T) {
	r, lines := fakeRun(t)
	s := summarize(r, lines)
	// Ticks carry their index in ms: the 3 s after the kill at 2 s end with
	// the tick at 4.9 s.
	if s.stall != 49*time.Millisecond {
		t.Errorf("stall = %v, want 49ms (the longest tick in the 3 s after the kill)", s.stall)
	}
	if s.before != 19*time.Millisecond {
		t.Errorf("before = %v, want 19ms", s.before)
	}
	if s.recovery != 500*time.Millisecond || s.dropped != 100*time.Millisecond {
		t.Errorf("recovery %v dropped %v, want 500ms and 100ms", s.recovery, s.dropped)
	}
	want := map[string]uint64{"hsm-a": 0, "hsm-b": 300, "hsm-c": 0}
	for _, m := range s.share {
		if m.name == "hsm-b" && m.ops != want["hsm-b"] {
			t.Errorf("hsm-b did %d ops, want %d", m.ops, want["hsm-b"])
		}
	}
	if p := s.problems(); len(p) != 0 {
		t.Errorf("problems in a good run: %v", p)
	}
	text := strings.Join(s.lines(), "\n")
	for _, w := range []string{"600 signatures", "failures             0", "600 of 600", "in sync",
		"signing rate         offered 100/s; served 100/s before the kill, 100/s while hsm-a was out, 100/s after\n"} {
		if !strings.Contains(text, w) {
			t.Errorf("summary lacks %q:\n%s", w, text)
		}
	}
	// Offered more than was served: the summary says the machine did not
	// keep up (it is not a failure of the story).
	s.rate = 200
	if l := s.phases.line(s.rate, s.victim); !strings.HasSuffix(l, "(this machine did not keep up with the offered load)") {
		t.Errorf("rate line with 200/s offered and 100/s served = %q", l)
	}
	s.failed, s.badSigs, s.syncCode = 2, 1, 3
	if p := s.problems(); len(p) != 3 {
		t.Errorf("problems = %v, want failures, bad signatures and out of sync", p)
	}
}

// TestDrawFailover: the picture marks the kill, restart and return, names
// the members, and says what sets the rate: the offered load (its line
// too), or, flat out, this machine's CPUs.
func TestDrawFailover(t *testing.T) {
	for _, tc := range []struct {
		name   string
		rate   int
		want   []string
		absent []string
	}{
		{"offered", 100, []string{"100/s offered", "offered 100/s", "fixed 100 signatures/s"}, []string{"fell short"}},
		{"flat out", 0, []string{"flat out", "this machine&#39;s CPUs"}, []string{"offered", "fell short"}},
		{"short of the offered rate", 200, []string{"200/s offered", "this run fell short of it"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, lines := fakeRun(t)
			r.rate = tc.rate
			path := filepath.Join(t.TempDir(), "failover.svg")
			if err := drawFailover(path, r, lines); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			svg := string(b)
			for _, w := range append([]string{"<svg", "kill -9 hsm-a", "server restarted", "back in rotation",
				"hsm-a (primary, killed)", "hsm-c (standby)", "total"}, tc.want...) {
				if !strings.Contains(svg, w) {
					t.Errorf("the picture lacks %q", w)
				}
			}
			for _, w := range tc.absent {
				if strings.Contains(svg, w) {
					t.Errorf("the picture says %q", w)
				}
			}
		})
	}
}

// TestDemo runs the whole demo, shortened, from freshly built binaries,
// twice in a row in the same directory (members served by hsmserve), and
// checks the story held and that nothing it
// started is left running.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and runs real servers")
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	build := func(args ...string) {
		cmd := exec.CommandContext(ctx, "go", append([]string{"build"}, args...)...)
		cmd.Dir = repo
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %v: %v\n%s", args, err, out)
		}
	}
	build("-o", bin, "./cmd/hactl", "./cmd/haagent", "./cmd/hademo", "./cmd/hsmserve")
	build("-buildmode=c-shared", "-o", filepath.Join(bin, "libhapkcs11.so"), "./cmd/hapkcs11")
	work := t.TempDir()
	for run := range 2 {
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "hademo"), "-phase", "1500ms", "-quiet",
			"-src", repo, "-out", filepath.Join(work, "demo-out"))
		cmd.Dir = work
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("run %d: %v\n%s", run, err, out)
		}
		text := string(out)
		for _, w := range []string{
			"$ hactl hagroup creategroup --label demo", "$ hactl hagroup addstandby --group demo --member hsm-c",
			"hagroup domain --group demo --install", "same key pair on all three members",
			"$ kill -KILL", "hsm-a   failed", "back in rotation", "group \"demo\" is in sync", "2. Each HSM behind its own server process (hsmserve)",
			"  failures             0", "The application saw no failure", "  signing rate         offered 1500/s; served ",
		} {
			if !strings.Contains(text, w) {
				t.Errorf("run %d: output lacks %q", run, w)
			}
		}
		if strings.Contains(text, testPIN(t, filepath.Join(work, "demo-out", "user.pin"))) {
			t.Errorf("run %d: the user PIN appears in the output", run)
		}
		if _, err := os.Stat(filepath.Join(work, "demo-out", "failover.svg")); err != nil {
			t.Errorf("run %d: %v", run, err)
		}
		if t.Failed() {
			t.Logf("output:\n%s", text)
			return
		}
	}
	// Nothing left running: no process has the demo's directory open as
	// its working directory or on its command line.
	if out, _ := exec.Command("pgrep", "-f", filepath.Join(work, "demo-out")).Output(); len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("processes left running: %s", out)
	}
}

func testPIN(t *testing.T, path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
