package member

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

func newFailed(t *testing.T, threshold int, notify func(Transition)) *Member {
	t.Helper()
	m, err := New(Config{Name: "hsm-a", FailureThreshold: threshold}, nil, Failed, errors.New("not opened"), notify)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestCanTransition(t *testing.T) {
	all := []State{Active, Standby, Failed, Recovering, Removed}
	want := map[[2]State]bool{
		{Active, Standby}: true, {Active, Failed}: true, {Active, Removed}: true,
		{Standby, Active}: true, {Standby, Failed}: true, {Standby, Removed}: true,
		{Failed, Recovering}: true, {Failed, Removed}: true,
		{Recovering, Active}: true, {Recovering, Standby}: true, {Recovering, Failed}: true, {Recovering, Removed}: true,
	}
	for _, from := range all {
		for _, to := range all {
			t.Run(fmt.Sprintf("%v-%v", from, to), func(t *testing.T) {
				if got := CanTransition(from, to); got != want[[2]State{from, to}] {
					t.Errorf("CanTransition(%v, %v) = %v, want %v", from, to, got, !got)
				}
			})
		}
	}
}

func TestNewRejectsSlotlessServingMember(t *testing.T) {
	if _, err := New(Config{Name: "x"}, nil, Active, nil, nil); err == nil {
		t.Fatal("New(active, nil slot) succeeded")
	}
	if _, err := New(Config{}, nil, Failed, nil, nil); err == nil {
		t.Fatal("New with empty name succeeded")
	}
}

func TestTransitionsEmitEvents(t *testing.T) {
	var got []Transition
	m := newFailed(t, 1, func(tr Transition) { got = append(got, tr) })
	if _, err := m.Transition(Active, nil); !errors.Is(err, ErrIllegalTransition) {
		t.Fatalf("failed → active: err = %v, want ErrIllegalTransition", err)
	}
	if m.State() != Failed {
		t.Fatalf("state after refused move = %v", m.State())
	}
	if _, err := m.Transition(Recovering, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Transition(Standby, nil); err != nil {
		t.Fatal(err)
	}
	if !m.CompareAndTransition(Standby, Active, nil) {
		t.Fatal("promotion refused")
	}
	if m.CompareAndTransition(Standby, Active, nil) {
		t.Fatal("second promotion from a state the member is no longer in succeeded")
	}
	cause := errors.New("device gone")
	if !m.Fail(cause) {
		t.Fatal("Fail on active member returned false")
	}
	if m.Fail(cause) {
		t.Fatal("second Fail returned true")
	}
	if _, err := m.Transition(Removed, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Transition(Recovering, nil); err == nil {
		t.Fatal("removed member left Removed")
	}
	want := [][2]State{{Failed, Recovering}, {Recovering, Standby}, {Standby, Active}, {Active, Failed}, {Failed, Removed}}
	if len(got) != len(want) {
		t.Fatalf("got %d events, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		if got[i].From != w[0] || got[i].To != w[1] || got[i].Member != "hsm-a" {
			t.Errorf("event %d = %+v, want %v → %v", i, got[i], w[0], w[1])
		}
	}
	if got[3].Err != cause {
		t.Errorf("fail event error = %v, want %v", got[3].Err, cause)
	}
	if err, _ := m.LastError(); err != cause {
		t.Errorf("LastError = %v, want %v", err, cause)
	}
}

func TestConcurrentFailEmitsOneEvent(t *testing.T) {
	var mu sync.Mutex
	events := 0
	m := newFailed(t, 1, func(tr Transition) {
		if tr.To == Failed {
			mu.Lock()
			events++
			mu.Unlock()
		}
	})
	m.Transition(Recovering, nil)
	m.Transition(Active, nil)
	var wg sync.WaitGroup
	var wins sync.Map
	for i := range 32 {
		wg.Go(func() {
			if m.Fail(errors.New("x")) {
				wins.Store(i, true)
			}
		})
	}
	wg.Wait()
	n := 0
	wins.Range(func(any, any) bool { n++; return true })
	if n != 1 || events != 1 {
		t.Fatalf("%d callers won, %d events; want 1 and 1", n, events)
	}
}

func TestEndChargesOnlyHealth(t *testing.T) {
	tests := []struct {
		name      string
		threshold int
		errs      []error
		wantFail  []bool
		wantClass slot.Class
	}{
		{"success", 1, []error{nil}, []bool{false}, slot.ClassNone},
		{"request error never charged", 1, []error{pkcs11.Error(pkcs11.CKR_MECHANISM_INVALID), pkcs11.Error(pkcs11.CKR_SIGNATURE_INVALID)}, []bool{false, false}, slot.ClassRequest},
		{"device error fails at threshold 1", 1, []error{pkcs11.Error(pkcs11.CKR_DEVICE_ERROR)}, []bool{true}, slot.ClassHealth},
		{"threshold 3 needs three in a row", 3, []error{pkcs11.Error(pkcs11.CKR_DEVICE_ERROR), pkcs11.Error(pkcs11.CKR_DEVICE_ERROR), pkcs11.Error(pkcs11.CKR_DEVICE_ERROR)}, []bool{false, false, true}, slot.ClassHealth},
		{"a success breaks the run", 2, []error{pkcs11.Error(pkcs11.CKR_DEVICE_ERROR), nil, pkcs11.Error(pkcs11.CKR_DEVICE_ERROR)}, []bool{false, false, false}, slot.ClassHealth},
		{"a timeout fails at once", 5, []error{fmt.Errorf("sign: %w", slot.ErrTimeout)}, []bool{true}, slot.ClassHealth},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newFailed(t, tc.threshold, nil)
			var last Outcome
			for i, err := range tc.errs {
				start := m.Begin()
				if m.InFlight() != 1 {
					t.Fatalf("in flight = %d during call", m.InFlight())
				}
				last = m.End(start, err)
				if last.Fail != tc.wantFail[i] {
					t.Errorf("call %d (%v): Fail = %v, want %v", i, err, last.Fail, tc.wantFail[i])
				}
			}
			if last.Class != tc.wantClass {
				t.Errorf("class = %v, want %v", last.Class, tc.wantClass)
			}
			if m.InFlight() != 0 {
				t.Errorf("in flight = %d after calls", m.InFlight())
			}
			s := m.Snapshot()
			var health, req, ok uint64
			for _, err := range tc.errs {
				switch slot.ClassOf(err) {
				case slot.ClassHealth:
					health++
				case slot.ClassRequest:
					req++
				default:
					ok++
				}
			}
			if s.Errors != health || s.RequestErrors != req || s.Ops != ok+req {
				t.Errorf("snapshot errors=%d request=%d ops=%d, want %d %d %d", s.Errors, s.RequestErrors, s.Ops, health, req, ok+req)
			}
		})
	}
}

// A member leaves rotation unwell with its error counted, however the
// error was found: once, whether a call's accounting counted it first or
// the failing path alone knew it; a failure for another reason counts none.
func TestFailCountsTheHealthErrorOnce(t *testing.T) {
	device := &slot.Error{Member: "hsm-a", Op: "OpenSession", Code: pkcs11.CKR_DEVICE_ERROR, Err: pkcs11.Error(pkcs11.CKR_DEVICE_ERROR)}
	tests := []struct {
		name    string
		charged bool // a call's End counted the error first
		reason  error
		want    uint64
	}{
		{"found outside a call (a recovery attempt)", false, fmt.Errorf("recover hsm-a: %w", device), 1},
		{"a timeout found outside a call", false, fmt.Errorf("member hsm-a: %w", slot.ErrTimeout), 1},
		{"counted by the call that found it", true, device, 1},
		{"behind, not unwell", false, errors.New("behind: member hsm-b holds a mark that hsm-a missed a change"), 0},
		{"a PIN refused before, not unwell", false, errors.New("member hsm-a: PIN refused: automatic login and recovery stopped"), 0},
		{"a request's answer is not the member's error", false, &slot.Error{Member: "hsm-a", Op: "Sign", Code: pkcs11.CKR_MECHANISM_INVALID, Err: pkcs11.Error(pkcs11.CKR_MECHANISM_INVALID)}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newFailed(t, 1, nil)
			m.Transition(Recovering, nil)
			m.Transition(Active, nil)
			if tc.charged {
				m.End(m.Begin(), tc.reason)
			}
			if !m.Fail(tc.reason) {
				t.Fatal("Fail of an active member did nothing")
			}
			if got := m.Snapshot().Errors; got != tc.want {
				t.Errorf("errors = %d after the member failed for %v, want %d", got, tc.reason, tc.want)
			}
			if m.Fail(tc.reason) || m.Snapshot().Errors != tc.want {
				t.Errorf("failing a failed member changed it: errors = %d", m.Snapshot().Errors)
			}
		})
	}
}

