package handoff

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// worker serves calls on a Pair: each call doubles in into out, published
// with atomics as pkg/slot does.
type worker struct {
	c       Pair
	in, out atomic.Int64
	quit    atomic.Bool
	done    sync.WaitGroup
}

// startWorker starts a worker on c whose side spins for up to spin.
func startWorker(c Pair, spin time.Duration) *worker {
	w := &worker{c: c}
	w.done.Go(func() {
		var seq uint32
		var state int32
		for {
			seq, _ = c.Serve(seq, &state, Job{}, spin)
			if w.quit.Load() {
				c.Drop()
				return
			}
			w.out.Store(2 * w.in.Load())
			c.Done(seq)
		}
	})
	return w
}

// call makes one call with i and reports how its wait ended and the answer.
func (w *worker) call(i int64, spin time.Duration) (Outcome, int64) {
	w.in.Store(i)
	got := w.c.Wait(w.c.Post(false), spin, 10*time.Second)
	return got, w.out.Load()
}

// stop ends the worker and waits for it.
func (w *worker) stop() {
	w.quit.Store(true)
	w.c.Post(false)
	w.done.Wait()
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
	w := startWorker(c, spin)
	for i := int64(1); i <= 2000; i++ {
		if got, answer := w.call(i, spin); got != Answered || answer != 2*i {
			t.Fatalf("call %d: outcome %v, answer %d; want Answered, %d", i, got, answer, 2*i)
		}
	}
	w.stop()
	if b := busy(); b != 0 {
		t.Fatalf("busy = %d after the worker ended, want 0", b)
	}
}

// Many pairs at once: more spinners than CPUs must still make progress.
func TestManyPairs(t *testing.T) {
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Go(func() {
			w := startWorker(pairs[i%len(pairs)].make(), 50*time.Microsecond)
			defer w.stop()
			for j := int64(1); j <= 300; j++ {
				if got, answer := w.call(j, 200*time.Microsecond); got != Answered || answer != 2*j {
					t.Errorf("call %d: outcome %v, answer %d", j, got, answer)
					break
				}
			}
		})
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
	w := startWorker(c, spin)
	defer w.stop()
	for i := int64(0); b.Loop(); i++ {
		if got, _ := w.call(i, spin); got != Answered {
			b.Fatalf("outcome %v", got)
		}
	}
}
