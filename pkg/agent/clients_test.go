package agent

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func (b *testBackend) Report(ctx context.Context, peer Peer, rep FleetReport) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reports = append(b.reports, peerReport{peer, rep})
	return nil
}

func (b *testBackend) Clients(ctx context.Context) (ClientsReport, error) {
	return ClientsReport{}, nil
}

type peerReport struct {
	peer Peer
	rep  FleetReport
}

// Lines of the HA log never go back in time: an event stamped before the
// last one written (a slower goroutine) takes the last one's time.
func TestEventLogTimesInOrder(t *testing.T) {
	l, err := OpenEventLog(filepath.Join(t.TempDir(), "ha.log"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	t2 := time.Date(2026, 12, 1, 10, 0, 2, 0, time.UTC)
	l.Append(Event{Time: t2, Group: "g", Event: "member_failed"})
	l.Append(Event{Time: t2.Add(-time.Second), Group: "g", Event: "member_recovering"})
	l.Append(Event{Time: t2.Add(time.Second), Group: "g", Event: "member_recovered"})
	var got []time.Time
	if err := l.Read(context.Background(), HALogRequest{}, func(e Event) error { got = append(got, e.Time); return nil }); err != nil {
		t.Fatal(err)
	}
	want := []time.Time{t2, t2, t2.Add(time.Second)}
	if !slices.EqualFunc(got, want, time.Time.Equal) {
		t.Errorf("times %v, want %v", got, want)
	}
}
