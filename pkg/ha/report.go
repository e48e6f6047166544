package ha

import (
	"github.com/hagroup/hagroup/pkg/fleet"
	"github.com/hagroup/hagroup/pkg/recovery"
)

// reportRecovery returns next extended to report each recoverer event of
// group label to r (next alone when r is nil).
func reportRecovery(r *fleet.Reporter, label string, next func(recovery.Event)) func(recovery.Event) {
	if r == nil {
		return next
	}
	return func(e recovery.Event) {
		if next != nil {
			next(e)
		}
		r.RecoveryEvent(label, e)
	}
}
