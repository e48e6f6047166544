// Package handoff passes one call at a time from a caller thread to a
// worker thread and the word "done" back, without putting either thread to
// sleep when the other answers soon.
//
// pkg/slot runs every module call on a worker so that its caller can give
// up at the deadline (a call inside a module cannot be cancelled). Handing
// the call over through Go channels costs two thread wake-ups per call, and
// on a virtual machine whose idle vCPUs halt, a wake-up is an
// inter-processor interrupt through the hypervisor: measured on the 2-vCPU
// development VM, a condition-variable round trip between two threads
// costs 33 µs and a spinning one 0.5 µs. A PKCS#11 application's threads
// (libhapkcs11.so) are moreover locked to their Go M, which makes the Go
// scheduler hand its P over at every block (stoplockedm/startlockedm):
// ~40 µs per call on a 57 µs ECDSA signature.
//
// So each side first spins for a bounded time, with the CPU's pause
// instruction and a sched_yield every few dozen turns (a spinning thread
// gives its vCPU to a runnable worker at once when the machine is
// oversubscribed), then sleeps on a futex. The state is a Cell in Go
// memory that C only reads and writes during a call (the cgo pointer
// rules); it holds no Go pointer. Publishing the call's arguments and
// result is the caller's business (with sync/atomic, so that the race
// detector sees the order the futex words give).
package handoff

/*
#cgo CFLAGS: -O2
#define _GNU_SOURCE
#include <stdint.h>
#include <time.h>
#include <sched.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/futex.h>

typedef struct {
	uint32_t req;    // sequence number of the last call posted
	uint32_t res;    // sequence number of the last call answered
	uint32_t cancel; // sequence number of the last call cancelled
	uint32_t wsleep; // the worker sleeps (or is about to) on req
	uint32_t csleep; // the caller sleeps (or is about to) on res
} hg_cell;

#define LD(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define ST(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)

static inline void hg_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

static int64_t hg_now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void hg_futex_wait(uint32_t *addr, uint32_t val, int64_t ns) {
	struct timespec ts = {ns / 1000000000, ns % 1000000000};
	syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, ns >= 0 ? &ts : NULL, NULL, 0);
}

static void hg_futex_wake(uint32_t *addr) {
	syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

// hg_busy counts the threads of the process that spin here or run a call
// handed over here; a thread spins only while that leaves a CPU of the
// process's affinity for it. When every CPU is taken, sleeping costs no
// halted-vCPU wake-up (the CPUs are busy) and spinning would only take a
// CPU from a worker.
static int32_t hg_busy, hg_ncpu;

static int32_t hg_cpus(void) {
	int32_t n = LD(&hg_ncpu);
	if (n == 0) {
		cpu_set_t set;
		n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
		ST(&hg_ncpu, n);
	}
	return n;
}

static int32_t hg_load_busy(void) { return LD(&hg_busy); }

static void hg_enter(void) { __atomic_add_fetch(&hg_busy, 1, __ATOMIC_SEQ_CST); }
static void hg_leave(void) { __atomic_sub_fetch(&hg_busy, 1, __ATOMIC_SEQ_CST); }

static int hg_try_spin(void) {
	if (__atomic_add_fetch(&hg_busy, 1, __ATOMIC_SEQ_CST) <= hg_cpus())
		return 1;
	hg_leave();
	return 0;
}

// hg_spin returns 1 as soon as *word != unlike (or *cancel == seq when
// cancel is set), 0 when until passes first.
static int hg_spin(uint32_t *word, uint32_t unlike, uint32_t *cancel, uint32_t seq, int64_t until) {
	for (unsigned i = 1;; i++) {
		if (LD(word) != unlike || (cancel && LD(cancel) == seq))
			return 1;
		if ((i & 63) == 0) {
			if (hg_now() >= until)
				return 0;
			sched_yield();
		} else {
			hg_relax();
		}
	}
}

static uint32_t hg_post(hg_cell *c) {
	uint32_t seq = __atomic_add_fetch(&c->req, 1, __ATOMIC_SEQ_CST);
	if (LD(&c->wsleep))
		hg_futex_wake(&c->req);
	return seq;
}

static uint32_t hg_next(hg_cell *c, uint32_t last, int64_t spin_ns) {
	uint32_t r;
	if (spin_ns > 0 && hg_try_spin()) {
		hg_spin(&c->req, last, NULL, 0, hg_now() + spin_ns);
		hg_leave();
	}
	while ((r = LD(&c->req)) == last) {
		ST(&c->wsleep, 1);
		if (LD(&c->req) == last)
			hg_futex_wait(&c->req, last, -1);
		ST(&c->wsleep, 0);
	}
	hg_enter(); // running the call, until hg_done
	return r;
}

static void hg_done(hg_cell *c, uint32_t seq) {
	hg_leave();
	ST(&c->res, seq);
	if (LD(&c->csleep))
		hg_futex_wake(&c->res);
}

static void hg_cancel(hg_cell *c, uint32_t seq) {
	ST(&c->cancel, seq);
	if (LD(&c->csleep))
		hg_futex_wake(&c->res);
}

// hg_wait: 0 answered, 1 deadline passed, 2 cancelled (never when
// timeout_ns < 0: then it waits for the answer alone, however long).
static int hg_wait(hg_cell *c, uint32_t seq, int64_t spin_ns, int64_t timeout_ns) {
	int forever = timeout_ns < 0;
	int64_t start = hg_now(), deadline = start + timeout_ns;
	uint32_t r = seq - 1; // the answer before seq's: calls are one at a time
	uint32_t *cancel = forever ? NULL : &c->cancel;
	if (!forever && spin_ns > timeout_ns)
		spin_ns = timeout_ns;
	if (spin_ns > 0 && hg_try_spin()) {
		hg_spin(&c->res, r, cancel, seq, start + spin_ns);
		hg_leave();
	}
	for (;;) {
		if (LD(&c->res) == seq)
			return 0;
		if (cancel && LD(cancel) == seq)
			return 2;
		int64_t left = forever ? -1 : deadline - hg_now();
		if (!forever && left <= 0)
			return 1;
		ST(&c->csleep, 1);
		if (LD(&c->res) == r && !(cancel && LD(cancel) == seq))
			hg_futex_wait(&c->res, r, left);
		ST(&c->csleep, 0);
	}
}
*/
import "C"

import "time"

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
func (c *Cell) Post() uint32 { return uint32(C.hg_post(&c.c)) }

// Next blocks the worker until a call after last is posted, spinning for
// up to spin first, and returns its sequence number. The worker counts as
// busy (see hg_busy) until it calls Done or Drop.
func (c *Cell) Next(last uint32, spin time.Duration) uint32 {
	return uint32(C.hg_next(&c.c, C.uint32_t(last), C.int64_t(spin)))
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
// passes, spinning for up to spin first. Calls must be waited for in order.
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
