package group

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/hagroup/hagroup/pkg/replica"
	"github.com/hagroup/hagroup/pkg/replica/tombstone"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// Write-ahead intents of creations (tombstone.Tombstone.Intent): a key
// generation (or any creation) sent to the primary and never answered may
// have left an object there that the group never made; when that member
// returns, its catch-up would spread it as the group's. The intent is
// recorded before the call, settled on the answer, and published to the
// members when no answer came, so that every catch-up, on any host,
// destroys such a leftover instead (pkg/replica, PlanOptions.Returning).

// intender is implemented by the tombstones that keep intents
// (*tombstone.Shared).
type intender interface {
	Intend(ctx context.Context, ts []tombstone.Tombstone) ([]tombstone.Tombstone, error)
	Settle(ctx context.Context, ts []tombstone.Tombstone) error
	Publish(ctx context.Context)
}

// pendingCreation is one creation's intents, whether an attempt of it
// went unanswered, and whether one made the objects.
type pendingCreation struct {
	w          intender
	ts         []tombstone.Tombstone
	unanswered atomic.Bool
	made       atomic.Bool
}

// intend writes ahead the intents of the token objects ins are to make.
// One that cannot be written does not stop the creation (it is then not
// covered, and a tombstone_failed event says so); nil when there is
// nothing to cover.
func (g *Group) intend(ctx context.Context, op string, ins []intent) *pendingCreation {
	w, ok := g.tombstones.(intender)
	if !ok {
		return nil
	}
	var ts []tombstone.Tombstone
	for _, in := range ins {
		if !in.token || !in.classKnown {
			continue // a session object dies with its session; an unknown class names nothing
		}
		id := replica.Identity{Class: in.class, KeyType: replica.NoKeyType}
		if i := attrIndex(in.tmpl, pkcs11.CKA_ID); i >= 0 && len(in.tmpl[i].Value) > 0 {
			id.ID = in.tmpl[i].Value
		}
		if i := attrIndex(in.tmpl, pkcs11.CKA_LABEL); i >= 0 {
			id.Label = string(in.tmpl[i].Value)
		}
		ts = append(ts, tombstone.Tombstone{Identity: id})
	}
	if len(ts) == 0 {
		return nil
	}
	written, err := w.Intend(ctx, ts)
	if err != nil {
		g.emit(Event{Kind: TombstoneFailed, Err: fmt.Errorf("%s: %w; should the member not answer, its catch-up may spread what it made", op, err)})
		return nil
	}
	return &pendingCreation{w: w, ts: written}
}

// attempted notes one attempt's outcome: made, or a health error other
// than "not sent", after which the member may hold the object without
// having answered.
func (c *pendingCreation) attempted(err error) {
	switch {
	case c == nil:
	case err == nil:
		c.made.Store(true)
	case slot.ClassOf(err) == slot.ClassHealth && !errors.Is(err, slot.ErrNotSent):
		c.unanswered.Store(true)
	}
}

// settle ends the creation's intents once it returns err: revoked when it
// succeeded, or failed with every attempt answered and nothing made (the
// member refused); published to the serving members when it failed after
// an attempt went unanswered or made the objects (an undo that did not
// reach a member that then died leaves them there).
func (g *Group) settle(ctx context.Context, c *pendingCreation, err error) {
	if c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.commandDeadline())
	defer cancel()
	if err != nil && (c.unanswered.Load() || c.made.Load()) {
		c.w.Publish(ctx)
		return
	}
	if err := c.w.Settle(ctx, c.ts); err != nil {
		g.emit(Event{Kind: TombstoneFailed, Err: err})
	}
}
