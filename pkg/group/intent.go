package group

import (
	"context"
	"fmt"

	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/hagroup/hagroup/pkg/sync/tombstone"
	"github.com/miekg/pkcs11"
)

// Write-ahead intents of creations (tombstone.Tombstone.Intent): a key
// generation (or any creation) sent to the primary and never answered may
// have left an object there that the group never made; when that member
// returns, its catch-up would spread it as the group's. The intent is
// recorded before the call, settled on the answer, and published to the
// members when no answer came, so that every catch-up, on any host,
// destroys such a leftover instead (pkg/sync, PlanOptions.Returning).

// intend writes ahead the intents of the token objects ins are to make.
// One that cannot be written does not stop the creation (it is then not
// covered, and a tombstone_failed event says so); nil when there is
// nothing to cover.
func (g *Group) intend(ctx context.Context, op string, ins []intent) *tombstone.Pending {
	w, ok := g.tombstones.(tombstone.Intender)
	if !ok {
		return nil
	}
	var ts []tombstone.Tombstone
	for _, in := range ins {
		if !in.token || !in.classKnown {
			continue // a session object dies with its session; an unknown class names nothing
		}
		id := object.Identity{Class: in.class, KeyType: object.NoKeyType}
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
	pending, err := tombstone.Begin(ctx, w, ts)
	if err != nil {
		g.emit(Event{Kind: TombstoneFailed, Err: fmt.Errorf("%s: %w; should the member not answer, its catch-up may spread what it made", op, err)})
		return nil
	}
	return pending
}

// settle ends the creation's intents once it returns err
// (tombstone.Pending.End), within one command deadline even when ctx ended.
func (g *Group) settle(ctx context.Context, c *tombstone.Pending, err error) {
	if c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.commandDeadline())
	defer cancel()
	if err := c.End(ctx, err); err != nil {
		g.emit(Event{Kind: TombstoneFailed, Err: err})
	}
}
