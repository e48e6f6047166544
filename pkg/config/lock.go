package config

import (
	"context"

	"github.com/hagroup/hagroup/internal/filelock"
)

// lockFile takes an exclusive flock on path, creating it (mode 0600) when
// needed, and returns the function that releases it. It waits until the
// lock is free or ctx is done.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := filelock.Lock(ctx, path, 0o600)
	if err != nil {
		return nil, err
	}
	return func() { f.Close() }, nil
}
