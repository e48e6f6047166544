package recover

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/filelock"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
)

// lockPath is where the host-wide recovery lock of member name lives.
func (r *rig) lockPath(name string) string {
	r.t.Helper()
	dir := filepath.Join(r.stateDir, r.cfg.Serial)
	if err := os.MkdirAll(dir, 0o770); err != nil {
		r.t.Fatal(err)
	}
	return filepath.Join(dir, name+".recover.lock")
}

// holdLock takes member name's recovery lock as another process's
// recovery would (flock locks belong to the open file, so a descriptor of
// the test's own is "another process"), and says it is held by pid 4242.
// The returned func lets go.
func (r *rig) holdLock(name string) func() {
	r.t.Helper()
	f, err := filelock.TryLock(r.lockPath(name), 0o660)
	if err != nil {
		r.t.Fatalf("hold the recovery lock of %s: %v", name, err)
	}
	f.Truncate(0)
	f.WriteAt([]byte("4242\n"), 0)
	return func() { f.Close() }
}

// tryLock reports whether member name's recovery lock is free now, the
// way another process's automatic attempt tries it (without waiting).
func (r *rig) tryLock(name string) bool {
	r.t.Helper()
	f, err := filelock.TryLock(r.lockPath(name), 0o660)
	if errors.Is(err, filelock.ErrBusy) {
		return false
	}
	if err != nil {
		r.t.Fatalf("try the recovery lock of %s: %v", name, err)
	}
	f.Close()
	return true
}

// A check (what haagent runs every interval) takes no member's recovery
// lock: another process recovering a member is neither waited for nor
// refused while the check lists. Soak seed 1796066289750673554: haagent's
// periodic check took every serving member's lock, waiting with no
// deadline, and held them while it listed; the Go engine's automatic
// attempts (a try, once an interval) were refused 90 times in a row and
// its failed member never came back.
func TestCheckTakesNoRecoveryLock(t *testing.T) {
	f := slottest.NewFaults()
	r := newRig(t, rigOpts{retries: 0, interceptor: f})
	r.genEC(r.session(), "before-check")
	listing, recovering := r.name(0), r.name(2)

	// Another process is recovering one member (from its point of view
	// the member is failed; here it serves), and one member's listing
	// is slow, so the check is caught in the middle.
	release := r.holdLock(recovering)
	defer release()
	f.Hang(listing, slot.OpFindObjects)

	type result struct {
		rep *SyncReport
		err error
	}
	done := make(chan result, 1)
	ctx := rigCtx(t)
	go func() {
		rep, err := r.rec.Synchronize(ctx, SyncOptions{Check: true})
		done <- result{rep, err}
	}()
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	err := f.WaitHung(wctx, listing, 1)
	cancel()
	if err != nil {
		select {
		case res := <-done:
			t.Fatalf("the check never listed %s: it ended with %v", listing, res.err)
		default:
			t.Fatalf("the check never listed %s (it waits for the recovery lock of %s held by another process?): %v", listing, recovering, err)
		}
	}
	// While the check lists, every other member's lock is free: an
	// automatic attempt in another process would run.
	for i := range r.toks {
		if name := r.name(i); name != recovering && !r.tryLock(name) {
			t.Errorf("the recovery lock of %s is held while a check lists: another process's recovery of it is refused", name)
		}
	}
	f.Release(listing)
	res := <-done
	if res.err != nil {
		t.Fatalf("check: %v", res.err)
	}
	if !res.rep.InSync() {
		t.Fatalf("check of an equal group: actions %v, conflicts %v, skipped %v, not serving %v",
			res.rep.Plan.Actions, res.rep.Plan.Conflicts, res.rep.Plan.Skipped, res.rep.NotServing)
	}
	if res.rep.Applied != nil {
		t.Fatal("a check applied something")
	}
}

// A synchronisation that applies takes the members' recovery locks, but
// waits for one held by a recovery at most SyncOptions.LockWait, and holds
// no other member's lock while it waits.
func TestSynchronizeLockWaitIsBoundedAndHoldsNothing(t *testing.T) {
	r := newRig(t, rigOpts{retries: 0})
	r.genEC(r.session(), "before-sync")
	names := []string{r.name(0), r.name(1), r.name(2)}
	sort.Strings(names)
	last := names[len(names)-1] // locked last in name order

	release := r.holdLock(last)
	start := time.Now()
	_, err := r.rec.Synchronize(rigCtx(t), SyncOptions{LockWait: 300 * time.Millisecond})
	if !errors.Is(err, ErrInProgress) {
		t.Fatalf("synchronize against a held lock: %v, want ErrInProgress", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("synchronize waited %v with LockWait 300ms", took)
	}
	for _, want := range []string{last, "process 4242"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}

	// It said what it waited for.
	if e := r.rev.next(t, LockWaiting); e.Member != last || !errors.Is(e.Err, ErrInProgress) {
		t.Fatalf("synchronize against a held lock: event %+v, want %s for %s naming the holder", e, LockWaiting, last)
	}

	// While it waits for the last member, the others are free.
	done := make(chan error, 1)
	go func() {
		_, err := r.rec.Synchronize(rigCtx(t), SyncOptions{LockWait: time.Minute})
		done <- err
	}()
	waitLockWaiting(t, r.rev, last, done)
	for _, name := range names[:len(names)-1] {
		if !r.tryLock(name) {
			t.Errorf("the recovery lock of %s is held while synchronize waits for %s's: its recovery in another process is refused", name, last)
		}
	}
	release()
	if err := <-done; err != nil {
		t.Fatalf("synchronize after the lock was released: %v", err)
	}
}

// waitLockWaiting waits (20 s at most) for the LockWaiting event of member
// name: the synchronisation has let go of every other lock and waits for
// name's. done ending first fails the test.
func waitLockWaiting(t *testing.T, ev *events, name string, done <-chan error) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case e := <-ev.ch:
			if e.Kind == LockWaiting && e.Member == name {
				return
			}
		case err := <-done:
			t.Fatalf("synchronize ended without waiting for the recovery lock of %s: %v", name, err)
		case <-deadline:
			t.Fatalf("synchronize did not wait for the recovery lock of %s within 20 s", name)
		}
	}
}
