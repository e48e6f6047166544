package ha

import (
	"context"
	"time"

	"github.com/hagroup/hagroup/pkg/recover"
)

// followMarks makes a long-lived process (an agent, an application's
// worker that runs for days) follow the behind marks the other processes
// and hosts leave, not only read them at login: every interval it reads
// the marks on the serving members (one FindObjects per member), takes a
// member marked behind out of rotation and catches it up, as a login
// does. Without it, a key another host destroyed while the member was
// away from that host stays usable here on that member until the process
// restarts. It runs until stop is called; stop waits for it.
func (h *Group) followMarks(every, timeout time.Duration) (stop func()) {
	if every < recover.MinInterval {
		every = recover.MinInterval
	}
	return periodically(context.Background(), every, func(ctx context.Context) { h.admitMarked(ctx, timeout) })
}

// admitMarked reads the marks once and catches up the members found
// behind, within one command_timeout; a catch-up not done by then goes on
// as automatic recovery. Then it removes what failed creations left on
// serving members that this process's checks have seen for long enough
// (recover.Recoverer.RemoveHalfMade; free when they saw none): no
// catch-up comes for a member that never fails. A failed removal is
// tried again next interval.
func (h *Group) admitMarked(ctx context.Context, timeout time.Duration) {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if names := h.g.FollowMarks(rctx); len(names) > 0 {
		catchUp(rctx, h.rec, names)
	}
	_, _ = h.rec.RemoveHalfMade(rctx)
}
