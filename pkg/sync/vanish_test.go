package sync_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/hagroup/hagroup/pkg/slot"
	hasync "github.com/hagroup/hagroup/pkg/sync"
	"github.com/hagroup/hagroup/pkg/sync/tombstone"
	"github.com/miekg/pkcs11"
)

// hookOnce is a slot.WrapInterceptor that runs fn once, just before the
// first call of op on token after it is armed.
type hookOnce struct {
	mu    sync.Mutex
	token string
	op    slot.Op
	fn    func()
}

func (h *hookOnce) arm(token string, op slot.Op, fn func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.token, h.op, h.fn = token, op, fn
}

func (h *hookOnce) Before(context.Context, string, slot.Op) error { return nil }

func (h *hookOnce) Wrap(_ context.Context, token string, op slot.Op, call func() error) error {
	h.mu.Lock()
	var fn func()
	if h.fn != nil && token == h.token && op == h.op {
		fn, h.fn = h.fn, nil
	}
	h.mu.Unlock()
	if fn != nil {
		fn()
	}
	return call()
}

// S3 of the chaos soak: a catch-up aborted when an object it was copying
// was destroyed meanwhile. Now such a copy is skipped (Vanished), is not
// a failure, and leaves nothing on the target: the destroyed object does
// not come back, whether it is destroyed before the copy starts, while
// the source wraps it, while the target makes it, or through another
// process whose tombstone appears only while the copy is made.
func TestApplySkipsObjectDestroyedWhileCopied(t *testing.T) {
	cases := []struct {
		name string
		make func(t *testing.T, s *slot.Slot, label string)
		// when: the token and call before which the source is destroyed
		// ("" = before Apply starts)
		token string
		op    slot.Op
		// tombOnly: the source stays; only a tombstone appears meanwhile
		tombOnly bool
	}{
		{name: "secret key, before the copy", make: aes},
		{name: "secret key, during the source's wrap", make: aes, token: "m0", op: slot.OpWrapKey},
		{name: "secret key, during the target's unwrap", make: aes, token: "m1", op: slot.OpUnwrapKey},
		{name: "data object, during the target's create", make: data, token: "m1", op: slot.OpCreateObject},
		{name: "secret key, tombstone during the unwrap", make: aes, token: "m1", op: slot.OpUnwrapKey, tombOnly: true},
		{name: "data object, tombstone during the create", make: data, token: "m1", op: slot.OpCreateObject, tombOnly: true},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hook := &hookOnce{}
			ms := planMembers(t, 2, hook)
			ctx := planCtx(t)
			label := fmt.Sprintf("vanish-%d", i)
			tc.make(t, ms[0].Slot, label)
			keep := fmt.Sprintf("keep-%d", i)
			planData(t, ms[0].Slot, keep, keep)

			var tombs sync.Mutex
			var set []tombstone.Tombstone
			load := func(context.Context) (hasync.Tombstones, error) {
				tombs.Lock()
				defer tombs.Unlock()
				return tombstone.NewSet(set...), nil
			}
			p, err := hasync.MakePlan(ctx, ms, nil, hasync.PlanOptions{LoadTombstones: load})
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Actions) != 2 {
				t.Fatalf("actions %v, want the two copies to m1", actionStrings(p.Actions))
			}
			destroy := func() {
				objs := planFind(t, ms[0].Slot, label)
				tombs.Lock()
				for _, o := range objs {
					set = append(set, tombstone.Tombstone{Identity: o.Identity, Fingerprint: o.Fingerprint, GroupSerial: planSerial})
				}
				tombs.Unlock()
				if tc.tombOnly {
					return
				}
				for _, o := range objs {
					if err := ms[0].Slot.DestroyObject(context.Background(), o.Handle); err != nil {
						t.Errorf("destroy the source: %v", err)
					}
				}
			}
			if tc.token == "" {
				destroy()
			} else {
				hook.arm(tc.token, tc.op, destroy)
			}
			res, err := (&hasync.Replicator{GroupSerial: planSerial}).Apply(ctx, p)
			if err != nil {
				t.Fatalf("apply failed for an object destroyed meanwhile: %v", err)
			}
			if len(res.Vanished) != 1 || res.Vanished[0].Identity.Label != label {
				t.Errorf("vanished %v, want the copy of %s", actionStrings(res.Vanished), label)
			}
			if len(res.Done) != 1 || res.Done[0].Identity.Label != keep {
				t.Errorf("done %v, want the copy of %s", actionStrings(res.Done), keep)
			}
			if got := planFind(t, ms[1].Slot, label); len(got) != 0 {
				t.Errorf("the destroyed object is on the target: %v", got)
			}
			if got := planFind(t, ms[1].Slot, keep); len(got) != 1 {
				t.Errorf("the target holds %d copies of %s, want 1", len(got), keep)
			}
		})
	}
}

