/*
 * place.h — where a worker thread runs and how its caller waits for it,
 * for callers that each have a worker of their own (internal/p11raw's
 * lanes; test/module/c/pairs.c measures the same policy without Go).
 *
 * While each caller and worker can have a CPU of their own (waiting
 * callers at most half the CPUs), they spin for each other there
 * (HG_SPIN_TRY) and the worker may run anywhere. Beyond that the waiting
 * side cannot spin on a CPU of its own, and sleeping costs each call two
 * futex wake-ups, often across CPUs. So the worker is pinned to its
 * caller's CPU and both wait by yielding it (HG_SPIN_YIELD): a call passes
 * between them by a switch on one CPU, with no wake-up and no cache lines
 * crossing. Measured with pairs.c (2 threads, SoftHSM ECDSA, the 2-vCPU
 * development VM, medians of 8 alternated rounds): 0.93-0.94 of the direct
 * rate pinned and yielding, 0.82-0.87 spinning, 0.79 sleeping; unpinned,
 * yielding fell to 0.54, the pairs' threads yielding to each other's. With
 * one signing thread, spinning made 0.98 and pinned yielding 0.92.
 */
#ifndef HG_PLACE_H
#define HG_PLACE_H

#include "cell.h"

// After this many calls in a row that found the CPUs unsaturated, a pinned
// worker is let go again.
#define HG_UNPIN_AFTER 64

// hg_waiting counts the callers waiting on their workers now.
extern int32_t hg_waiting;

// hg_place is one caller-worker pair's placement. The caller's side owns
// it; the worker only sets tid and all when it starts and reads pin.
typedef struct {
	int32_t tid;          // the worker's thread, 0 until it has started
	int32_t pin;          // the CPU the worker is pinned to, -1 when none
	uint32_t unsaturated; // calls in a row that found the CPUs unsaturated
	cpu_set_t all;        // the CPUs the worker may use unpinned
} hg_place;

static inline void hg_place_init(hg_place *p) { p->pin = -1; }

// hg_place_started is called by the worker thread before its first call.
static inline void hg_place_started(hg_place *p) {
	if (sched_getaffinity(0, sizeof p->all, &p->all) == 0)
		ST(&p->tid, (int32_t)syscall(SYS_gettid));
}

// hg_worker_mode is how the worker waits for its next call.
static inline int hg_worker_mode(hg_place *p) {
	return LD(&p->pin) >= 0 ? HG_SPIN_YIELD : HG_SPIN_TRY;
}

// hg_repin pins the worker to cpu (cpu < 0: lets it go).
static inline void hg_repin(hg_place *p, int cpu) {
	cpu_set_t one, *set = &p->all;
	if (cpu >= 0) {
		CPU_ZERO(&one);
		CPU_SET(cpu, &one);
		set = &one;
	}
	if (sched_setaffinity(p->tid, sizeof *set, set) == 0)
		ST(&p->pin, cpu);
}

// hg_place_wait places the worker for the next call and returns how the
// caller waits for it (HG_SPIN_TRY or HG_SPIN_YIELD). waiting is
// hg_waiting with this caller counted in.
static inline int hg_place_wait(hg_place *p, int32_t waiting) {
	if (LD(&p->tid) == 0)
		return HG_SPIN_TRY;
	if (2 * waiting <= hg_cpus()) {
		if (p->pin < 0)
			return HG_SPIN_TRY;
		if (++p->unsaturated >= HG_UNPIN_AFTER) {
			hg_repin(p, -1);
			if (p->pin < 0)
				return HG_SPIN_TRY;
		}
		return HG_SPIN_YIELD;
	}
	p->unsaturated = 0;
	int cpu = sched_getcpu();
	if (cpu >= 0 && cpu != p->pin)
		hg_repin(p, cpu);
	return p->pin >= 0 ? HG_SPIN_YIELD : HG_SPIN_TRY;
}

#endif
