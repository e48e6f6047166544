package filelock

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

func TestExclusiveExcludesAndReleases(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	ctx := context.Background()
	a, err := Lock(ctx, path, 0o660)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := TryLock(path, 0o660); !errors.Is(err, ErrBusy) {
		t.Fatalf("TryLock while held: %v, want ErrBusy", err)
	}
	got := make(chan error, 1)
	go func() {
		f, err := Lock(ctx, path, 0o660)
		if err == nil {
			f.Close()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("second Lock returned %v while the first was held", err)
	default:
	}
	a.Close()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("second Lock after release: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("second Lock still waiting 10 s after release")
	}
}

func TestWaitEndsWithContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	a, err := Lock(context.Background(), path, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := Lock(ctx, path, 0o600); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock under held lock: %v, want deadline exceeded", err)
	}
	// The abandoned waiter must not keep the lock once the holder lets go.
	a.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		f, err := TryLock(path, 0o600)
		if err == nil {
			f.Close()
			break
		}
		if !errors.Is(err, ErrBusy) || time.Now().After(deadline) {
			t.Fatalf("lock not free after the holder and an abandoned waiter: %v", err)
		}
		time.Sleep(5 * time.Millisecond) // polling a free-by-deadline condition
	}
}

func TestSharedLocksShareAndExcludeWriters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	ctx := context.Background()
	r1, err := LockShared(ctx, path, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := LockShared(ctx, path, 0o640)
	if err != nil {
		t.Fatalf("second shared lock: %v", err)
	}
	if _, err := TryLock(path, 0o640); !errors.Is(err, ErrBusy) {
		t.Fatalf("exclusive under shared: %v, want ErrBusy", err)
	}
	r1.Close()
	r2.Close()
	w, err := TryLock(path, 0o640)
	if err != nil {
		t.Fatalf("exclusive after readers left: %v", err)
	}
	w.Close()
}

func TestCreatedWithExactMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	f, err := Lock(context.Background(), path, 0o664)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o664 {
		t.Fatalf("lock file mode %v, want 0664 whatever the umask", fi.Mode().Perm())
	}
}

// TestAcrossProcesses holds the lock in this process and checks that a
// flock(1) in another process cannot take it, then can.
func TestAcrossProcesses(t *testing.T) {
	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("flock(1) not installed")
	}
	path := filepath.Join(t.TempDir(), "x.lock")
	f, err := Lock(context.Background(), path, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := exec.Command("flock", "-n", "-x", path, "true").Run(); err == nil {
		t.Fatal("another process took the lock while this one held it")
	}
	f.Close()
	if out, err := exec.Command("flock", "-n", "-x", path, "true").CombinedOutput(); err != nil {
		t.Fatalf("another process could not take the released lock: %v %s", err, out)
	}
}

// LockBriefly waits while another holds the lock and takes it once let
// go; a wait that ends with its ctx leaves no goroutine behind it, blocked
// in flock until the holder lets go (Lock's would).
func TestLockBrieflyLeavesNoWaiter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	held, err := Lock(context.Background(), path, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	for range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		_, err := LockBriefly(ctx, path, 0o600)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("LockBriefly under a held lock: %v, want deadline exceeded", err)
		}
	}
	if after := runtime.NumGoroutine(); after > before {
		t.Errorf("%d goroutines after 20 waits given up, %d before", after, before)
	}
	got := make(chan error, 1)
	go func() {
		f, err := LockBriefly(context.Background(), path, 0o600)
		if err == nil {
			f.Close()
		}
		got <- err
	}()
	held.Close()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("LockBriefly once the holder let go: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("LockBriefly still waits 10 s after the holder let go")
	}
}
