/*
 * pairs — what handing each signature to another thread costs by itself,
 * with no Go and no engine: every signing thread hands its C_SignInit +
 * C_Sign to a worker thread of its own through internal/handoff's cell
 * (cell.h), as libhapkcs11.so's lanes do, and waits for the answer. It is
 * the floor under libhapkcs11.so's figures in test/module/bench.sh.
 *
 * usage: pairs MODULE SLOT_ID PIN_FILE EC_LABEL MODE THREADS SECONDS
 *
 * MODE is how the two threads wait for each other:
 *   direct  no worker: the signing thread calls the module itself
 *   sleep   on a futex at once
 *   spin    spinning on a CPU while one is free, then on a futex
 *   yield   yielding the CPU at every turn, then on a futex
 *   lanes   the lanes' way (internal/handoff/place.h): spinning while the
 *           signing threads are at most half the CPUs, beyond that
 *           yielding with the worker pinned to its caller's CPU
 * Prints: sign ecdsa-p256 threads=T ops_per_s=N
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include "common.h"
#include "place.h"

int32_t hg_busy, hg_ncpu, hg_waiting;

enum { DIRECT, SLEEP, SPIN, YIELD, LANES };
static const char *modes[] = {"direct", "sleep", "spin", "yield", "lanes"};

#define CALLER_SPIN_NS 1000000 /* bounds a wait's spinning, as the lanes' HG_LANE_FIT_MAX */
#define WORKER_SPIN_NS 50000   /* pkg/slot's workerSpin */
#define TIMEOUT_NS 3000000000LL

static CK_FUNCTION_LIST_PTR f;
static volatile int go, stop;
static int mode;

struct pair {
	pthread_t caller, worker;
	CK_SESSION_HANDLE s;
	CK_OBJECT_HANDLE key;
	hg_cell cell;
	hg_place place;
	CK_RV rv;
	unsigned long n;
};

static CK_RV sign(struct pair *p)
{
	CK_MECHANISM m = {CKM_ECDSA, NULL, 0};
	CK_BYTE data[32], sig[128];
	CK_ULONG n = sizeof sig;
	memset(data, 7, sizeof data);
	CK_RV rv = f->C_SignInit(p->s, &m, p->key);
	return rv == CKR_OK ? f->C_Sign(p->s, data, sizeof data, sig, &n) : rv;
}

static void *worker(void *arg)
{
	struct pair *p = arg;
	uint32_t last = 0;
	hg_place_started(&p->place);
	for (;;) {
		switch (mode) {
		case SLEEP:
			last = hg_next(&p->cell, last, 0);
			break;
		case SPIN:
			last = hg_next(&p->cell, last, WORKER_SPIN_NS);
			break;
		case YIELD:
			last = hg_next_as(&p->cell, last, WORKER_SPIN_NS, HG_SPIN_YIELD);
			break;
		default:
			last = hg_next_as(&p->cell, last, WORKER_SPIN_NS, hg_worker_mode(&p->place));
		}
		p->rv = sign(p);
		hg_done(&p->cell, last);
	}
	return NULL;
}

static void *caller(void *arg)
{
	struct pair *p = arg;
	while (!go)
		;
	while (!stop) {
		CK_RV rv;
		if (mode == DIRECT) {
			rv = sign(p);
		} else {
			int how = mode == YIELD ? HG_SPIN_YIELD : HG_SPIN_TRY;
			if (mode == LANES)
				how = hg_place_wait(&p->place, __atomic_add_fetch(&hg_waiting, 1, __ATOMIC_SEQ_CST));
			uint32_t seq = hg_post(&p->cell);
			int got = hg_wait_as(&p->cell, seq, mode == SLEEP ? 0 : CALLER_SPIN_NS, TIMEOUT_NS, how);
			if (mode == LANES)
				__atomic_sub_fetch(&hg_waiting, 1, __ATOMIC_SEQ_CST);
			if (got != 0)
				die("waiting for the worker", CKR_GENERAL_ERROR);
			rv = p->rv;
		}
		if (rv != CKR_OK)
			die("C_Sign", rv);
		p->n++;
	}
	return NULL;
}

int main(int argc, char **argv)
{
	char pin[256];
	static struct pair pairs[8];

	if (argc != 8) {
		fprintf(stderr, "usage: pairs MODULE SLOT_ID PIN_FILE EC_LABEL MODE THREADS SECONDS\n");
		return 2;
	}
	CK_SLOT_ID slot = strtoul(argv[2], NULL, 0);
	CK_ULONG pinlen = read_pin(argv[3], pin, sizeof pin);
	mode = -1;
	for (int i = 0; i < (int)(sizeof modes / sizeof modes[0]); i++)
		if (strcmp(argv[5], modes[i]) == 0)
			mode = i;
	int threads = atoi(argv[6]);
	double seconds = atof(argv[7]);
	if (mode < 0 || threads < 1 || threads > 8) {
		fprintf(stderr, "pairs: MODE is direct, sleep, spin, yield or lanes; THREADS 1 to 8\n");
		return 2;
	}

	f = load_module(argv[1], NULL);
	init_login(f, slot, pin, pinlen);
	for (int i = 0; i < threads; i++) {
		struct pair *p = &pairs[i];
		hg_place_init(&p->place);
		CHECK(f->C_OpenSession(slot, CKF_SERIAL_SESSION, NULL, NULL, &p->s));
		p->key = find_one(f, p->s, CKO_PRIVATE_KEY, argv[4]);
		if (mode != DIRECT)
			pthread_create(&p->worker, NULL, worker, p);
		pthread_create(&p->caller, NULL, caller, p);
	}
	double t0 = run_for(&go, &stop, seconds);
	unsigned long total = 0;
	for (int i = 0; i < threads; i++) {
		pthread_join(pairs[i].caller, NULL);
		total += pairs[i].n;
	}
	printf("sign ecdsa-p256 threads=%d ops_per_s=%.0f\n", threads, total / (now_seconds() - t0));
	fflush(stdout);
	_exit(0); /* the workers wait on: no C_Finalize under them */
}
