package sync

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
)

// HoldsDomainKey reports whether s holds the group's domain key (found;
// audited as every use of it is), from the handle remembered for s's
// login epoch when there is one.
func (r *Replicator) HoldsDomainKey(ctx context.Context, s *slot.Slot) (bool, error) {
	_, _, _, err := r.domainKey(ctx, s)
	switch {
	case err == nil, errors.Is(err, domainkey.ErrWeak):
		return true, nil
	case errors.Is(err, domainkey.ErrNotFound):
		return false, nil
	}
	return false, err
}

// KeepsWrapOnlyKey reports whether the token of s keeps a wrap-only key
// (domainkey.WrapOnlyFlaws), asked once per slot, and with Facts once per
// token on the host; a *domainkey.NoWrapOnlyKeyError says why not.
func (r *Replicator) KeepsWrapOnlyKey(ctx context.Context, s *slot.Slot) error {
	r.mu.Lock()
	st := r.stateLocked(s)
	known, flaws := st.wrapOnlyKnown, st.wrapOnlyFlaws
	r.mu.Unlock()
	if !known {
		var err error
		if flaws, err = r.wrapOnlyFlaws(ctx, s); err != nil {
			return err
		}
		r.mu.Lock()
		st.wrapOnlyKnown, st.wrapOnlyFlaws = true, flaws
		r.mu.Unlock()
	}
	if len(flaws) > 0 {
		return &domainkey.NoWrapOnlyKeyError{Member: s.Name(), Flaws: flaws}
	}
	return nil
}

func (r *Replicator) wrapOnlyFlaws(ctx context.Context, s *slot.Slot) ([]string, error) {
	if flaw := domainkey.PairOnly(s); flaw != nil {
		return flaw, nil // (whatever an older host stored)
	}
	key := ""
	if tk := tokenKey(s); tk != "" && r.Facts != nil {
		key = "wraponly\x00" + tk
		if b, ok := r.Facts.Load(key); ok {
			var flaws []string
			if json.Unmarshal(b, &flaws) == nil {
				return flaws, nil
			}
		}
	}
	flaws, err := domainkey.WrapOnlyFlaws(ctx, s)
	if err == nil && key != "" {
		if b, err := json.Marshal(flaws); err == nil {
			_ = r.Facts.Store(key, b)
		}
	}
	return flaws, err
}