// Every way into Failed counts the error the same way: a member that
// could not be opened, and a recovery's re-open that failed (a
// transition from Recovering, not Fail).
func TestEveryWayIntoFailedCountsTheError(t *testing.T) {
	device := &slot.Error{Member: "hsm-a", Op: "Initialize", Code: pkcs11.CKR_DEVICE_ERROR, Err: pkcs11.Error(pkcs11.CKR_DEVICE_ERROR)}
	opened, err := New(Config{Name: "hsm-a", FailureThreshold: 1}, nil, Failed, device, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := opened.Snapshot().Errors; got != 1 {
		t.Errorf("a member whose open failed with a device error counts %d errors, want 1", got)
	}
	if !opened.CompareAndTransition(Failed, Recovering, nil) || !opened.CompareAndTransition(Recovering, Failed, device) {
		t.Fatal("failed -> recovering -> failed refused")
	}
	if got := opened.Snapshot().Errors; got != 1 {
		t.Errorf("a failed re-open of a member whose error was counted counts %d errors in all, want 1", got)
	}

	m := newFailed(t, 1, nil) // failed for a reason that is no answer of the member's
	if !m.CompareAndTransition(Failed, Recovering, nil) || !m.CompareAndTransition(Recovering, Failed, device) {
		t.Fatal("failed -> recovering -> failed refused")
	}
	if got := m.Snapshot().Errors; got != 1 {
		t.Errorf("a recovery's failed re-open counts %d errors, want 1", got)
	}
}

func TestLatencyAverage(t *testing.T) {
	m := newFailed(t, 1, nil)
	m.observe(8 * time.Millisecond)
	if got := m.Latency(); got != 8*time.Millisecond {
		t.Fatalf("first sample: latency = %v", got)
	}
	for range 100 {
		m.observe(time.Millisecond)
	}
	if got := m.Latency(); got < time.Millisecond || got > 1100*time.Microsecond {
		t.Fatalf("after 100 samples of 1ms: latency = %v", got)
	}
}

func TestSnapshotConcurrent(t *testing.T) {
	m := newFailed(t, 1000, nil)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				st := m.Begin()
				m.End(st, nil)
				m.AddReplication()
				_ = m.Snapshot()
			}
		})
	}
	wg.Wait()
	s := m.Snapshot()
	if s.Ops != 8000 || s.Replications != 8000 || s.InFlight != 0 {
		t.Fatalf("snapshot = %+v", s)
	}
	if s.State != Failed || s.LastError != "not opened" {
		t.Fatalf("state/last error = %v / %q", s.State, s.LastError)
	}
}

