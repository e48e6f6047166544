package recover

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	hasync "github.com/hagroup/hagroup/pkg/sync"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"golang.org/x/sys/unix"
)

// These tests drive the recovery loop against a scripted engine, with a
// clock the test advances: they check scheduling, the attempt accounting,
// the guards and the events. The tests on real tokens are in
// tokens_test.go.

// fakeClock is a Clock whose time moves only when the test says so.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	timers  []*fakeTimer
	created chan struct{} // signalled on every NewTimer
}

type fakeTimer struct {
	clk  *fakeClock
	at   time.Time
	c    chan time.Time
	done bool
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC), created: make(chan struct{}, 100)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) Timer {
	c.mu.Lock()
	t := &fakeTimer{clk: c, at: c.now.Add(d), c: make(chan time.Time, 1)}
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	c.created <- struct{}{}
	return t
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.clk.mu.Lock()
	defer t.clk.mu.Unlock()
	was := !t.done
	t.done = true
	return was
}

// pending returns the number of armed timers.
func (c *fakeClock) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if !t.done {
			n++
		}
	}
	return n
}

// Advance moves the clock and fires the timers that are due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for _, t := range c.timers {
		if !t.done && !t.at.After(c.now) {
			t.done = true
			t.c <- c.now
		}
	}
}

// waitArmed waits until a loop has armed a timer (it is then idle until
// the clock moves).
func (c *fakeClock) waitArmed(t *testing.T) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for c.pending() == 0 {
		select {
		case <-c.created:
		case <-deadline:
			t.Fatal("no recovery timer armed within 10s")
		}
	}
}

// fakeEngine scripts the group side with real member state machines:
// whether a token is reachable, and what the engine was asked to do.
type fakeEngine struct {
	mu        sync.Mutex
	members   []*member.Member
	byName    map[string]*member.Member
	down      map[string]bool
	reopens   map[string]int
	activates map[string]int
	unheld    int        // activations without the write barrier held
	held      int        // barriers held now
	rec       *Recoverer // told of every failure, as the group's event glue does
}

func newFakeEngine(t *testing.T, names ...string) *fakeEngine {
	e := &fakeEngine{byName: map[string]*member.Member{}, down: map[string]bool{}, reopens: map[string]int{}, activates: map[string]int{}}
	for i, n := range names {
		// A member without a token must start failed; bring it up.
		m, err := member.New(member.Config{Name: n, Index: i}, nil, member.Failed, nil, e.notify)
		if err != nil {
			t.Fatal(err)
		}
		m.Transition(member.Recovering, nil)
		m.Transition(member.Active, nil)
		e.members = append(e.members, m)
		e.byName[n] = m
	}
	return e
}

func (e *fakeEngine) notify(tr member.Transition) {
	if tr.To != member.Failed {
		return
	}
	e.mu.Lock()
	r := e.rec
	e.mu.Unlock()
	if r != nil {
		r.MemberFailed(tr.Member)
	}
}

func (e *fakeEngine) Serial() string { return "1000001" }

func (e *fakeEngine) Members() []member.Snapshot {
	var out []member.Snapshot
	for _, m := range e.members {
		out = append(out, m.Snapshot())
	}
	return out
}

func (e *fakeEngine) Member(name string) (*member.Member, bool) {
	m, ok := e.byName[name]
	return m, ok
}

func (e *fakeEngine) Reconnect(_ context.Context, name string) (*slot.Slot, error) {
	m := e.byName[name]
	if _, err := m.Transition(member.Recovering, nil); err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.reopens[name]++
	down := e.down[name]
	e.mu.Unlock()
	if down {
		err := fmt.Errorf("member %s: %w", name, slot.ErrDeviceFailure)
		m.CompareAndTransition(member.Recovering, member.Failed, err)
		return nil, err
	}
	return nil, nil
}

func (e *fakeEngine) ActivateMember(_ context.Context, name string) error {
	m := e.byName[name]
	if !m.CompareAndTransition(member.Recovering, member.Active, nil) {
		return fmt.Errorf("member %s is %v", name, m.State())
	}
	e.mu.Lock()
	e.activates[name]++
	if e.held != 1 {
		e.unheld++
	}
	e.mu.Unlock()
	return nil
}

