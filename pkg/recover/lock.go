package recover

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// openShared opens path with flag; when flag has O_CREATE and the file is
// new, it gets exactly perm (not perm less the umask), because the state
// directory is shared by the agent and every application process on the
// host, which may run as different users of one group.
func openShared(path string, flag int, perm os.FileMode) (*os.File, error) {
	if flag&os.O_CREATE != 0 {
		f, err := os.OpenFile(path, flag|os.O_EXCL, perm)
		if err == nil {
			if err := f.Chmod(perm); err != nil {
				f.Close()
				return nil, err
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

// errBusy is returned by flock without wait when another holds the lock.
var errBusy = errors.New("lock held by another")

// flock opens path (creating it with perm) and takes an flock of kind how
// (unix.LOCK_SH or unix.LOCK_EX) on a descriptor of its own. When the lock
// is held elsewhere it returns errBusy at once, or with wait, waits until
// ctx is done. Closing the returned file releases the lock.
//
// A fresh descriptor per acquisition matters: flock locks belong to the
// open file description, so two goroutines sharing one descriptor would
// share (and release) each other's lock.
func flock(ctx context.Context, path string, how int, perm os.FileMode, wait bool) (*os.File, error) {
	f, err := openShared(path, os.O_RDWR|os.O_CREATE, perm)
	if errors.Is(err, fs.ErrPermission) && how == unix.LOCK_SH {
		// A reader that may not write the lock file can still share it.
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
		return nil, errBusy
	}
	// Held by someone else: wait in a goroutine so ctx can end the wait.
	// If ctx wins, the goroutine still owns f and closes it (releasing
	// the lock it may have got by then).
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

// flockRetry takes a blocking flock, retrying when a signal interrupts it.
func flockRetry(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
