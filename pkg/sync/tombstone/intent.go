package tombstone

import (
	"context"
	"fmt"
)

// Intend writes ahead, to the local record only, the intents of a
// creation about to be sent to a member (Tombstone.Intent; their Time is
// set here when zero) and returns them as written, for Settle and
// Release. Nothing reaches the members yet: a creation answered, the
// common case, costs two local writes and none on the members. Each
// intent is held (inflight.go) before it is written, until Release: while
// the creation runs no process acts on it or spreads it. A process that
// dies before the answer leaves its intents in the local record, no
// longer held, which the next process's first write on each member, a
// Publish, and every plan's repair spread.
func (s *Shared) Intend(ctx context.Context, ts []Tombstone) ([]Tombstone, error) {
	out := make([]Tombstone, 0, len(ts))
	for _, t := range ts {
		t.Intent, t.Revoked, t.Fingerprint = true, false, nil
		if t.GroupSerial == "" {
			t.GroupSerial = s.serial
		}
		if t.Time.IsZero() {
			t.Time = s.opts.Now()
		}
		if err := s.hold(t); err != nil {
			s.Release(out)
			return nil, err
		}
		out = append(out, t)
		if err := s.local.Record(ctx, t); err != nil {
			s.Release(out)
			return nil, fmt.Errorf("record the intent to make %s: %w", t.Identity, err)
		}
	}
	return out, nil
}

// hold holds intent t until Release, when the local record can.
func (s *Shared) hold(t Tombstone) error {
	h, ok := s.local.(holder)
	if !ok {
		return nil
	}
	release, err := h.Hold(t)
	if err != nil {
		return err
	}
	s.holdMu.Lock()
	defer s.holdMu.Unlock()
	if s.holds == nil {
		s.holds = map[string]func(){}
	}
	s.holds[revocationKey(t)] = release
	return nil
}

// Settle revokes, once the member answered, the intents written by Intend
// and every other intent still standing for the same identities: what the
// group holds under them now is what it made (a creation that succeeds
// after one that was never answered makes the old leftover a conflict to
// report, never a key to destroy). The revocation of an intent this
// process published reaches the members with its next destroy (spreadAll);
// others with the next plan's repair.
func (s *Shared) Settle(ctx context.Context, ts []Tombstone) error {
	ids := map[string]bool{}
	for _, t := range ts {
		ids[intentKey(t.Identity)] = true
	}
	standing, err := s.local.Records(ctx)
	if err != nil {
		return fmt.Errorf("settle intents: %w", err)
	}
	records := newRecordSet(standing...) // a revocation replaces its record
	for _, t := range records {
		if !t.Intent || t.Revoked || !ids[intentKey(t.Identity)] {
			continue
		}
		if err := s.local.Record(ctx, t.Revocation()); err != nil {
			return fmt.Errorf("settle the intent to make %s: %w", t.Identity, err)
		}
		if s.published.Load() {
			s.spreadAll.Store(true) // the intent may be on the members
		}
	}
	return nil
}

// Publish writes the local record to every serving member now: after a
// creation that was never answered, so that every process on every host
// sees its intents before the member that may hold the object returns.
func (s *Shared) Publish(ctx context.Context) {
	s.published.Store(true)
	s.spread(ctx)
}