// WriteMark and HoldWrites: the fake makes no objects; it records that
// every activation happened with the barrier held.
func (e *fakeEngine) WriteMark() uint64 { return 0 }

func (e *fakeEngine) Replicator() *hasync.Replicator { return &hasync.Replicator{} }

func (e *fakeEngine) HoldWrites(context.Context) (func(), error) {
	e.mu.Lock()
	e.held++
	e.mu.Unlock()
	return func() {
		e.mu.Lock()
		e.held--
		e.mu.Unlock()
	}, nil
}

func (e *fakeEngine) FailMember(name string, reason error) error {
	e.byName[name].Fail(reason)
	return nil
}

// fail fails a member as a failed operation would.
func (e *fakeEngine) fail(name string) { e.byName[name].Fail(errors.New("test: member failed")) }

func (e *fakeEngine) setDown(name string, down bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.down[name] = down
}

func (e *fakeEngine) get(name string) (state string, reopens, activates int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.byName[name].State().String(), e.reopens[name], e.activates[name]
}

// events collects a recoverer's events.
type events struct {
	mu  sync.Mutex
	all []Event
	ch  chan Event
}

func newEvents() *events { return &events{ch: make(chan Event, 1000)} }

func (ev *events) sink(e Event) {
	ev.mu.Lock()
	ev.all = append(ev.all, e)
	ev.mu.Unlock()
	ev.ch <- e
}

// next waits for the next event of kind k, skipping others.
func (ev *events) next(t *testing.T, k EventKind) Event {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case e := <-ev.ch:
			if e.Kind == k {
				return e
			}
		case <-deadline:
			t.Fatalf("no %s event within 10s", k)
		}
	}
}

// drain drops the events not yet looked at.
func (ev *events) drain() {
	for {
		select {
		case <-ev.ch:
		default:
			return
		}
	}
}

func (ev *events) count(k EventKind) int {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	n := 0
	for _, e := range ev.all {
		if e.Kind == k {
			n++
		}
	}
	return n
}

type harness struct {
	r   *Recoverer
	eng *fakeEngine
	clk *fakeClock
	ev  *events
}

func newHarness(t *testing.T, retries int, mod func(*Options)) *harness {
	t.Helper()
	h := &harness{eng: newFakeEngine(t, "a", "b", "c"), clk: newFakeClock(), ev: newEvents()}
	opts := Options{
		Engine:   h.eng,
		StateDir: t.TempDir(),
		Interval: time.Second,
		Retries:  retries,
		Clock:    h.clk,
		Events:   h.ev.sink,
		CatchUp: func(context.Context, hasync.PlanMember, []hasync.PlanMember) (CatchUp, error) {
			return CatchUp{Passes: 1}, nil
		},
	}
	if mod != nil {
		mod(&opts)
	}
	r, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	h.r = r
	h.eng.mu.Lock()
	h.eng.rec = r
	h.eng.mu.Unlock()
	t.Cleanup(func() { r.Close() })
	return h
}

// tick lets the armed timer fire and waits for the attempt's outcome.
func (h *harness) tick(t *testing.T) Event {
	t.Helper()
	h.clk.waitArmed(t)
	h.ev.drain()
	h.clk.Advance(time.Second)
	h.ev.next(t, AttemptStarted)
	deadline := time.After(10 * time.Second)
	for {
		select {
		case e := <-h.ev.ch:
			if e.Kind == Recovered || e.Kind == AttemptFailed {
				return e
			}
		case <-deadline:
			t.Fatal("attempt without an outcome within 10s")
		}
	}
}

func TestPolicyValidation(t *testing.T) {
	eng := newFakeEngine(t, "a")
	for _, c := range []struct {
		name     string
		interval time.Duration
		retries  int
	}{
		{"interval below one second", 999 * time.Millisecond, 3},
		{"zero interval", 0, 3},
		{"retries below -1", time.Second, -2},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := New(Options{Engine: eng, Interval: c.interval, Retries: c.retries}); err == nil {
				t.Fatal("accepted")
			}
		})
	}
	if _, err := New(Options{Engine: eng, Interval: time.Second, Retries: -1}); err != nil {
		t.Fatalf("1s, unlimited: %v", err)
	}
}

