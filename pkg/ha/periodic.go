package ha

import (
	"context"
	"time"
)

// periodically runs fn every interval, in a goroutine of its own, until
// ctx ends or the returned stop is called; stop waits for the goroutine
// to end.
func periodically(ctx context.Context, every time.Duration, fn func(ctx context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			fn(ctx)
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
