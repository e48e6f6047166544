/*
 * interleave — the sign throughput of one PKCS#11 module against another's,
 * measured in one process in alternating slices, so that a virtual
 * machine's drifting speed falls on both alike.
 *
 * usage: interleave BASE_MODULE BASE_SLOT MODULE SLOT PIN_FILE EC_LABEL RSA_LABEL SLICE_MS ROUNDS
 *
 * Both modules are loaded and logged in at once (libhapkcs11.so shares an
 * initialised, logged-in SoftHSM with the application, which
 * TestSignBesideSoftHSM checks). For each mechanism and thread count, every thread opens a
 * session on each module; then each round runs four slices of SLICE_MS,
 * base-module-module-base or module-base-base-module in turn (ABBA), with
 * all threads signing through the slice's module. The first fifth of a
 * slice is not counted: libhapkcs11.so, back from SoftHSM's slice, signed
 * 4-12 % slower in the first 20 ms of 100 than in the rest (its threads
 * woke from sleep, its code was cold), which an application using one
 * module all along does not pay. A
 * round's ratio is the module's counted signatures over the base
 * module's. The process's CPU time (getrusage: every thread, the
 * module's workers included) is read at the ends of each counted part, so
 * each module is charged the CPU its slices used. RSA_LABEL "-" leaves RSA
 * out. BASE_MODULE and MODULE may be the same module and slot (an A/A
 * run). Prints, per figure:
 *   sign MECH threads=T base_per_s=N module_per_s=N ratio=MEDIAN q1=Q1 q3=Q3
 *        base_cpu_us=C module_cpu_us=C cpu_ratio=MEDIAN cpu_q1=Q1 cpu_q3=Q3 rounds=R
 * ratio is the median of the rounds' throughput ratios, q1 and q3 their
 * quartiles; cpu_us is CPU per signature, cpu_ratio the median of the
 * rounds' ratios of it (module over base).
 */
#include <pthread.h>
#include <unistd.h>

#include "common.h"

#define MAX_THREADS 8
#define MAX_ROUNDS 1000

static CK_FUNCTION_LIST_PTR mod[2];
static CK_SLOT_ID slot[2];

/* What the workers do now: WAIT, STOP, or sign through module (cur & 1)
 * and count it in bin (cur >> 1): bin 2k is slice k's warm-up, 2k+1 the
 * rest of it. One word, so that no worker reads one slice's module with
 * another's bin. */
enum { WAIT = -1, STOP = -2 };
static volatile int cur = WAIT;

struct worker {
	pthread_t t;
	CK_SESSION_HANDLE s[2];
	CK_OBJECT_HANDLE key[2];
	CK_MECHANISM_TYPE mech;
	unsigned long *n; /* signatures started in each bin */
	CK_RV err;
};

static void *run(void *arg)
{
	struct worker *w = arg;
	for (;;) {
		int c = cur;
		if (c == STOP)
			return NULL;
		if (c == WAIT)
			continue;
		int p = c & 1, k = c >> 1;
		CK_RV rv = sign32(mod[p], w->s[p], w->mech, w->key[p]);
		if (rv != CKR_OK) {
			w->err = rv;
			cur = STOP;
			return NULL;
		}
		w->n[k]++;
	}
}

/* module_of is slice k's module: the four slices of round r go
 * base-module-module-base when r is even, module-base-base-module when odd. */
