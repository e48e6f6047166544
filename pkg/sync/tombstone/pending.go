package tombstone

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/hagroup/hagroup/pkg/slot"
)

// Intender keeps the intents of creations (Shared does).
type Intender interface {
	Intend(ctx context.Context, ts []Tombstone) ([]Tombstone, error)
	Settle(ctx context.Context, ts []Tombstone) error
	// Release ends the holds Intend took: the creation returned.
	Release(ts []Tombstone)
	Publish(ctx context.Context)
}

// Pending is one creation's intents while it runs, with what its attempts
// showed: whether one went unanswered, and whether one made the objects.
// Safe for concurrent use.
type Pending struct {
	w          Intender
	ts         []Tombstone
	unanswered atomic.Bool
	made       atomic.Bool
}

// Begin writes ahead the intents ts of a creation about to be sent.
func Begin(ctx context.Context, w Intender, ts []Tombstone) (*Pending, error) {
	written, err := w.Intend(ctx, ts)
	if err != nil {
		return nil, err
	}
	return &Pending{w: w, ts: written}, nil
}

// Attempted notes one attempt's outcome: made, or a health error other
// than "not sent", after which the member may hold the objects without
// having answered. A nil Pending notes nothing.
func (c *Pending) Attempted(err error) {
	switch {
	case c == nil:
	case err == nil:
		c.made.Store(true)
	case slot.ClassOf(err) == slot.ClassHealth && !errors.Is(err, slot.ErrNotSent):
		c.unanswered.Store(true)
	}
}

// End ends the intents once the creation returned err: revoked when it
// succeeded, or failed with every attempt answered and nothing made (the
// member refused); published to the members when it failed after an
// attempt went unanswered or made the objects (an undo that did not reach
// a member that then died leaves them there). A nil Pending ends nothing.
func (c *Pending) End(ctx context.Context, err error) error {
	if c == nil {
		return nil
	}
	if err != nil && (c.unanswered.Load() || c.made.Load()) {
		// No longer in flight: published, and a catch-up may take back
		// what it left.
		c.w.Release(c.ts)
		c.w.Publish(ctx)
		return nil
	}
	defer c.w.Release(c.ts) // settled first: never standing and unheld
	return c.w.Settle(ctx, c.ts)
}
