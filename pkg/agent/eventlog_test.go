package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestEventLogRotationAndOrder(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ha.log")
	l, err := OpenEventLog(p, 400)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := range 12 {
		if err := l.Append(Event{Group: "g", Member: "m", Event: "probe_failed", Detail: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{p, p + ".1"} {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if fi.Size() > 400 {
			t.Errorf("%s is %d bytes, limit 400", f, fi.Size())
		}
	}
	// Each line is one JSON event with the documented keys.
	b, _ := os.ReadFile(p)
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		for _, k := range []string{"time", "group", "member", "event", "detail"} {
			if _, ok := m[k]; !ok {
				t.Errorf("line %q lacks %q", line, k)
			}
		}
	}
	var got []string
	l.Read(t.Context(), HALogRequest{}, func(e Event) error { got = append(got, e.Detail); return nil })
	if len(got) < 2 {
		t.Fatalf("read %v", got)
	}
	// What is kept is the newest events, in order, ending with the last.
	for i := 1; i < len(got); i++ {
		var a, b int
		fmt.Sscan(got[i-1], &a)
		fmt.Sscan(got[i], &b)
		if b != a+1 {
			t.Errorf("events out of order: %v", got)
		}
	}
	if got[len(got)-1] != "11" {
		t.Errorf("last event %s, want 11", got[len(got)-1])
	}
}

func TestEventLogFilters(t *testing.T) {
	l, _ := OpenEventLog(filepath.Join(t.TempDir(), "ha.log"), 0)
	defer l.Close()
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	l.now = func() time.Time { return now }
	l.Append(Event{Time: now.Add(-2 * time.Hour), Group: "a", Event: "old"})
	l.Append(Event{Time: now.Add(-time.Minute), Group: "a", Event: "new-a"})
	l.Append(Event{Time: now.Add(-time.Minute), Group: "b", Event: "new-b"})
	collect := func(req HALogRequest) string {
		var s []string
		l.Read(t.Context(), req, func(e Event) error { s = append(s, e.Event); return nil })
		return strings.Join(s, ",")
	}
	if got := collect(HALogRequest{}); got != "old,new-a,new-b" {
		t.Errorf("all = %s", got)
	}
	if got := collect(HALogRequest{Since: time.Hour}); got != "new-a,new-b" {
		t.Errorf("since 1h = %s", got)
	}
	if got := collect(HALogRequest{Group: "a"}); got != "old,new-a" {
		t.Errorf("group a = %s", got)
	}
}

// TestHALogFollowOverSocket: stored events, then live ones, each once, in
// order, through the real socket and client.
func TestHALogFollowOverSocket(t *testing.T) {
	c, b, _ := startServer(t, Policy{})
	b.log.Append(Event{Group: "g", Member: "hsm-b", Event: "member_failed"})
	b.log.Append(Event{Group: "h", Event: "other-group"})

	var plain []string
	if err := c.HALog(t.Context(), HALogRequest{}, func(e Event) error { plain = append(plain, e.Event); return nil }); err != nil {
		t.Fatal(err)
	}
	if strings.Join(plain, ",") != "member_failed,other-group" {
		t.Errorf("halog = %v", plain)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var got []string
	seen := make(chan struct{}, 10)
	errc := make(chan error, 1)
	go func() {
		errc <- c.HALog(ctx, HALogRequest{Follow: true, Group: "g"}, func(e Event) error {
			got = append(got, e.Event)
			seen <- struct{}{}
			if e.Event == "member_recovered" {
				cancel()
			}
			return nil
		})
	}()
	<-seen // the stored event arrived: the follower is subscribed
	b.log.Append(Event{Group: "h", Event: "filtered-out"})
	b.log.Append(Event{Group: "g", Member: "hsm-b", Event: "member_recovered"})
	if err := <-errc; err != nil {
		t.Fatalf("follow: %v", err)
	}
	if strings.Join(got, ",") != "member_failed,member_recovered" {
		t.Errorf("followed %v", got)
	}
}

// TestFollowSeesOtherWritersAndRotation: a follower sees lines that
// another process (libhapkcs11) appends to the file, and keeps following
// across a rotation, each event once and in order.
func TestFollowSeesOtherWritersAndRotation(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ha.log")
	l, err := OpenEventLog(p, 300)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.Append(Event{Group: "g", Event: "e0"})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	got := make(chan string, 100)
	errc := make(chan error, 1)
	go func() {
		errc <- l.Read(ctx, HALogRequest{Follow: true}, func(e Event) error {
			got <- e.Event
			return nil
		})
	}()
	var seenSoFar []string
	next := func() string {
		select {
		case s := <-got:
			seenSoFar = append(seenSoFar, s)
			return s
		case <-ctx.Done():
			t.Fatalf("follower saw nothing more before the deadline (so far: %v)", seenSoFar)
			return ""
		}
	}
	if s := next(); s != "e0" {
		t.Fatalf("first = %s", s)
	}
	other, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	other.Write([]byte(`{"time":"2025-01-01T00:00:00Z","group":"g","event":"from-lib","source":"libhapkcs11 pid 1"}` + "\n"))
	other.Close()
	if s := next(); s != "from-lib" {
		t.Fatalf("second = %s, want the line another process appended", s)
	}
	var want []string
	for i := range 10 { // enough to rotate the 300-byte log several times
		name := fmt.Sprintf("r%d", i)
		want = append(want, name)
		l.Append(Event{Group: "g", Event: name, Detail: strings.Repeat("x", 40)})
	}
	var seen []string
	for range want {
		seen = append(seen, next())
	}
	if strings.Join(seen, ",") != strings.Join(want, ",") {
		t.Errorf("across rotation saw %v, want %v", seen, want)
	}
	cancel()
	if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("Read: %v", err)
	}
}
