package fleet

import (
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
)

func TestFolderFoldsRepeatsWithinTheWindow(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	type line struct {
		e       agent.FleetEvent
		repeats int
	}
	var lines []line
	f := NewFolder(time.Minute, func(e agent.FleetEvent, n int, _ time.Duration) { lines = append(lines, line{e, n}) })
	f.Now = func() time.Time { return now }
	fail := agent.FleetEvent{Group: "signing", Member: "hsm-b", Event: "member_failed"}
	for i := 0; i < 12; i++ {
		f.Add("signing/hsm-b/member_failed", fail)
		now = now.Add(time.Second)
	}
	f.Add("signing/hsm-a/member_failed", agent.FleetEvent{Group: "signing", Member: "hsm-a", Event: "member_failed"})
	if len(lines) != 2 || lines[0].repeats != 0 || lines[0].e.Member != "hsm-b" || lines[1].e.Member != "hsm-a" {
		t.Fatalf("before the window ends: %+v, want the first hsm-b line and the first hsm-a line", lines)
	}
	f.Flush()
	if len(lines) != 2 {
		t.Fatalf("Flush inside the window wrote %+v", lines[2:])
	}
	now = now.Add(time.Minute)
	f.Flush()
	if len(lines) != 3 || lines[2].repeats != 11 || lines[2].e.Member != "hsm-b" {
		t.Fatalf("after the window: %+v, want one summary of 11 repeats of hsm-b", lines)
	}
	// After its window, the next occurrence is a first one again.
	f.Add("signing/hsm-b/member_failed", fail)
	if len(lines) != 4 || lines[3].repeats != 0 {
		t.Fatalf("a new window: %+v", lines[3:])
	}
	if got := FoldedDetail("CKR_DEVICE_ERROR", 11, time.Minute); got != "×11 more in 1m0s (last: CKR_DEVICE_ERROR)" {
		t.Errorf("FoldedDetail = %q", got)
	}
}

// A hung agent: it accepts connections and never answers.
func hungAgent(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "hung.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return sock
}

// The application never waits for the agent: with an agent that accepts
// and never answers, a storm of events costs the caller a channel send
// each, the excess is dropped and counted, and Close is bounded.
func TestReporterNeverBlocksOnAHungAgent(t *testing.T) {
	var mu sync.Mutex
	var fell []agent.FleetEvent
	r := Start(Options{Socket: hungAgent(t), Timeout: 300 * time.Millisecond, Interval: time.Hour,
		Fallback: func(e agent.FleetEvent) { mu.Lock(); fell = append(fell, e); mu.Unlock() }})
	const n = 100000
	start := time.Now()
	var worst time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		r.Event(agent.FleetEvent{Group: "signing", Member: "hsm-b", Event: "member_failed", Detail: "CKR_DEVICE_ERROR"})
		worst = max(worst, time.Since(t0))
	}
	spent := time.Since(start)
	t.Logf("%d events in %v (worst call %v); %d dropped", n, spent, worst, r.dropped.Load())
	// One send is a 300ms timeout: a caller that waited for the agent
	// would take n×300ms. 100k channel sends take milliseconds.
	if spent > 2*time.Second {
		t.Errorf("%d Event calls took %v with a hung agent, want no waiting on it", n, spent)
	}
	if r.dropped.Load() < n-2*queueSize {
		t.Errorf("dropped %d of %d events with a hung agent, want all but the queue's %d", r.dropped.Load(), n, queueSize)
	}
	closed := time.Now()
	r.Close()
	// At most the send in flight (Timeout) plus the final one (finalTimeout).
	if d := time.Since(closed); d > 300*time.Millisecond+finalTimeout+time.Second {
		t.Errorf("Close took %v with a hung agent", d)
	}
	if r.Delivered() != 0 {
		t.Errorf("Delivered = %d to an agent that never answers", r.Delivered())
	}
	mu.Lock()
	defer mu.Unlock()
	// What could not be delivered fell back folded: one first line and one
	// summary, not one line per event.
	if len(fell) != 2 || !strings.Contains(fell[1].Detail, "more in") {
		t.Errorf("fallback got %d lines, want a first line and one folded summary: %+v", len(fell), fell)
	}
}

// No agent: nothing happens per call, and the events fall back folded.
func TestReporterWithoutAgentFallsBackFolded(t *testing.T) {
	fell := make(chan agent.FleetEvent, 16)
	r := Start(Options{Socket: filepath.Join(t.TempDir(), "absent.sock"), Interval: time.Hour,
		Fallback: func(e agent.FleetEvent) { fell <- e }})
	next := func() agent.FleetEvent {
		t.Helper()
		select {
		case e := <-fell:
			return e
		case <-time.After(10 * time.Second):
			t.Fatal("no fallback line within 10s")
			return agent.FleetEvent{}
		}
	}
	r.Event(agent.FleetEvent{Group: "signing", Member: "hsm-b", Event: "member_failed"})
	if e := next(); e.Event != "member_failed" || e.Detail != "" {
		t.Fatalf("first fallback line %+v, want the event itself", e)
	}
	for i := 0; i < 5; i++ {
		r.Event(agent.FleetEvent{Group: "signing", Member: "hsm-b", Event: "member_failed"})
	}
	r.Event(agent.FleetEvent{Group: "signing", Member: "hsm-b", Event: "member_recovered"})
	if e := next(); e.Event != "member_recovered" {
		t.Fatalf("second fallback line %+v, want member_recovered at once (a new event is never held back)", e)
	}
	r.Close()
	if e := next(); e.Event != "member_failed" || !strings.HasPrefix(e.Detail, "×5 more in ") {
		t.Fatalf("at close %+v, want one summary of the 5 repeats", e)
	}
	select {
	case e := <-fell:
		t.Errorf("extra fallback line %+v", e)
	default:
	}
}
