package sync

import "context"

// Progress is how far an Apply has come: Done of its Total actions, the
// last one on Member.
type Progress struct {
	Done, Total int
	Member      string
}

type progressKey struct{}

// WithProgress returns a context under which Apply calls fn after each
// action it carries out or gives up on. The calls come one at a time,
// from Apply's goroutines, and hold up the next action while they run:
// fn must be quick and must not block.
func WithProgress(ctx context.Context, fn func(Progress)) context.Context {
	return context.WithValue(ctx, progressKey{}, fn)
}

// progressOf returns the progress callback of ctx, or one that does
// nothing.
func progressOf(ctx context.Context) func(Progress) {
	if fn, ok := ctx.Value(progressKey{}).(func(Progress)); ok && fn != nil {
		return fn
	}
	return func(Progress) {}
}
