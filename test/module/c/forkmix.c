/*
 * forkmix.c — signing through the helper against the engine in process,
 * interleaved: PROCS processes that load the module after their fork (the
 * engine in each) and PROCS processes forked from a parent that
 * initialised it (each through its helper) take turns, in slices of
 * SLICE_MS, ABBA, for ROUNDS rounds; the first fifth of a slice is not
 * counted. A machine whose speed drifts (a shared virtual machine) then
 * falls on both sides alike, as in interleave.c; the separate runs of
 * forkbench.c are the noisier.
 *
 *   forkmix MODULE SLOT PINFILE LABEL ecdsa|rsa PROCS ROUNDS
 *
 * CPU is each process's and its helper's, every thread's, read from
 * schedstat (ns) at the ends of the counted part. Prints one line: the
 * medians of the rounds' helper / in-process ratios of throughput and of
 * CPU per signature with their quartiles, and each side's signatures per
 * second and CPU µs per signature over all rounds.
 */
#include <dirent.h>
#include <linux/futex.h>
#include <sys/prctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "common.h"

#define SLICE_MS 100
#define MAX_PROCS 16
enum { IN = 0, HELPER = 1, NONE = 2 };

struct mix {
	int turn;  /* the side signing now, or NONE */
	int phase; /* futex word; of slice k: 3k+1 not counted, 3k+2 counted, 3k+3 ended */
	int ready;     /* processes logged in and warm */
	int acked;     /* processes of the side that counted the slice */
	int stop;
	int failed;
	long count[2][MAX_PROCS];
	long long cpu_ns[2][MAX_PROCS];
};

#define LD(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define ST(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)

static void futex_wait(int *w, int v)
{
	syscall(SYS_futex, w, FUTEX_WAIT, v, NULL, NULL, 0); /* shared memory: not _PRIVATE */
}

static void futex_wake(int *w)
{
	syscall(SYS_futex, w, FUTEX_WAKE, 1 << 30, NULL, NULL, 0);
}

/* task_cpu_ns is the CPU every thread of pid has used, in ns. */
static long long task_cpu_ns(pid_t pid)
{
	char path[320];
	snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
	DIR *d = opendir(path);
	if (d == NULL)
		return 0;
	long long sum = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof path, "/proc/%d/task/%s/schedstat", (int)pid, e->d_name);
		FILE *fp = fopen(path, "r");
		long long ns = 0;
		if (fp != NULL) {
			if (fscanf(fp, "%lld", &ns) == 1)
				sum += ns;
			fclose(fp);
		}
	}
	closedir(d);
	return sum;
}

static void signer(struct mix *mx, int side, int i, CK_FUNCTION_LIST_PTR f, const char *slotArg, char *pin,
		   CK_ULONG pinlen, const char *label, CK_MECHANISM_TYPE mech, int procs)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL); /* the run is over when its controller is */
	/* One after another: see forkbench.c. */
	int order = side * procs + i;
	while (LD(&mx->ready) < order)
		usleep(1000);
	CK_SESSION_HANDLE s = init_login_slot(f, slotArg, pin, pinlen);
	CK_OBJECT_HANDLE key = find_one(f, s, CKO_PRIVATE_KEY, label);
	pid_t helper = 0;
	if (side == HELPER)
		child_pids(0, &helper, 1);
	CHECK(sign32(f, s, mech, key)); /* warm */
	__atomic_fetch_add(&mx->ready, 1, __ATOMIC_SEQ_CST);
	for (int counted = -1;;) { /* counted: the last slice this process counted */
		int ph = LD(&mx->phase);
		if (LD(&mx->stop))
			break;
		int k = (ph - 1) / 3;
		if (LD(&mx->turn) != side || k == counted) {
			futex_wait(&mx->phase, ph);
			continue;
		}
		if (ph % 3 == 1) { /* the slice's first fifth */
			while (LD(&mx->phase) == ph)
				if (sign32(f, s, mech, key) != CKR_OK)
					ST(&mx->failed, 1);
			ph++;
		}
		if (ph % 3 == 2 && LD(&mx->phase) == ph) { /* counted (a process that wakes late counts nothing) */
			long n = 0;
			long long c0 = task_cpu_ns(getpid()) + (helper ? task_cpu_ns(helper) : 0);
			while (LD(&mx->phase) == ph) {
				if (sign32(f, s, mech, key) != CKR_OK)
					ST(&mx->failed, 1);
				n++;
			}
			mx->count[side][i] += n;
			mx->cpu_ns[side][i] += task_cpu_ns(getpid()) + (helper ? task_cpu_ns(helper) : 0) - c0;
		}
		counted = k;
		__atomic_fetch_add(&mx->acked, 1, __ATOMIC_SEQ_CST);
	}
	f->C_Finalize(NULL);
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
	while (nanosleep(&ts, &ts) != 0)
		;
}