func TestDecayedLatencyFades(t *testing.T) {
	m := newFailed(t, 1, nil)
	m.observe(8 * time.Millisecond)
	now := time.Now().UnixNano()
	if got := m.DecayedLatency(now); got != 8*time.Millisecond {
		t.Fatalf("fresh sample: %v", got)
	}
	later := now + int64(3*LatencyHalfLife) + 1
	if got := m.DecayedLatency(later); got > time.Millisecond+time.Millisecond/10 || got < 900*time.Microsecond {
		t.Fatalf("after three half-lives: %v, want about 1ms", got)
	}
	if got := m.Latency(); got != 8*time.Millisecond {
		t.Fatalf("Latency changed by decay: %v", got)
	}
}

func TestDecayedLatencyHoldsWhileACallIsInFlight(t *testing.T) {
	m := newFailed(t, 1, nil)
	m.observe(80 * time.Millisecond)
	later := time.Now().UnixNano() + int64(3*LatencyHalfLife) + 1
	start := m.Begin()
	if got := m.DecayedLatency(later); got != 80*time.Millisecond {
		t.Fatalf("three half-lives into a call still in flight: %v, want the 80ms of the last sample", got)
	}
	m.End(start, nil)
	if got := m.DecayedLatency(time.Now().UnixNano() + int64(3*LatencyHalfLife) + 1); got >= m.Latency() {
		t.Fatalf("idle for three half-lives after the call: %v, want less than %v", got, m.Latency())
	}
}

func TestDrainWaitsForCallsAndPinnedOperations(t *testing.T) {
	m := newFailed(t, 1, nil)
	start := m.Begin()
	m.Pin()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- m.Drain(ctx) }()
	m.End(start, nil)
	select {
	case err := <-done:
		t.Fatalf("Drain returned (%v) while an operation was still pinned", err)
	default:
	}
	m.Unpin()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Drain: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Drain did not return after the last call ended")
	}
}

