package handoff

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// worker serves calls on c until quit is set: each call doubles *in into
// *out, published with atomics as pkg/slot does.
func worker(c Pair, in, out *atomic.Int64, quit *atomic.Bool, spin time.Duration, done *sync.WaitGroup) {
	defer done.Done()
	var seq uint32
	var state int32
	for {
		seq, _ = c.Serve(seq, &state, Job{}, spin)
		if quit.Load() {
			c.Drop()
			return
		}
		out.Store(2 * in.Load())
		c.Done(seq)
	}
}

// pairs makes each kind of Pair, for the tests that hold for both.
var pairs = []struct {
	name string
	make func() Pair
}{
	{"Cell", func() Pair { return new(Cell) }},
	{"GoCell", func() Pair { return NewGoCell() }},
}

func TestRoundTrips(t *testing.T) {
	for _, p := range pairs {
		for _, spin := range []time.Duration{0, 50 * time.Microsecond} {
			t.Run(p.name+"/"+spin.String(), func(t *testing.T) { roundTrips(t, p.make(), spin) })
		}
	}
}

func roundTrips(t *testing.T, c Pair, spin time.Duration) {
	var in, out atomic.Int64
	var quit atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go worker(c, &in, &out, &quit, spin, &wg)
	for i := int64(1); i <= 2000; i++ {
		in.Store(i)
		seq := c.Post(false)
		if got := c.Wait(seq, spin, 10*time.Second); got != Answered {
			t.Fatalf("call %d: outcome %v, want Answered", i, got)
		}
		if got := out.Load(); got != 2*i {
			t.Fatalf("call %d: answer %d, want %d", i, got, 2*i)
		}
	}
	quit.Store(true)
	c.Post(false)
	wg.Wait()
	if b := busy(); b != 0 {
		t.Fatalf("busy = %d after the worker ended, want 0", b)
	}
}

// Many pairs at once: more spinners than CPUs must still make progress.
func TestManyPairs(t *testing.T) {
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := pairs[i%len(pairs)].make()
			var in, out atomic.Int64
			var quit atomic.Bool
			var w sync.WaitGroup
			w.Add(1)
			go worker(c, &in, &out, &quit, 50*time.Microsecond, &w)
			for i := int64(1); i <= 300; i++ {
				in.Store(i)
				if got := c.Wait(c.Post(false), 200*time.Microsecond, 10*time.Second); got != Answered || out.Load() != 2*i {
					t.Errorf("call %d: outcome %v, answer %d", i, got, out.Load())
					break
				}
			}
			quit.Store(true)
			c.Post(false)
			w.Wait()
		}()
	}
	wg.Wait()
	if b := busy(); b != 0 {
		t.Fatalf("busy = %d after every worker ended, want 0", b)
	}
}

func TestTimeout(t *testing.T) {
	for _, p := range pairs {
		t.Run(p.name, func(t *testing.T) { timeout(t, p.make()) })
	}
}

func timeout(t *testing.T, c Pair) {
	seq := c.Post(false) // no worker: never answered
	start := time.Now()
	got := c.Wait(seq, 100*time.Microsecond, 50*time.Millisecond)
	elapsed := time.Since(start)
	if got != TimedOut {
		t.Fatalf("outcome %v, want TimedOut", got)
	}
	if elapsed < 50*time.Millisecond || elapsed > 2*time.Second {
		t.Fatalf("Wait returned after %v, want 50ms (+ at most 2s on a loaded machine)", elapsed)
	}
	if b := busy(); b != 0 {
		t.Fatalf("busy = %d after a timed-out wait, want 0", b)
	}
}

func TestCancel(t *testing.T) {
	for _, p := range pairs {
		t.Run(p.name, func(t *testing.T) { cancel(t, p.make, p.make()) })
	}
}

func cancel(t *testing.T, fresh func() Pair, c Pair) {
	first := c.Post(false)
	c.Cancel(first - 1) // a late cancel of an older call: ignored
	if got := c.Wait(first, 0, 20*time.Millisecond); got != TimedOut {
		t.Fatalf("after a cancel of an older call: %v, want TimedOut", got)
	}

	d := fresh()
	seq := d.Post(false)
	go d.Cancel(seq) // before or while the caller sleeps: either way
	start := time.Now()
	if got := d.Wait(seq, 0, time.Minute); got != Cancelled {
		t.Fatalf("outcome %v, want Cancelled", got)
	}
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Fatalf("cancelled Wait returned after %v", elapsed)
	}

	// WaitAnswer ignores the cancel and waits for the worker's answer.
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		d.WaitAnswer(seq)
	}()
	var state int32
	s, _ := d.Serve(0, &state, Job{}, 0)
	if s != seq {
		t.Fatalf("Serve = %d, want %d", s, seq)
	}
	d.Done(s)
	<-answered
}

// BenchmarkWakeUp measures a round trip between a caller and its worker
// when both sleep at once (spin=0: two futex wake-ups per call) and when
// both spin (spin=1ms: none), whose difference is what pkg/slot's
// callerSpin and workerSpin are sized to: a side spins about as long as
// waking it would cost. Figures in docs/BENCHMARKS.md.
func BenchmarkWakeUp(b *testing.B) {
	for _, spin := range []time.Duration{0, time.Millisecond} {
		b.Run("spin="+spin.String(), func(b *testing.B) { wakeUps(b, new(Cell), spin) })
	}
	// A GoCell does not spin: both sides park as goroutines.
	b.Run("GoCell", func(b *testing.B) { wakeUps(b, NewGoCell(), 0) })
}

func wakeUps(b *testing.B, c Pair, spin time.Duration) {
	var in, out atomic.Int64
	var quit atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go worker(c, &in, &out, &quit, spin, &wg)
	for i := 0; b.Loop(); i++ {
		in.Store(int64(i))
		if got := c.Wait(c.Post(false), spin, 10*time.Second); got != Answered {
			b.Fatalf("outcome %v", got)
		}
	}
	quit.Store(true)
	c.Post(false)
	wg.Wait()
}