// An attempt against a member that is still down uses exactly one attempt;
// retries = 3 gives up after 3; a manual Recover then succeeds once the
// member is back.
func TestAttemptAccountingAndGiveUp(t *testing.T) {
	h := newHarness(t, 3, nil)
	h.eng.setDown("b", true)
	h.eng.fail("b")

	for i := 1; i <= 3; i++ {
		e := h.tick(t)
		if e.Kind != AttemptFailed || e.Attempt != i || e.AttemptsLeft != 3-i {
			t.Fatalf("tick %d: %s attempt %d left %d, want failed attempt %d left %d", i, e.Kind, e.Attempt, e.AttemptsLeft, i, 3-i)
		}
		if _, reopens, _ := h.eng.get("b"); reopens != i {
			t.Fatalf("after attempt %d the token was re-opened %d times", i, reopens)
		}
		st := h.r.Status("b")
		if st.Attempts != i || st.AttemptsLeft != 3-i || st.LastError == nil {
			t.Fatalf("status after attempt %d: %+v", i, st)
		}
	}
	g := h.ev.next(t, GaveUp)
	if g.Attempt != 3 {
		t.Fatalf("gave up after %d attempts", g.Attempt)
	}
	st := h.r.Status("b")
	if !st.GaveUp || st.Auto || st.AttemptsLeft != 0 || !st.NextAttempt.IsZero() {
		t.Fatalf("status after giving up: %+v", st)
	}
	if state, _, _ := h.eng.get("b"); state != "failed" {
		t.Fatalf("member is %s after giving up", state)
	}
	// No fourth attempt, however long we wait.
	h.clk.Advance(time.Hour)
	if _, reopens, _ := h.eng.get("b"); reopens != 3 {
		t.Fatalf("%d re-opens after giving up, want 3", reopens)
	}
	if h.clk.pending() != 0 {
		t.Fatal("a timer is still armed after giving up")
	}
	// A failure event now (say the engine fails it again) does not restart.
	h.r.MemberFailed("b")
	if h.clk.pending() != 0 || !h.r.Status("b").GaveUp {
		t.Fatal("MemberFailed restarted automatic attempts after giving up")
	}

	// Manual recovery, still down: fails, costs no automatic attempt.
	if _, err := h.r.Recover(t.Context(), "b"); err == nil {
		t.Fatal("manual recovery of a down member succeeded")
	}
	h.eng.setDown("b", false)
	res, err := h.r.Recover(t.Context(), "b")
	if err != nil {
		t.Fatalf("manual recovery: %v", err)
	}
	if !res.Manual || res.Joined {
		t.Fatalf("result %+v", res)
	}
	if state, reopens, acts := h.eng.get("b"); state != "active" || reopens != 5 || acts != 1 {
		t.Fatalf("after manual recovery: %s, %d re-opens, %d activations", state, reopens, acts)
	}
	st = h.r.Status("b")
	if st.GaveUp || st.LastError != nil || st.LastRecovered.IsZero() {
		t.Fatalf("status after manual recovery: %+v", st)
	}
	// A new failure starts a fresh budget.
	h.eng.setDown("b", true)
	h.eng.fail("b")
	if e := h.tick(t); e.Kind != AttemptFailed || e.Attempt != 1 || e.AttemptsLeft != 2 {
		t.Fatalf("first attempt of the next episode: %+v", e)
	}
}

func TestUnlimitedRetriesThenRecovered(t *testing.T) {
	h := newHarness(t, -1, nil)
	h.eng.setDown("a", true)
	h.eng.fail("a")
	for i := 1; i <= 5; i++ {
		if e := h.tick(t); e.Kind != AttemptFailed || e.AttemptsLeft != -1 || e.Attempt != i {
			t.Fatalf("attempt %d: %+v", i, e)
		}
	}
	h.eng.setDown("a", false)
	e := h.tick(t)
	if e.Kind != Recovered || e.Attempt != 6 {
		t.Fatalf("sixth attempt: %+v", e)
	}
	if state, _, _ := h.eng.get("a"); state != "active" {
		t.Fatalf("member is %s", state)
	}
	st := h.r.Status("a")
	if st.Auto || st.InProgress || st.Attempts != 6 {
		t.Fatalf("status: %+v", st)
	}
	if h.clk.pending() != 0 {
		t.Fatal("timer armed after recovery")
	}
	h.eng.mu.Lock()
	defer h.eng.mu.Unlock()
	if h.eng.unheld != 0 || h.eng.held != 0 {
		t.Fatalf("%d activation(s) without the write barrier; %d barrier(s) still held", h.eng.unheld, h.eng.held)
	}
}

