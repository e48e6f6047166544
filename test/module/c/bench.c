/*
 * bench — sign throughput of a PKCS#11 module, and what loading it costs.
 *
 * usage: bench MODULE SLOT_ID PIN_FILE EC_LABEL RSA_LABEL SECONDS
 *
 * Prints, one per line:
 *   load_init_us N      dlopen + C_GetFunctionList + C_Initialize
 *   rss_added_kb N      resident memory added by the load and initialisation
 *   sign MECH threads=T ops_per_s=N cpu_us=C   (MECH: ecdsa-p256, rsa-2048;
 *                                     C: the process's CPU per signature)
 * Each thread has its own session and signs 32 bytes (ECDSA) or a 32-byte
 * value with CKM_RSA_PKCS for SECONDS seconds.
 */
#include <pthread.h>
#include <unistd.h>

#include "common.h"

static long rss_kb(void)
{
	FILE *fp = fopen("/proc/self/status", "r");
	char line[256];
	long kb = -1;
	if (fp == NULL)
		return -1;
	while (fgets(line, sizeof line, fp))
		if (strncmp(line, "VmRSS:", 6) == 0)
			kb = strtol(line + 6, NULL, 10);
	fclose(fp);
	return kb;
}

static CK_FUNCTION_LIST_PTR f;
static volatile int go, stop;

struct worker {
	pthread_t t;
	CK_SESSION_HANDLE s;
	CK_OBJECT_HANDLE key;
	CK_MECHANISM_TYPE mech;
	unsigned long n;
	CK_RV err;
};

static void *run(void *arg)
{
	struct worker *w = arg;
	while (!go)
		;
	while (!stop) {
		CK_RV rv = sign32(f, w->s, w->mech, w->key);
		if (rv != CKR_OK) {
			w->err = rv;
			return NULL;
		}
		w->n++;
	}
	return NULL;
}

static void measure(const char *name, CK_MECHANISM_TYPE mech, const char *label, CK_SLOT_ID slot, int nthreads, double seconds)
{
	struct worker w[8];
	memset(w, 0, sizeof w);
	go = stop = 0;
	for (int i = 0; i < nthreads; i++) {
		CHECK(f->C_OpenSession(slot, CKF_SERIAL_SESSION, NULL, NULL, &w[i].s));
		w[i].key = find_one(f, w[i].s, CKO_PRIVATE_KEY, label);
		w[i].mech = mech;
		pthread_create(&w[i].t, NULL, run, &w[i]);
	}
	double c0 = cpu_us();
	double t0 = run_for(&go, &stop, seconds);
	unsigned long total = 0;
	for (int i = 0; i < nthreads; i++) {
		pthread_join(w[i].t, NULL);
		if (w[i].err != CKR_OK)
			die("C_Sign in the benchmark", w[i].err);
		total += w[i].n;
		CHECK(f->C_CloseSession(w[i].s));
	}
	double dt = now_seconds() - t0, dc = cpu_us() - c0;
	printf("sign %s threads=%d ops_per_s=%.0f cpu_us=%.1f\n", name, nthreads, (double)total / dt, total ? dc / total : 0);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	char pin[256];
	CK_ULONG pinlen;
	CK_SESSION_HANDLE s;

	if (argc != 7) {
		fprintf(stderr, "usage: bench MODULE SLOT_ID PIN_FILE EC_LABEL RSA_LABEL SECONDS\n");
		return 2;
	}
	CK_SLOT_ID slot = strtoul(argv[2], NULL, 0);
	pinlen = read_pin(argv[3], pin, sizeof pin);
	double seconds = atof(argv[6]);

	long rss0 = rss_kb();
	double t0 = now_seconds();
	f = load_module(argv[1], NULL);
	CK_C_INITIALIZE_ARGS a;
	memset(&a, 0, sizeof a);
	a.flags = CKF_OS_LOCKING_OK;
	CHECK(f->C_Initialize(&a));
	double t1 = now_seconds();
	long rss1 = rss_kb();
	printf("load_init_us %.0f\n", (t1 - t0) * 1e6);
	printf("rss_added_kb %ld\n", rss1 - rss0);

	CHECK(f->C_OpenSession(slot, CKF_SERIAL_SESSION, NULL, NULL, &s));
	CHECK(f->C_Login(s, CKU_USER, (CK_UTF8CHAR_PTR)pin, pinlen));
	for (int threads = 1; threads <= 2; threads++)
		measure("ecdsa-p256", CKM_ECDSA, argv[4], slot, threads, seconds);
	for (int threads = 1; threads <= 2; threads++)
		measure("rsa-2048", CKM_RSA_PKCS, argv[5], slot, threads, seconds);
	printf("rss_after_kb %ld\n", rss_kb() - rss0);
	CHECK(f->C_CloseSession(s));
	CHECK(f->C_Finalize(NULL));
	return 0;
}
