package ha

import (
	"github.com/hagroup/hagroup/pkg/fleet"
	"github.com/hagroup/hagroup/pkg/recover"
)

// reportRecovery returns next extended to report each recoverer event of
// group label to r (next alone when r is nil).
func reportRecovery(r *fleet.Reporter, label string, next func(recover.Event)) func(recover.Event) {
	if r == nil {
		return next
	}
	return func(e recover.Event) {
		if next != nil {
			next(e)
		}
		r.RecoveryEvent(label, e)
	}
}