func TestDrainGivesUpWithContext(t *testing.T) {
	m := newFailed(t, 1, nil)
	m.Begin()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := m.Drain(ctx)
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "1 call(s) in flight") {
		t.Fatalf("Drain with a call stuck: %v", err)
	}
}

func TestSharedEpochsAreUnique(t *testing.T) {
	var src atomic.Uint64
	a, err := New(Config{Name: "a", Epochs: &src}, nil, Failed, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{Name: "b", Epochs: &src}, nil, Failed, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]bool{a.Epoch(): true}
	if seen[b.Epoch()] {
		t.Fatalf("two members start at epoch %d", b.Epoch())
	}
	seen[b.Epoch()] = true
	prev := a.Epoch()
	for range 10 {
		for _, m := range []*Member{a, b} {
			e := m.BumpEpoch()
			if seen[e] {
				t.Fatalf("epoch %d handed out twice", e)
			}
			seen[e] = true
		}
		if a.Epoch() <= prev {
			t.Fatalf("epoch of a went from %d to %d", prev, a.Epoch())
		}
		prev = a.Epoch()
	}
}

func TestMissingMechanismsAndStandbyFlag(t *testing.T) {
	m := newFailed(t, 1, nil)
	if m.Lacks("CKM_AES_KEY_WRAP_PAD") || m.MissingMechanisms() != nil {
		t.Fatal("a new member lacks mechanisms")
	}
	if !m.SetMissingMechanisms([]string{"CKM_AES_KEY_WRAP_PAD"}) {
		t.Fatal("first SetMissingMechanisms reported no change")
	}
	if m.SetMissingMechanisms([]string{"CKM_AES_KEY_WRAP_PAD"}) {
		t.Fatal("the same set reported as a change")
	}
	if !m.Lacks("CKM_AES_KEY_WRAP_PAD") {
		t.Fatal("Lacks = false")
	}
	if s := m.Snapshot(); len(s.MissingMechanisms) != 1 {
		t.Fatalf("snapshot missing mechanisms = %v", s.MissingMechanisms)
	}
	if !m.SetMissingMechanisms(nil) || m.Lacks("CKM_AES_KEY_WRAP_PAD") {
		t.Fatal("clearing the set did not take")
	}
	m.SetConfiguredStandby(true)
	if !m.ConfiguredStandby() || !m.Snapshot().ConfiguredStandby {
		t.Fatal("SetConfiguredStandby(true) not seen")
	}
}

// TestLatencyAfterIdleIsTheNewSample: a call that begins after the
// average has been fading for more than LatencyHalfLife sets the average
// to its own latency; calls close together still move it by an eighth.
func TestLatencyAfterIdleIsTheNewSample(t *testing.T) {
	m := newFailed(t, 1, nil)
	t0 := time.Now()
	m.observeAt(800*time.Millisecond, t0) // one bad sample
	m.observeAt(time.Millisecond, t0.Add(10*time.Millisecond))
	if got, want := m.Latency(), 800*time.Millisecond+(time.Millisecond-800*time.Millisecond)/8; got != want {
		t.Fatalf("a sample right after another: latency %v, want %v (an eighth of the way)", got, want)
	}
	idle := t0.Add(10*time.Millisecond + LatencyHalfLife + 2*time.Millisecond)
	m.observeAt(time.Millisecond, idle)
	if got := m.Latency(); got != time.Millisecond {
		t.Fatalf("a sample of a call begun %v after the last: latency %v, want the sample's 1ms", LatencyHalfLife+time.Millisecond, got)
	}
}

func TestP95(t *testing.T) {
	m := newFailed(t, 1, nil)
	for range 15 {
		m.observe(time.Millisecond)
	}
	if got := m.P95(); got != 0 {
		t.Fatalf("P95 after 15 answers = %v, want 0 (too few to say)", got)
	}
	m.observe(9 * time.Millisecond)
	if got := m.P95(); got != 9*time.Millisecond {
		t.Fatalf("P95 of 16 answers, one of 9ms = %v, want the largest", got)
	}
	for range recentSamples {
		m.observe(2 * time.Millisecond)
	}
	if got := m.P95(); got != 2*time.Millisecond {
		t.Fatalf("P95 of the last 32 answers, all 2ms (the 9ms one rolled out) = %v", got)
	}
	m.observe(50 * time.Millisecond)
	if got := m.P95(); got != 2*time.Millisecond {
		t.Fatalf("P95 with one outlier in 32 = %v, want 2ms (the second largest)", got)
	}
}

// observe counts a latency sample d taken now.
func (m *Member) observe(d time.Duration) { m.observeAt(d, time.Now()) }