func aes(t *testing.T, s *slot.Slot, label string) { planGenAES(t, s, label, planID(t)) }

func data(t *testing.T, s *slot.Slot, label string) { planData(t, s, label, label) }

// A private key whose public half is gone from its member has no
// fingerprint there (SoftHSM hides an EC private key's point), so a
// tombstone naming its fingerprint cannot match it; a tombstone of its
// identity still makes it the destroyed key: deleted, not copied back.
func TestPlanDeletesTombstonedKeyWithoutFingerprint(t *testing.T) {
	ms := planMembers(t, 2, nil)
	ctx := planCtx(t)
	planGenEC(t, ms[0].Slot, "half", planID(t))
	ts := planDestroyLabel(t, ms[0].Slot, "half") // both halves, with fingerprints
	planGenEC(t, ms[1].Slot, "half", ts[0].Identity.ID)
	// m1 keeps only the private half of its pair (same identity).
	for _, o := range planFind(t, ms[1].Slot, "half") {
		if o.Class == pkcs11.CKO_PUBLIC_KEY {
			if err := ms[1].Slot.DestroyObject(ctx, o.Handle); err != nil {
				t.Fatal(err)
			}
		}
	}
	tombs := tombstone.NewSet(ts...)
	p := planMake(t, ms, tombs, hasync.PlanOptions{})
	if got := strings.Join(actionStrings(p.Actions), ";"); got != "delete private key half m1<-" {
		t.Fatalf("actions %q, want the delete of the fingerprint-less private key on m1", got)
	}
	if len(p.Conflicts) != 0 {
		t.Fatalf("conflicts %v", p.Conflicts)
	}
}

// countCalls is a slot.WrapInterceptor counting calls per token and op.
type countCalls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *countCalls) Before(context.Context, string, slot.Op) error { return nil }

func (c *countCalls) Wrap(_ context.Context, token string, op slot.Op, call func() error) error {
	c.mu.Lock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[token+" "+string(op)]++
	c.mu.Unlock()
	return call()
}

func (c *countCalls) take(token string, op slot.Op) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := token + " " + string(op)
	n := c.n[k]
	c.n[k] = 0
	return n
}

// Apply uses what the plan's listing knows: a copy to a member that
// listed no object with the identity does not search that member for an
// existing copy (a search visits every object on a SoftHSM token, which
// made a catch-up cost grow with the square of its size). Applying the
// same plan again still makes no second copy.
func TestApplyTrustsTheListing(t *testing.T) {
	calls := &countCalls{}
	ms := planMembers(t, 2, calls)
	for i := range 8 {
		planGenAES(t, ms[0].Slot, fmt.Sprintf("bulk-%d", i), planID(t))
	}
	p := planMake(t, ms, nil, hasync.PlanOptions{})
	if len(p.Actions) != 8 {
		t.Fatalf("actions %v", actionStrings(p.Actions))
	}
	r := &hasync.Replicator{GroupSerial: planSerial}
	calls.take("m1", slot.OpFindObjects)
	if _, err := r.Apply(planCtx(t), p); err != nil {
		t.Fatal(err)
	}
	// At most the one search for the domain key, and the one re-check of
	// the target after all its copies (another host may have copied the
	// same objects meanwhile): not one per copy.
	if n := calls.take("m1", slot.OpFindObjects); n > 2 {
		t.Errorf("%d searches on the target for 8 copies the listing showed absent, want at most 2 (the domain key, the re-check)", n)
	}
	res, err := r.Apply(planCtx(t), p)
	if err != nil {
		t.Fatalf("apply again: %v", err)
	}
	if len(res.Done) != 8 {
		t.Errorf("second apply: %d done, want 8 (found there)", len(res.Done))
	}
	for i := range 8 {
		if got := planFind(t, ms[1].Slot, fmt.Sprintf("bulk-%d", i)); len(got) != 1 {
			t.Errorf("m1 holds %d copies of bulk-%d, want 1", len(got), i)
		}
	}
}