func TestAdmitNewMember(t *testing.T) {
	h := newHarness(t, 3, nil)
	// A member the group just added: recovering, not yet caught up.
	m := h.eng.byName["b"]
	m.Fail(errors.New("test"))
	h.ev.drain()
	if _, err := m.Transition(member.Recovering, nil); err != nil {
		t.Fatal(err)
	}
	res, err := h.r.Admit(t.Context(), "b")
	if err != nil || !res.Admitted || !res.Manual {
		t.Fatalf("Admit: %+v, %v", res, err)
	}
	if state, reopens, activates := h.eng.get("b"); state != "active" || activates != 1 || reopens != 0 {
		t.Fatalf("after Admit: %s, %d re-opens, %d activations; want active, 0, 1", state, reopens, activates)
	}
	if _, err := h.r.Admit(t.Context(), "b"); !errors.Is(err, ErrNotFailed) {
		t.Fatalf("Admit of an active member: %v, want ErrNotFailed", err)
	}
	h.eng.mu.Lock()
	defer h.eng.mu.Unlock()
	if h.eng.unheld != 0 {
		t.Fatal("Admit activated without the write barrier")
	}
}

func TestRetriesOff(t *testing.T) {
	h := newHarness(t, 0, nil)
	h.eng.fail("c")
	if h.clk.pending() != 0 || h.r.Status("c").Auto {
		t.Fatal("automatic attempts scheduled with retries = 0")
	}
	if _, err := h.r.Recover(t.Context(), "c"); err != nil {
		t.Fatal(err)
	}
	if state, _, _ := h.eng.get("c"); state != "active" {
		t.Fatalf("member is %s", state)
	}
}

func TestRecoverActiveMember(t *testing.T) {
	h := newHarness(t, -1, nil)
	_, err := h.r.Recover(t.Context(), "a")
	if !errors.Is(err, ErrNotFailed) {
		t.Fatalf("recover an active member: %v", err)
	}
	if h.ev.count(AttemptStarted) != 0 {
		t.Fatal("an attempt started on an active member")
	}
}

