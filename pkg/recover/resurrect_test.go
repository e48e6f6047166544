package recover

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/slot"
	hasync "github.com/hagroup/hagroup/pkg/sync"
	"github.com/hagroup/hagroup/pkg/sync/tombstone"
)

// hookOnce is a slot.WrapInterceptor that runs fn once, just before the
// first call of op on token after it is armed.
type hookOnce struct {
	mu    sync.Mutex
	token string
	ops   map[slot.Op]bool
	fn    func()
}

func (h *hookOnce) arm(token string, fn func(), ops ...slot.Op) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.token, h.fn, h.ops = token, fn, map[slot.Op]bool{}
	for _, op := range ops {
		h.ops[op] = true
	}
}

func (h *hookOnce) Before(context.Context, string, slot.Op) error { return nil }

func (h *hookOnce) Wrap(_ context.Context, token string, op slot.Op, call func() error) error {
	h.mu.Lock()
	var fn func()
	if h.fn != nil && token == h.token && h.ops[op] {
		fn, h.fn = h.fn, nil
	}
	h.mu.Unlock()
	if fn != nil {
		fn()
	}
	return call()
}

// S2 of the chaos soak: key pairs destroyed while a member was away came
// back after its recovery. A key pair is destroyed, while the recovering
// member is away, during the recovery's listing of the serving member:
//
//   - through this process's group (the in-process path of the Go API and
//     of libhapkcs11): the recovery read the tombstones before listing,
//     so it copied the pair back from the member that was away, and the
//     final pass then found it on every member and took it for made
//     again;
//   - by another process (haagent, or an application through
//     libhapkcs11, destroying on the members and then recording the
//     tombstone), whose tombstone lands only while the recovery copies
//     the pair back.
//
// Either way the pair must stay destroyed on every member, and the member
// return to rotation.
func TestKeyDestroyedDuringRecoveryStaysGone(t *testing.T) {
	for _, how := range []string{"this process", "another process"} {
		t.Run(how, func(t *testing.T) {
			hook := &hookOnce{}
			r := newRig(t, rigOpts{n: 2, retries: 0, interceptor: hook})
			serving, victim := r.name(0), r.name(1)
			s := r.session()
			pub, priv := r.genEC(s, "doomed")
			r.genEC(s, "kept")
			if err := r.g.FailMember(victim, errors.New("test: away")); err != nil {
				t.Fatal(err)
			}
			switch how {
			case "this process":
				// The destroy runs when the recovery starts listing the
				// serving member.
				hook.arm(serving, func() {
					if err := r.g.DestroyObject(rigCtx(t), priv); err != nil {
						t.Errorf("destroy: %v", err)
					}
					if err := r.g.DestroyObject(rigCtx(t), pub); err != nil {
						t.Errorf("destroy: %v", err)
					}
				}, slot.OpFindObjects)
			case "another process":
				other := r.direct(r.toks[0], "-other")
				j, err := tombstone.Open(r.stateDir, r.cfg.Serial, tombstone.Options{})
				if err != nil {
					t.Fatal(err)
				}
				defer j.Close()
				var ts []tombstone.Tombstone
				hook.arm(serving, func() {
					objs, err := hasync.List(rigCtx(t), other)
					if err != nil {
						t.Errorf("list: %v", err)
						return
					}
					for _, o := range objs {
						if o.Label != "doomed" {
							continue
						}
						if err := other.DestroyObject(rigCtx(t), o.Handle); err != nil {
							t.Errorf("destroy: %v", err)
						}
						ts = append(ts, tombstone.Tombstone{Identity: o.Identity, Fingerprint: o.Fingerprint, Time: time.Now(), GroupSerial: r.cfg.Serial})
					}
					// Its tombstones land while the recovery copies the
					// pair back to the serving member.
					hook.arm(serving, func() {
						for _, tb := range ts {
							if err := j.Record(rigCtx(t), tb); err != nil {
								t.Errorf("record: %v", err)
							}
						}
					}, slot.OpCreateObject, slot.OpUnwrapKey)
				}, slot.OpFindObjects)
			}
			r.recoverExpecting(victim, "kept", "kept")
		})
	}
}
