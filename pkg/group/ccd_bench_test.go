package group

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/replica"
	"github.com/hagroup/hagroup/pkg/replica/tombstone"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// opTimer sums the time of every module call by member and op.
type opTimer struct {
	mu    sync.Mutex
	sum   map[string]time.Duration
	n     map[string]int
	seq   []string // the calls in order, while trace is set
	trace bool
}

func (o *opTimer) Before(context.Context, string, slot.Op) error { return nil }

func (o *opTimer) Wrap(ctx context.Context, token string, op slot.Op, call func() error) error {
	start := time.Now()
	err := call()
	d := time.Since(start)
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.sum == nil {
		o.sum, o.n = map[string]time.Duration{}, map[string]int{}
	}
	k := token + " " + string(op)
	o.sum[k] += d
	o.n[k]++
	if o.trace {
		o.seq = append(o.seq, k)
	}
	return err
}

func (o *opTimer) reset() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.sum, o.n = nil, nil
}

func (o *opTimer) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var ks []string
	for k := range o.sum {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var b strings.Builder
	for _, k := range ks {
		fmt.Fprintf(&b, "%-40s %4d calls %8.2f ms\n", k, o.n[k], float64(o.sum[k].Microseconds())/1000)
	}
	return b.String()
}

// timedTombstones sums the time spent recording tombstones.
type timedTombstones struct {
	*tombstone.Shared
	record, revive time.Duration
}

func (t *timedTombstones) Record(ctx context.Context, ts tombstone.Tombstone) error {
	start := time.Now()
	defer func() { t.record += time.Since(start) }()
	return t.Shared.Record(ctx, ts)
}

func (t *timedTombstones) Revive(ctx context.Context, id replica.Identity, fp []byte) (int, error) {
	start := time.Now()
	defer func() { t.revive += time.Since(start) }()
	return t.Shared.Revive(ctx, id, fp)
}

// BenchmarkCreateCopyDestroy is test/module's initcost create-copy-destroy
// through the Go API: a token data object created, copied and both
// destroyed, replicated to three members, with the tombstones kept on the
// members as pkg/ha keeps them. -v prints the module calls it made.
func BenchmarkCreateCopyDestroy(b *testing.B) {
	timer := &opTimer{}
	f := setup(b, setupOpts{interceptor: timer})
	shared := tombstone.NewShared(&tombstone.Memory{}, f.g.serial, tombstone.SharedOptions{})
	timed := &timedTombstones{Shared: shared}
	f.g.tombstones = timed
	shared.SetMembers(f.g.StateSlots)
	ctx := testContext(b)
	s := openSession(b, f.g)
	var wall [4]time.Duration
	lap := func(k int, start time.Time) time.Time {
		now := time.Now()
		wall[k] += now.Sub(start)
		return now
	}
	round := func(i int) {
		t0 := time.Now()
		h, err := s.CreateObject(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, true),
			attr(pkcs11.CKA_LABEL, fmt.Sprintf("ccd-%d", i)), attr(pkcs11.CKA_VALUE, []byte("payload"))})
		if err != nil {
			b.Fatal(err)
		}
		t0 = lap(0, t0)
		c, err := s.CopyObject(ctx, h, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, fmt.Sprintf("ccd-copy-%d", i))})
		if err != nil {
			b.Fatal(err)
		}
		t0 = lap(1, t0)
		if err := s.DestroyObject(ctx, c); err != nil {
			b.Fatal(err)
		}
		t0 = lap(2, t0)
		if err := s.DestroyObject(ctx, h); err != nil {
			b.Fatal(err)
		}
		lap(3, t0)
	}
	round(-2)
	timer.trace = true
	round(-1)
	timer.trace = false
	b.Logf("one round's calls:\n%s", strings.Join(timer.seq, "\n"))
	timer.reset()
	wall = [4]time.Duration{}
	timed.record, timed.revive = 0, 0
	b.ResetTimer()
	for i := range b.N {
		round(i)
	}
	b.StopTimer()
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	b.Logf("ms per round: create %.2f, copy %.2f, destroy copy %.2f, destroy %.2f (tombstones recorded %.2f, revived %.2f); module calls of %d rounds:\n%s",
		per(wall[0]), per(wall[1]), per(wall[2]), per(wall[3]), per(timed.record), per(timed.revive), b.N, timer)
}
