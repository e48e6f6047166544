/*
 * cell.h — the caller/worker meeting point of package handoff, in C so that
 * the spinning and the futex calls stay out of the Go scheduler's way. See
 * handoff.go for why the hand-off spins before it sleeps.
 */
#ifndef HG_CELL_H
#define HG_CELL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
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
	uint32_t csleep; // the caller sleeps (or is about to) on cwake
	// cwake changes at every answer and every cancel: the caller sleeps on
	// it, so that a cancel coming between its last look and its futex wait
	// makes the wait return at once (sleeping on res, whose value a cancel
	// leaves alone, lost that wake-up until the deadline).
	uint32_t cwake;
	// shot is set when the call posted last is one the worker makes in C
	// (hg_serve) without returning to Go.
	uint32_t shot;
	// How long each side has been waiting lately (hg_spin_for): the
	// worker for the next post, the caller for its answer. Each side's
	// own.
	int64_t wwait, cwait;
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

static inline int64_t hg_now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static inline void hg_futex_wait(uint32_t *addr, uint32_t val, int64_t ns) {
	struct timespec ts = {ns / 1000000000, ns % 1000000000};
	syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, ns >= 0 ? &ts : NULL, NULL, 0);
}

static inline void hg_futex_wake(uint32_t *addr) {
	syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

// hg_busy counts the threads of the process that spin here or run a call
// handed over here; a thread spins only while that leaves a CPU of the
// process's affinity for it. When every CPU is taken, sleeping costs no
// halted-vCPU wake-up (the CPUs are busy) and spinning would only take a
// CPU from a worker.
extern int32_t hg_busy, hg_ncpu;

static inline int32_t hg_cpus(void) {
	int32_t n = LD(&hg_ncpu);
	if (n == 0) {
		cpu_set_t set;
		n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
		ST(&hg_ncpu, n);
	}
	return n;
}

static inline int32_t hg_load_busy(void) { return LD(&hg_busy); }

static inline void hg_enter(void) { __atomic_add_fetch(&hg_busy, 1, __ATOMIC_SEQ_CST); }
static inline void hg_leave(void) { __atomic_sub_fetch(&hg_busy, 1, __ATOMIC_SEQ_CST); }

static inline int hg_try_spin(void) {
	if (__atomic_add_fetch(&hg_busy, 1, __ATOMIC_SEQ_CST) <= hg_cpus())
		return 1;
	hg_leave();
	return 0;
}

// hg_spin returns 1 as soon as *word != unlike (or *cancel == seq when
// cancel is set), 0 when until passes first. It yields the CPU every few
// dozen turns.
static inline int hg_spin(uint32_t *word, uint32_t unlike, uint32_t *cancel, uint32_t seq, int64_t until) {
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

// hg_spin_free spins as hg_spin does, if a CPU is free for it.
static inline void hg_spin_free(uint32_t *word, uint32_t unlike, uint32_t *cancel, uint32_t seq, int64_t until) {
	if (hg_try_spin()) {
		hg_spin(word, unlike, cancel, seq, until);
		hg_leave();
	}
}

// hg_spin_for is how long a side whose waits have lately been est ns
// long (a moving average, hg_observe) spins before it sleeps, when it may
// spin for up to max: a side whose waits outlast its spin sleeps at once,
// since it would spin for nothing and pay the wake-up all the same. A
// caller of a signature that outlasts the spin sleeps at once; a worker
// whose caller comes back within its spin spins.
static inline int64_t hg_spin_for(int64_t est, int64_t max) { return est > max ? 0 : max; }

// hg_observe counts a wait of ns in *est, as at most twice max.
static inline void hg_observe(int64_t *est, int64_t ns, int64_t max) {
	if (ns > 2 * max)
		ns = 2 * max;
	*est += (ns - *est) / 4;
}

static inline uint32_t hg_post(hg_cell *c, uint32_t shot) {
	ST(&c->shot, shot);
	uint32_t seq = __atomic_add_fetch(&c->req, 1, __ATOMIC_SEQ_CST);
	if (LD(&c->wsleep))
		hg_futex_wake(&c->req);
	return seq;
}

static inline uint32_t hg_next(hg_cell *c, uint32_t last, int64_t spin_ns) {
	uint32_t r;
	if (spin_ns > 0)
		hg_spin_free(&c->req, last, NULL, 0, hg_now() + spin_ns);
	while ((r = LD(&c->req)) == last) {
		ST(&c->wsleep, 1);
		if (LD(&c->req) == last)
			hg_futex_wait(&c->req, last, -1);
		ST(&c->wsleep, 0);
	}
	hg_enter(); // running the call, until hg_done
	return r;
}

// hg_wake_caller follows any change the caller waits for.
static inline void hg_wake_caller(hg_cell *c) {
	__atomic_add_fetch(&c->cwake, 1, __ATOMIC_SEQ_CST);
	if (LD(&c->csleep))
		hg_futex_wake(&c->cwake);
}

static inline void hg_done(hg_cell *c, uint32_t seq) {
	hg_leave();
	ST(&c->res, seq);
	hg_wake_caller(c);
}

static inline void hg_cancel(hg_cell *c, uint32_t seq) {
	ST(&c->cancel, seq);
	hg_wake_caller(c);
}

// hg_wait: 0 answered, 1 deadline passed, 2 cancelled (never when
// timeout_ns < 0: then it waits for the answer alone, however long). It
// spins for up to spin_ns first (hg_spin_for), and counts the wait for an
// answer when spin_ns > 0.
static inline int hg_wait(hg_cell *c, uint32_t seq, int64_t spin_ns, int64_t timeout_ns) {
	int forever = timeout_ns < 0;
	int64_t start = hg_now(), deadline = start + timeout_ns, max = spin_ns;
	spin_ns = hg_spin_for(c->cwait, max);
	uint32_t r = seq - 1; // the answer before seq's: calls are one at a time
	uint32_t *cancel = forever ? NULL : &c->cancel;
	if (!forever && spin_ns > timeout_ns)
		spin_ns = timeout_ns;
	if (spin_ns > 0)
		hg_spin_free(&c->res, r, cancel, seq, start + spin_ns);
	for (;;) {
		uint32_t w = LD(&c->cwake); // before the looks it guards
		if (LD(&c->res) == seq) {
			if (max > 0)
				hg_observe(&c->cwait, hg_now() - start, max);
			return 0;
		}
		if (cancel && LD(cancel) == seq)
			return 2;
		int64_t left = forever ? -1 : deadline - hg_now();
		if (!forever && left <= 0)
			return 1;
		ST(&c->csleep, 1);
		if (LD(&c->cwake) == w)
			hg_futex_wait(&c->cwake, w, left);
		ST(&c->csleep, 0);
	}
}

// The states of the call in flight (pkg/slot's stIdle, stBusy,
// stAbandoned): the worker's answer and the caller's giving up race on it.
enum { HG_IDLE = 0, HG_BUSY = 1, HG_ABANDONED = 2 };

// hg_serve is the worker's loop: it waits for each call (spinning for up
// to spin_ns first, hg_spin_for), makes
// the calls posted as shots with run(job) in C, and returns the sequence
// number of the first call Go must make (*abandoned = 0), or of a shot
// whose caller gave up on it (*abandoned = 1; the worker's part in it is
// over). state is the call's state word.
static inline uint32_t hg_serve(hg_cell *c, uint32_t last, int32_t *state, void (*run)(void *), void *job,
                                int64_t spin_ns, int *abandoned) {
	*abandoned = 0;
	for (;;) {
		int64_t since = hg_now();
		uint32_t seq = hg_next(c, last, hg_spin_for(c->wwait, spin_ns));
		hg_observe(&c->wwait, hg_now() - since, spin_ns);
		if (!LD(&c->shot))
			return seq;
		if (LD(state) != HG_ABANDONED)
			run(job);
		int32_t busy = HG_BUSY;
		if (!__atomic_compare_exchange_n(state, &busy, HG_IDLE, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
			hg_leave();
			*abandoned = 1;
			return seq;
		}
		hg_done(c, seq);
		last = seq;
	}
}

#endif
