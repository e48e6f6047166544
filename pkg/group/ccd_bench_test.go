package group

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/hagroup/hagroup/pkg/sync/tombstone"
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

// mark starts a new phase in the trace.
func (o *opTimer) mark(phase string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.trace {
		o.seq = append(o.seq, "-- "+phase)
	}
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

// timedTombstones sums the time spent recording tombstones and intents.
type timedTombstones struct {
	*tombstone.Shared
	record, revive, intend, settle time.Duration
}

func (t *timedTombstones) Intend(ctx context.Context, ts []tombstone.Tombstone) ([]tombstone.Tombstone, error) {
	start := time.Now()
	defer func() { t.intend += time.Since(start) }()
	return t.Shared.Intend(ctx, ts)
}

func (t *timedTombstones) Settle(ctx context.Context, ts []tombstone.Tombstone) error {
	start := time.Now()
	defer func() { t.settle += time.Since(start) }()
	return t.Shared.Settle(ctx, ts)
}

func (t *timedTombstones) Record(ctx context.Context, ts tombstone.Tombstone) error {
	start := time.Now()
	defer func() { t.record += time.Since(start) }()
	return t.Shared.Record(ctx, ts)
}

func (t *timedTombstones) Revive(ctx context.Context, id object.Identity, fp []byte) (int, error) {
	start := time.Now()
	defer func() { t.revive += time.Since(start) }()
	return t.Shared.Revive(ctx, id, fp)
}

// BenchmarkCreateCopyDestroy is test/module's initcost create-copy-destroy
// through the Go API: a token data object created, copied and both
// destroyed, replicated to one member and to three, with the tombstones
// kept on the members as pkg/ha keeps them. -v prints the module calls it
// made.
func BenchmarkCreateCopyDestroy(b *testing.B) {
	for _, c := range []struct {
		members int
		journal bool
	}{{1, false}, {3, false}, {3, true}} {
		name := fmt.Sprintf("members=%d", c.members)
		if c.journal {
			name += "/journal"
		}
		b.Run(name, func(b *testing.B) { benchCreateCopyDestroy(b, c.members, c.journal) })
	}
}

// benchCreateCopyDestroy runs it on members members, with the local
// record in memory (a process without a state directory) or, with
// journal, in a state directory's journal (haagent, or the module with
// state_dir set).
func benchCreateCopyDestroy(b *testing.B, members int, journal bool) {
	timer := &opTimer{}
	f := setup(b, setupOpts{n: members, interceptor: timer, journal: journal})
	var local tombstone.Local = &tombstone.Memory{}
	if journal {
		local = f.journal
	}
	shared := tombstone.NewShared(local, f.g.serial, tombstone.SharedOptions{})
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
		timer.mark("copy")
		c, err := s.CopyObject(ctx, h, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, fmt.Sprintf("ccd-copy-%d", i))})
		if err != nil {
			b.Fatal(err)
		}
		t0 = lap(1, t0)
		timer.mark("destroy copy")
		if err := s.DestroyObject(ctx, c); err != nil {
			b.Fatal(err)
		}
		t0 = lap(2, t0)
		timer.mark("destroy")
		if err := s.DestroyObject(ctx, h); err != nil {
			b.Fatal(err)
		}
		lap(3, t0)
	}
	round(-2)
	timer.trace = true
	timer.mark("create")
	round(-1)
	timer.trace = false
	b.Logf("one round's calls:\n%s", strings.Join(timer.seq, "\n"))
	timer.reset()
	wall = [4]time.Duration{}
	timed.record, timed.revive, timed.intend, timed.settle = 0, 0, 0, 0
	b.ResetTimer()
	for i := range b.N {
		round(i)
	}
	b.StopTimer()
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	b.Logf("ms per round: create %.2f, copy %.2f, destroy copy %.2f, destroy %.2f (tombstones recorded %.2f, revived %.2f; intents written %.2f, settled %.2f); module calls of %d rounds:\n%s",
		per(wall[0]), per(wall[1]), per(wall[2]), per(wall[3]), per(timed.record), per(timed.revive), per(timed.intend), per(timed.settle), b.N, timer)
}
