package config

import (
	"context"
	"os"

	"github.com/hagroup/hagroup/internal/filelock"
)

// lockFile takes an exclusive flock on path, creating it (mode 0600) when
// needed, and returns the function that releases it and the one that
// releases it and removes the file. It waits until the lock is free or ctx
// is done.
//
// The lock file may be removed by its holder (an Edit that created
// nothing), so a lock taken on a file that is no longer the one at path is
// let go and taken again on the new one: two editors never hold locks on
// different files.
func lockFile(ctx context.Context, path string) (unlock, unlockAndRemove func(), err error) {
	for {
		f, err := filelock.Lock(ctx, path, 0o600)
		if err != nil {
			return nil, nil, err
		}
		held, herr := f.Stat()
		now, nerr := os.Stat(path)
		if herr == nil && nerr == nil && os.SameFile(held, now) {
			return func() { f.Close() }, func() { os.Remove(path); f.Close() }, nil
		}
		f.Close()
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
	}
}