/* slice gives side its turn for one slice and returns what it counted. */
static void slice(struct mix *mx, int side, int procs, long *count, long long *cpu_ns)
{
	int ph = LD(&mx->phase);
	ST(&mx->acked, 0);
	ST(&mx->turn, side);
	ST(&mx->phase, ph + 1);
	futex_wake(&mx->phase);
	sleep_ms(SLICE_MS / 5);
	ST(&mx->phase, ph + 2);
	futex_wake(&mx->phase);
	sleep_ms(SLICE_MS - SLICE_MS / 5);
	ST(&mx->phase, ph + 3);
	futex_wake(&mx->phase);
	double t0 = now_seconds();
	while (LD(&mx->acked) < procs) {
		if (now_seconds() - t0 > 60) {
			fprintf(stderr, "FATAL the processes did not end their slice within 60 s\n");
			exit(1);
		}
		usleep(100);
	}
	ST(&mx->turn, NONE);
	for (int i = 0; i < procs; i++) {
		*count += mx->count[side][i];
		*cpu_ns += mx->cpu_ns[side][i];
		mx->count[side][i] = 0;
		mx->cpu_ns[side][i] = 0;
	}
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* quartiles sorts v and gives its median and quartiles. */
static void quartiles(double *v, int n, double *q1, double *med, double *q3)
{
	qsort(v, n, sizeof *v, cmp_double);
	*q1 = v[n / 4];
	*med = v[n / 2];
	*q3 = v[(3 * n) / 4 < n ? (3 * n) / 4 : n - 1];
}

int main(int argc, char **argv)
{
	char pin[256];
	if (argc != 8) {
		fprintf(stderr, "usage: forkmix MODULE SLOT PINFILE LABEL ecdsa|rsa PROCS ROUNDS\n");
		return 2;
	}
	CK_ULONG pinlen = read_pin(argv[3], pin, sizeof pin);
	CK_MECHANISM_TYPE mech = strcmp(argv[5], "rsa") == 0 ? CKM_RSA_PKCS : CKM_ECDSA;
	int procs = atoi(argv[6]), rounds = atoi(argv[7]);
	if (procs < 1 || procs > MAX_PROCS || rounds < 1) {
		fprintf(stderr, "forkmix: PROCS must be 1..%d and ROUNDS at least 1\n", MAX_PROCS);
		return 2;
	}
	struct mix *mx = mmap(NULL, sizeof *mx, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	memset(mx, 0, sizeof *mx);
	mx->turn = NONE;
	fflush(NULL);
	/* The in-process side forks before this process loads the module: each
	 * loads it and runs the engine itself. */
	for (int i = 0; i < procs; i++) {
		if (fork() == 0) {
			signer(mx, IN, i, load_module(argv[1], NULL), argv[2], pin, pinlen, argv[4], mech, procs);
			_exit(0);
		}
	}
	CK_C_INITIALIZE_ARGS a = {0};
	a.flags = CKF_OS_LOCKING_OK;
	CK_FUNCTION_LIST_PTR f = load_module(argv[1], NULL);
	CHECK(f->C_Initialize(&a)); /* the helper side forks from this engine */
	fflush(NULL);
	for (int i = 0; i < procs; i++) {
		if (fork() == 0) {
			signer(mx, HELPER, i, f, argv[2], pin, pinlen, argv[4], mech, procs);
			_exit(0);
		}
	}
	double t0 = now_seconds();
	while (LD(&mx->ready) < 2 * procs) {
		if (now_seconds() - t0 > 120) {
			fprintf(stderr, "FATAL the processes did not log in within 120 s\n");
			return 1;
		}
		usleep(1000);
	}
	double thr[rounds], cpu[rounds];
	long all[2] = {0};
	long long allNs[2] = {0};
	static const int order[4] = {IN, HELPER, HELPER, IN};
	for (int r = 0; r < rounds; r++) {
		long n[2] = {0};
		long long ns[2] = {0};
		for (int k = 0; k < 4; k++)
			slice(mx, order[k], procs, &n[order[k]], &ns[order[k]]);
		if (n[IN] == 0 || n[HELPER] == 0) {
			fprintf(stderr, "FATAL round %d: no signature on one side (%ld in process, %ld through helpers)\n", r, n[IN], n[HELPER]);
			return 1;
		}
		thr[r] = (double)n[HELPER] / (double)n[IN];
		cpu[r] = ((double)ns[HELPER] / (double)n[HELPER]) / ((double)ns[IN] / (double)n[IN]);
		for (int s = 0; s < 2; s++) {
			all[s] += n[s];
			allNs[s] += ns[s];
		}
	}
	ST(&mx->stop, 1);
	__atomic_fetch_add(&mx->phase, 1, __ATOMIC_SEQ_CST);
	futex_wake(&mx->phase);
	int bad = LD(&mx->failed), st;
	while (wait(&st) > 0)
		bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
	double tq1, tmed, tq3, cq1, cmed, cq3;
	quartiles(thr, rounds, &tq1, &tmed, &tq3);
	quartiles(cpu, rounds, &cq1, &cmed, &cq3);
	double counted = rounds * 2 * (SLICE_MS - SLICE_MS / 5) / 1000.0; /* seconds per side */
	printf("%s procs=%d rounds=%d throughput=%.2f (%.2f-%.2f) cpu=%.2f (%.2f-%.2f) in_sign/s=%.0f in_cpu_us/sign=%.1f helper_sign/s=%.0f helper_cpu_us/sign=%.1f\n",
	       argv[5], procs, rounds, tmed, tq1, tq3, cmed, cq1, cq3, all[IN] / counted, allNs[IN] / 1e3 / (double)all[IN],
	       all[HELPER] / counted, allNs[HELPER] / 1e3 / (double)all[HELPER]);
	if (bad)
		fprintf(stderr, "FAILED a signature failed, or a process did not end well\n");
	return bad;
}
