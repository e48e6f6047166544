package sync

import (
	"context"

	"github.com/hagroup/hagroup/pkg/slot"
)

// DomainKeyTrusted reports whether the group's domain key on s is
// CKA_TRUSTED, from the handle and flag this Replicator keeps for s's
// login epoch (found and audited once per epoch, as for a copy): a
// creation asks it for every key it makes, and a search of the token each
// time would cost as much as the token holds objects.
func (r *Replicator) DomainKeyTrusted(ctx context.Context, s *slot.Slot) (bool, error) {
	_, trusted, _, err := r.domainKey(ctx, s)
	return trusted, err
}
