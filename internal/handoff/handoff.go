// Package handoff passes one call at a time from a caller thread to a
// worker thread and the word "done" back, without putting either thread to
// sleep when the other answers soon.
//
// pkg/slot's handoff dispatch runs every module call on a worker so that
// its caller can give up at the deadline (a call inside a module cannot be
// cancelled). Sleeping costs a wake-up, and on a virtual machine whose idle
// vCPUs halt a wake-up is an interrupt through the hypervisor; a Go channel
// costs the threads of a C application (locked to their M) more, as the
// scheduler hands their P away and back at every block. So each side first
// spins for a bounded time, with the CPU's pause instruction and a
// sched_yield every few dozen turns, and only while that leaves a CPU of the
// process's affinity free (hg_busy), then sleeps on a futex. The state is a
// Cell in Go memory that C only reads and writes during a call (the cgo
// pointer rules); it holds no Go pointer. Publishing the call's arguments
// and result is the caller's business (with sync/atomic, so that the race
// detector sees the order the futex words give). docs/BENCHMARKS.md has
// what a wake-up and a spinning round trip cost.
//
// A pair whose calls are all made in Go, and whose caller is a goroutine
// rather than a C thread, meets on a GoCell instead: both sides park, as
// such a call is not answered within a spin (see GoCell). Both kinds are a
// Pair.
package handoff

/*
#cgo CFLAGS: -O2
#include "cell.h"
*/
import "C"

import (
	"time"
	"unsafe"
)

// Cell is one caller-worker pair's meeting point. Its zero value is ready;
// it must not be copied after first use. At most one call is in flight.
type Cell struct {
	c C.hg_cell
}

// Outcome is how Wait ended.
type Outcome int

// The outcomes of Wait.
const (
	Answered Outcome = iota
	TimedOut
	Cancelled
)

// Post announces a call to the worker and returns its sequence number.
// A shot is a call the worker makes in C, with its Job (see Serve).
func (c *Cell) Post(shot bool) uint32 {
	s := C.uint32_t(0)
	if shot {
		s = 1
	}
	return uint32(C.hg_post(&c.c, s))
}

// Job is a call the worker can make in C: Run(Arg), where Run is a C
// function void (*)(void *) and Arg C memory that holds the call's
// arguments and results (never Go memory: the worker may still make the
// call after its caller gave up).
type Job struct {
	Run, Arg unsafe.Pointer
}

// The states of a call in flight, for the race between the worker's answer
// and its caller giving up: the caller sets Busy before the post and moves
// it to Abandoned when it gives up; the worker moves it to Idle when it
// answers.
const (
	Idle int32 = iota
	Busy
	Abandoned
)

// Serve is the worker's loop: it waits for each call after last (spinning
// for up to spin first, while its waits have lately been that short), makes
// the shots with job in C, answering them, and returns the first call that
// is not a shot, which the worker makes and answers with Done (or ends
// with Drop); the worker counts as busy (see hg_busy) until then. When a
// shot's caller has given up on it (state no longer Busy at the answer),
// Serve returns its number with abandoned set, and the worker's part in
// the call is over. state must not move while Serve runs.
func (c *Cell) Serve(last uint32, state *int32, job Job, spin time.Duration) (seq uint32, abandoned bool) {
	var ab C.int
	seq = uint32(C.hg_serve(&c.c, C.uint32_t(last), (*C.int32_t)(unsafe.Pointer(state)),
		(*[0]byte)(job.Run), job.Arg, C.int64_t(spin), &ab))
	return seq, ab != 0
}

// Done tells the caller that call seq is answered.
func (c *Cell) Done(seq uint32) { C.hg_done(&c.c, C.uint32_t(seq)) }

// Drop ends the worker's part in a call it took from Next and will not
// answer with Done (its caller gave up, or the post asked it to quit).
func (c *Cell) Drop() { C.hg_leave() }

// Cancel makes the caller's Wait for call seq return Cancelled (unless it
// was answered first). It may come late: a cancel of an older call is
// ignored.
func (c *Cell) Cancel(seq uint32) { C.hg_cancel(&c.c, C.uint32_t(seq)) }

// Wait blocks the caller until call seq is answered, cancelled or timeout
// passes, spinning for up to spin first (while its waits for an answer have
// lately been that short). Calls must be waited for in order.
func (c *Cell) Wait(seq uint32, spin, timeout time.Duration) Outcome {
	return Outcome(C.hg_wait(&c.c, C.uint32_t(seq), C.int64_t(spin), C.int64_t(max(timeout, 0))))
}

// WaitAnswer blocks the caller until call seq is answered, whatever the
// time and any cancel: for a call whose worker is known to be finishing.
func (c *Cell) WaitAnswer(seq uint32) {
	C.hg_wait(&c.c, C.uint32_t(seq), 0, -1)
}

// busy is hg_busy: the threads spinning or running a call now.
func busy() int32 { return int32(C.hg_load_busy()) }
