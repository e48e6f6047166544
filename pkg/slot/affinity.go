package slot

import (
	"context"
	"sync"
)

// An Affinity ties a caller — typically one application session, used by
// one thread at a time — to the pooled session it used last on each slot:
// a call whose context carries it (WithAffinity) takes that session again
// when it is idle, and otherwise the pool's top one.
//
// It matters for the sessions with a lane or a spinning worker. Two
// application threads taking sessions from the pool in turn would each
// wake, call after call, the worker that the other one woke last, on the
// other CPU: cross-CPU wake-ups, and threads migrating after them. Kept
// together, a caller and its worker settle on one CPU and hand each call
// over there. Measured with 2 ECDSA signing threads through libhapkcs11.so
// on the 2-vCPU development VM (perf record -e sched:sched_wakeup): 5,136
// of 17,381 wake-ups crossed CPUs without it (the lanes' spinning turned
// off for that run), 1,156 of 17,710 with it.
//
// The zero value is ready to use; an Affinity may be shared, but a caller
// of its own is what it is for.
type Affinity struct {
	mu   sync.Mutex
	last []affine // one per slot, few: a group has a handful of members
}

type affine struct {
	slot *Slot
	x    *sess
}

type affinityKey struct{}

// WithAffinity returns a context whose calls keep to a's sessions.
func WithAffinity(ctx context.Context, a *Affinity) context.Context {
	return context.WithValue(ctx, affinityKey{}, a)
}

func affinityOf(ctx context.Context) *Affinity {
	a, _ := ctx.Value(affinityKey{}).(*Affinity)
	return a
}

// lastOn is the session a used last on s, nil when none.
func (a *Affinity) lastOn(s *Slot) *sess {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range a.last {
		if e.slot == s {
			return e.x
		}
	}
	return nil
}

// remember records x as the session a used last on s.
func (a *Affinity) remember(s *Slot, x *sess) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range a.last {
		if a.last[i].slot == s {
			a.last[i].x = x
			return
		}
	}
	a.last = append(a.last, affine{slot: s, x: x})
}
