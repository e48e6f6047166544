// Package filelock takes advisory flock(2) locks on files shared by several
// processes on one host (the agent and every application process using a
// group): the host-wide recovery and store locks of a member, the
// tombstone journal's lock, the configuration file's edit lock.
//
// Every acquisition opens a descriptor of its own: flock locks belong to the
// open file description, so two goroutines sharing one descriptor would
// share (and release) each other's lock. Closing the returned file releases
// the lock.
package filelock

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// ErrBusy is returned by TryLock when another descriptor holds the lock.
var ErrBusy = errors.New("lock held by another")

// Lock takes an exclusive lock on path, creating the file with exactly perm
// when it is missing, and waits for it as long as ctx allows. Closing the
// returned file releases the lock. A caller that may read but not write an
// existing lock file still gets the lock (flock needs no write access).
func Lock(ctx context.Context, path string, perm os.FileMode) (*os.File, error) {
	return lock(ctx, path, unix.LOCK_EX, perm, true)
}

// LockShared takes a shared lock on path, creating the file with exactly
// perm when it is missing, and waits for it as long as ctx allows.
func LockShared(ctx context.Context, path string, perm os.FileMode) (*os.File, error) {
	return lock(ctx, path, unix.LOCK_SH, perm, true)
}

// TryLock takes an exclusive lock on path without waiting: when another
// holds it, it returns an error wrapping ErrBusy at once.
func TryLock(path string, perm os.FileMode) (*os.File, error) {
	return lock(context.Background(), path, unix.LOCK_EX, perm, false)
}

// OpenShared opens path with flag; when flag has O_CREATE and the file is
// new, it gets exactly perm (not perm less the umask), because state shared
// between processes may be shared by different users of one group.
func OpenShared(path string, flag int, perm os.FileMode) (*os.File, error) {
	if flag&os.O_CREATE != 0 {
		f, err := os.OpenFile(path, flag|os.O_EXCL, perm)
		if err == nil {
			if err := f.Chmod(perm); err != nil {
				f.Close()
				return nil, fmt.Errorf("set mode of %s: %w", path, err)
			}
			return f, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, err
		}
		flag &^= os.O_CREATE
	}
	return os.OpenFile(path, flag, perm)
}

func lock(ctx context.Context, path string, how int, perm os.FileMode, wait bool) (*os.File, error) {
	if err := context.Cause(ctx); err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	f, err := OpenShared(path, os.O_RDWR|os.O_CREATE, perm)
	if errors.Is(err, fs.ErrPermission) {
		// One who may not write the lock file can still lock it: flock
		// needs only an open descriptor.
		f, err = os.Open(path)
	}
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	err = unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
	if err == nil {
		return f, nil
	}
	if !errors.Is(err, unix.EWOULDBLOCK) {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if !wait {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, ErrBusy)
	}
	// Held by someone else: wait in a goroutine so ctx can end the wait.
	// If ctx wins, the goroutine still owns f and closes it (releasing the
	// lock it may have got by then).
	done := make(chan error) // unbuffered: a result nobody takes is abandoned
	abandon := make(chan struct{})
	go func() {
		err := flockRetry(f, how)
		select {
		case done <- err:
		case <-abandon:
			f.Close()
		}
	}()
	select {
	case err := <-done:
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		return f, nil
	case <-ctx.Done():
		close(abandon)
		return nil, fmt.Errorf("lock %s: %w", path, context.Cause(ctx))
	}
}

// LockBriefly takes an exclusive lock on path as Lock does, for a lock
// that is held briefly and waited for briefly: it tries without blocking,
// and again after a pause that doubles from 1 ms to 32 ms, until it gets
// the lock or ctx ends. Unlike Lock's, its wait leaves nothing behind when
// ctx ends first: Lock's goroutine, with the thread it blocks in flock,
// stays until the holder lets go, and a holder that is stopped or hung
// would gather one for every wait given up.
func LockBriefly(ctx context.Context, path string, perm os.FileMode) (*os.File, error) {
	pause := time.Millisecond
	for {
		f, err := lock(ctx, path, unix.LOCK_EX, perm, false)
		if !errors.Is(err, ErrBusy) {
			return f, err
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("lock %s: %w", path, context.Cause(ctx))
		}
		pause = min(2*pause, 32*time.Millisecond)
	}
}

// flockRetry takes a blocking flock, retrying when a signal interrupts it.
func flockRetry(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