// A manual Recover while an automatic attempt runs joins it: one attempt,
// one outcome for both.
func TestManualJoinsRunningAttempt(t *testing.T) {
	entered := make(chan struct{})
	release := make(chan struct{})
	h := newHarness(t, -1, func(o *Options) {
		o.CatchUp = func(ctx context.Context, self hasync.PlanMember, _ []hasync.PlanMember) (CatchUp, error) {
			entered <- struct{}{}
			<-release
			return CatchUp{Passes: 1, Copied: 7}, nil
		}
	})
	h.eng.fail("a")
	h.clk.waitArmed(t)
	h.clk.Advance(time.Second)
	<-entered
	if !h.r.Status("a").InProgress {
		t.Fatal("status does not show the attempt in progress")
	}
	type rr struct {
		res Result
		err error
	}
	got := make(chan rr, 1)
	go func() {
		res, err := h.r.Recover(t.Context(), "a")
		got <- rr{res, err}
	}()
	// The manual caller must be waiting on the running attempt, not
	// starting its own: the catch-up is entered only once.
	select {
	case <-entered:
		t.Fatal("a second attempt ran concurrently")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	r := <-got
	if r.err != nil || !r.res.Joined || r.res.CatchUp.Copied != 7 || r.res.Attempt != 1 {
		t.Fatalf("joined result: %+v, %v", r.res, r.err)
	}
	if n := h.ev.count(AttemptStarted); n != 1 {
		t.Fatalf("%d attempts started, want 1", n)
	}
}

// The host-wide lock: while another process holds the member's lock file,
// a scheduled attempt is skipped at no cost and a manual one waits.
func TestHostLock(t *testing.T) {
	h := newHarness(t, 2, nil)
	lockPath := filepath.Join(h.r.opts.StateDir, "1000001", "b.recover.lock")
	if err := os.MkdirAll(filepath.Dir(lockPath), 0o770); err != nil {
		t.Fatal(err)
	}
	other, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE, 0o660)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := unix.Flock(int(other.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	other.WriteString("4242\n")

	h.eng.fail("b")
	h.clk.waitArmed(t)
	h.clk.Advance(time.Second)
	sk := h.ev.next(t, AttemptSkipped)
	if !errors.Is(sk.Err, ErrInProgress) {
		t.Fatalf("skip event error: %v", sk.Err)
	}
	if want := "process 4242"; !strings.Contains(sk.Err.Error(), want) {
		t.Fatalf("skip event %q does not name %q", sk.Err, want)
	}
	st := h.r.Status("b")
	if st.Attempts != 0 || st.AttemptsLeft != 2 {
		t.Fatalf("a skipped tick cost an attempt: %+v", st)
	}
	if _, reopens, _ := h.eng.get("b"); reopens != 0 {
		t.Fatal("the token was touched while another process held the lock")
	}

	// Manual: gives up with ErrInProgress when its context ends first...
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	_, err = h.r.Recover(ctx, "b")
	cancel()
	if !errors.Is(err, ErrInProgress) {
		t.Fatalf("manual recovery under a held lock: %v", err)
	}
	// ...and runs as soon as the holder lets go.
	done := make(chan error, 1)
	go func() {
		_, err := h.r.Recover(t.Context(), "b")
		done <- err
	}()
	other.Close()
	if err := <-done; err != nil {
		t.Fatalf("manual recovery after the lock was released: %v", err)
	}
	if state, reopens, _ := h.eng.get("b"); state != "active" || reopens != 1 {
		t.Fatalf("member %s after %d re-opens", state, reopens)
	}
}

func TestConflictKeepsMemberOut(t *testing.T) {
	conflict := hasync.Conflict{
		Identity: object.Identity{Class: 3, KeyType: 3, ID: []byte{1}, Label: "dup"},
		Versions: []hasync.Version{{Fingerprint: []byte{0xaa}, Members: []string{"a", "c"}}, {Fingerprint: []byte{0xbb}, Members: []string{"b"}}},
	}
	h := newHarness(t, -1, func(o *Options) {
		o.CatchUp = func(context.Context, hasync.PlanMember, []hasync.PlanMember) (CatchUp, error) {
			return CatchUp{Passes: 1}, &ConflictError{Member: "b", Conflicts: []hasync.Conflict{conflict}}
		}
	})
	h.eng.fail("b")
	h.clk.waitArmed(t)
	h.clk.Advance(time.Second)
	ce := h.ev.next(t, ConflictFound)
	if len(ce.Conflicts) != 1 || !strings.Contains(ce.Err.Error(), "aa on a,c") || !strings.Contains(ce.Err.Error(), "bb on b") {
		t.Fatalf("conflict event: %+v", ce)
	}
	f := h.ev.next(t, AttemptFailed)
	if !errors.Is(f.Err, object.ErrConflict) {
		t.Fatalf("failure cause: %v", f.Err)
	}
	if state, _, acts := h.eng.get("b"); state != "failed" || acts != 0 {
		t.Fatalf("member with a conflict is %s (%d activations)", state, acts)
	}
	if st := h.r.Status("b"); len(st.Conflicts) != 1 {
		t.Fatalf("status conflicts: %+v", st.Conflicts)
	}
}

// Changing the retry count gives failed members a fresh budget, including
// those that had given up.
func TestReconfigure(t *testing.T) {
	h := newHarness(t, 1, nil)
	h.eng.setDown("a", true)
	h.eng.fail("a")
	h.tick(t)
	h.ev.next(t, GaveUp)
	if err := h.r.Reconfigure(500*time.Millisecond, 2); err == nil {
		t.Fatal("interval below 1s accepted")
	}
	if err := h.r.Reconfigure(2*time.Second, 2); err != nil {
		t.Fatal(err)
	}
	st := h.r.Status("a")
	if !st.Auto || st.GaveUp || st.AttemptsLeft != 2 {
		t.Fatalf("after raising retries: %+v", st)
	}
	h.clk.waitArmed(t)
	h.clk.Advance(time.Second) // the new interval is 2s: not yet
	h.clk.Advance(time.Second)
	if e := h.ev.next(t, AttemptFailed); e.AttemptsLeft != 1 {
		t.Fatalf("attempt after reconfigure: %+v", e)
	}
	if err := h.r.Reconfigure(time.Second, 0); err != nil {
		t.Fatal(err)
	}
	if st := h.r.Status("a"); st.Auto {
		t.Fatalf("retries 0 left attempts scheduled: %+v", st)
	}
}

// A member in service after a recovery gets the new retry count too: its
// status said "unlimited" after retries 0.
func TestReconfigureMemberInService(t *testing.T) {
	h := newHarness(t, 3, nil)
	h.eng.fail("a")
	if e := h.tick(t); e.Kind != Recovered {
		t.Fatalf("first attempt: %+v", e)
	}
	for _, retries := range []int{0, 5, -1} {
		if err := h.r.Reconfigure(time.Second, retries); err != nil {
			t.Fatal(err)
		}
		if st := h.r.Status("a"); st.AttemptsLeft != retries || st.Auto {
			t.Errorf("after retries %d, the member in service has %+v", retries, st)
		}
	}
}

// Close cancels a running attempt (the member is failed again) and waits
// for it.
func TestCloseCancelsAttempt(t *testing.T) {
	entered := make(chan struct{})
	h := newHarness(t, -1, func(o *Options) {
		o.CatchUp = func(ctx context.Context, _ hasync.PlanMember, _ []hasync.PlanMember) (CatchUp, error) {
			close(entered)
			<-ctx.Done()
			return CatchUp{}, ctx.Err()
		}
	})
	h.eng.fail("a")
	h.clk.waitArmed(t)
	h.clk.Advance(time.Second)
	<-entered
	if err := h.r.Close(); err != nil {
		t.Fatal(err)
	}
	if state, _, _ := h.eng.get("a"); state != "failed" {
		t.Fatalf("member %s after Close", state)
	}
	if _, err := h.r.Recover(t.Context(), "a"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Recover after Close: %v", err)
	}
}

// Several members fail at once: each has its own schedule and budget, and
// their attempts do not wait for one another.
func TestMembersIndependent(t *testing.T) {
	h := newHarness(t, 2, nil)
	h.eng.setDown("a", true)
	h.eng.fail("a")
	h.eng.fail("c")
	for h.clk.pending() < 2 {
		select {
		case <-h.clk.created:
		case <-time.After(10 * time.Second):
			t.Fatal("two timers not armed")
		}
	}
	h.clk.Advance(time.Second)
	var got []string
	for len(got) < 2 {
		select {
		case e := <-h.ev.ch:
			if e.Kind == Recovered || e.Kind == AttemptFailed {
				got = append(got, e.Member+":"+string(e.Kind))
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("outcomes so far: %v", got)
		}
	}
	sort.Strings(got)
	if got[0] != "a:recovery_failed" || got[1] != "c:recovery_succeeded" {
		t.Fatalf("outcomes %v", got)
	}
	if st := h.r.Status("a"); st.AttemptsLeft != 1 {
		t.Fatalf("a: %+v", st)
	}
}

// An event's detail, as the agent and libhapkcs11.so write it to the HA
// event log, says what the recovery did.
func TestEventDetail(t *testing.T) {
	for _, tc := range []struct {
		e    Event
		want string
	}{
		{Event{Kind: Recovered, Attempt: 3, Copied: 5, Deleted: 2}, "attempt 3: copied 5, deleted 2"},
		{Event{Kind: Recovered, Manual: true}, "manual: copied 0, deleted 0"},
		{Event{Kind: AttemptFailed, Attempt: 1, Err: errors.New("re-open token: connection refused")}, "attempt 1: re-open token: connection refused"},
		{Event{Kind: AttemptStarted}, ""},
	} {
		if got := tc.e.Detail(); got != tc.want {
			t.Errorf("Detail of %+v = %q, want %q", tc.e, got, tc.want)
		}
	}
}