static int module_of(int k)
{
	int r = k / 4, j = k % 4;
	return (j == 0 || j == 3) ? r % 2 : 1 - r % 2;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* quantile of sorted v[0..n-1], linear between neighbours. */
static double quantile(const double *v, int n, double q)
{
	double i = q * (n - 1);
	int lo = (int)i;
	if (lo + 1 >= n)
		return v[n - 1];
	return v[lo] + (i - lo) * (v[lo + 1] - v[lo]);
}

static void measure(const char *name, CK_MECHANISM_TYPE mech, const char *label, int nthreads, int slice_ms, int rounds)
{
	struct worker w[MAX_THREADS];
	static double ratio[MAX_ROUNDS], cratio[MAX_ROUNDS];
	double *cpu = calloc(4 * rounds, sizeof *cpu); /* CPU µs of each slice's counted part */
	unsigned long total[2] = {0, 0};
	double cputotal[2] = {0, 0};
	int nslices = 4 * rounds;

	memset(w, 0, sizeof w);
	cur = WAIT;
	for (int i = 0; i < nthreads; i++) {
		for (int p = 0; p < 2; p++) {
			CHECK(mod[p]->C_OpenSession(slot[p], CKF_SERIAL_SESSION, NULL, NULL, &w[i].s[p]));
			w[i].key[p] = find_one(mod[p], w[i].s[p], CKO_PRIVATE_KEY, label);
		}
		w[i].mech = mech;
		w[i].n = calloc(2 * nslices, sizeof *w[i].n);
		pthread_create(&w[i].t, NULL, run, &w[i]);
	}
	for (int k = 0; k < nslices && cur != STOP; k++) {
		cur = 2 * (2 * k) + module_of(k);
		usleep(slice_ms * 1000 / 5);
		double c0 = cpu_us();
		cur = 2 * (2 * k + 1) + module_of(k);
		usleep(slice_ms * 1000 * 4 / 5);
		cpu[k] = cpu_us() - c0;
	}
	cur = STOP;
	for (int i = 0; i < nthreads; i++) {
		pthread_join(w[i].t, NULL);
		if (w[i].err != CKR_OK)
			die("C_Sign in the benchmark", w[i].err);
		for (int p = 0; p < 2; p++)
			CHECK(mod[p]->C_CloseSession(w[i].s[p]));
	}
	for (int r = 0; r < rounds; r++) {
		unsigned long got[2] = {0, 0};
		double used[2] = {0, 0};
		for (int k = 4 * r; k < 4 * r + 4; k++) {
			/* Signatures are counted as they start: one per thread in
			 * flight at the slice's end is charged to it. */
			for (int i = 0; i < nthreads; i++)
				got[module_of(k)] += w[i].n[2 * k + 1];
			used[module_of(k)] += cpu[k];
		}
		total[0] += got[0];
		total[1] += got[1];
		cputotal[0] += used[0];
		cputotal[1] += used[1];
		ratio[r] = got[0] ? (double)got[1] / got[0] : 0;
		cratio[r] = got[0] && got[1] && used[0] > 0 ? (used[1] / got[1]) / (used[0] / got[0]) : 0;
	}
	for (int i = 0; i < nthreads; i++)
		free(w[i].n);
	free(cpu);
	qsort(ratio, rounds, sizeof ratio[0], cmp_double);
	qsort(cratio, rounds, sizeof cratio[0], cmp_double);
	double secs = rounds * 2 * slice_ms * 0.8 / 1000.0; /* counted time per module */
	printf("sign %s threads=%d base_per_s=%.0f module_per_s=%.0f ratio=%.3f q1=%.3f q3=%.3f "
	       "base_cpu_us=%.1f module_cpu_us=%.1f cpu_ratio=%.3f cpu_q1=%.3f cpu_q3=%.3f rounds=%d\n",
	       name, nthreads, total[0] / secs, total[1] / secs,
	       quantile(ratio, rounds, 0.5), quantile(ratio, rounds, 0.25), quantile(ratio, rounds, 0.75),
	       total[0] ? cputotal[0] / total[0] : 0, total[1] ? cputotal[1] / total[1] : 0,
	       quantile(cratio, rounds, 0.5), quantile(cratio, rounds, 0.25), quantile(cratio, rounds, 0.75), rounds);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	char pin[256];
	CK_SESSION_HANDLE login[2];

	if (argc != 10) {
		fprintf(stderr, "usage: interleave BASE_MODULE BASE_SLOT MODULE SLOT PIN_FILE EC_LABEL RSA_LABEL SLICE_MS ROUNDS\n");
		return 2;
	}
	CK_ULONG pinlen = read_pin(argv[5], pin, sizeof pin);
	int slice_ms = atoi(argv[8]), rounds = atoi(argv[9]);
	if (slice_ms <= 0 || rounds <= 0 || rounds > MAX_ROUNDS) {
		fprintf(stderr, "interleave: SLICE_MS must be positive and ROUNDS 1-%d\n", MAX_ROUNDS);
		return 2;
	}
	for (int p = 0; p < 2; p++) {
		mod[p] = load_module(argv[1 + 2 * p], NULL);
		slot[p] = strtoul(argv[2 + 2 * p], NULL, 0);
	}
	/* The same module and slot on both sides is an A/A run: it measures
	 * the harness itself (which side a slice is on, its order), with one
	 * C_Initialize and one login. */
	int aa = mod[0] == mod[1] && slot[0] == slot[1];
	for (int p = 0; p < 2 - aa; p++)
		login[p] = init_login(mod[p], slot[p], pin, pinlen);
	for (int threads = 1; threads <= 2; threads++)
		measure("ecdsa-p256", CKM_ECDSA, argv[6], threads, slice_ms, rounds);
	for (int threads = 1; threads <= 2 && strcmp(argv[7], "-") != 0; threads++)
		measure("rsa-2048", CKM_RSA_PKCS, argv[7], threads, slice_ms, rounds);
	/* libhapkcs11.so first: it must leave the SoftHSM it shares alone. */
	for (int p = 1 - aa; p >= 0; p--) {
		CHECK(mod[p]->C_CloseSession(login[p]));
		CHECK(mod[p]->C_Finalize(NULL));
	}
	return 0;
}
