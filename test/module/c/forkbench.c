/*
 * forkbench.c — sign throughput and CPU per signature of N processes, each
 * either forked from a parent that initialised the module (its calls go
 * through its helper) or loading the module itself after the fork (the
 * engine in its own process; softhsm: MODULE is the token's own; p11kit:
 * MODULE is p11-kit-client.so and a `p11-kit server` signs).
 *
 *   forkbench helper|inprocess|softhsm|p11kit MODULE SLOT PINFILE LABEL ecdsa|rsa PROCS SECONDS
 *
 * SLOT is a number, or label=L for the token labelled L. With
 * HAP_BENCH_SERVER_PID set, the CPU of that server and its children (the
 * processes of p11-kit server that serve each connection) is counted too,
 * read before the clock starts and before any process lets go of its
 * connection. The processes log in one after another (SoftHSM processes
 * that start on one token directory while another logs in may read a
 * token torn: docs/DESIGN.md), then sign together.
 *
 * Prints one line: mode, mechanism, processes, signatures per second in
 * all, CPU µs per signature (the processes', their helpers' and the
 * server's), the server's share of it, and the helpers' mean RSS in KiB
 * and the anonymous part of it (0 without helpers).
 */
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "common.h"

struct result {
	long count;
	double cpu_us;    /* the process's own */
	double helper_us; /* its helper's */
	long helper_rss_kb;
	long helper_anon_kb; /* of it, the helper's own memory (not mapped files) */
	int failed;
};

/* proc_cpu_us returns a process's user + system CPU, and its RSS and the
 * anonymous part of it (rss_kb may be NULL: neither); with children, its
 * reaped children's CPU too. */
static double proc_cpu_us_of(pid_t pid, long *rss_kb, long *anon_kb, int children)
{
	char path[64], buf[4096];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	FILE *fp = fopen(path, "r");
	if (fp == NULL)
		return 0;
	size_t n = fread(buf, 1, sizeof buf - 1, fp);
	fclose(fp);
	buf[n] = 0;
	char *p = strrchr(buf, ')');
	unsigned long ut = 0, st = 0;
	long cut = 0, cst = 0;
	/* fields after the command: state(3) ... utime(14) stime(15) cutime(16) cstime(17) */
	if (p == NULL || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu %ld %ld", &ut, &st, &cut, &cst) != 4)
		return 0;
	if (children)
		ut += (unsigned long)(cut + cst);
	if (rss_kb == NULL)
		return (double)(ut + st) * 1e6 / (double)sysconf(_SC_CLK_TCK);
	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	if ((fp = fopen(path, "r")) != NULL) {
		while (fgets(buf, sizeof buf, fp) != NULL) {
			sscanf(buf, "VmRSS: %ld", rss_kb);
			sscanf(buf, "RssAnon: %ld", anon_kb);
		}
		fclose(fp);
	}
	return (double)(ut + st) * 1e6 / (double)sysconf(_SC_CLK_TCK);
}

static double proc_cpu_us(pid_t pid, long *rss_kb, long *anon_kb)
{
	return proc_cpu_us_of(pid, rss_kb, anon_kb, 0);
}

/* server_cpu_us is the CPU of a server, its reaped children's and its
 * living children's. */
static double server_cpu_us(pid_t server)
{
	pid_t kids[512];
	double cpu = proc_cpu_us_of(server, NULL, NULL, 1);
	size_t n = child_pids(server, kids, 512);
	for (size_t i = 0; i < n; i++)
		cpu += proc_cpu_us_of(kids[i], NULL, NULL, 1);
	return cpu;
}

/* The processes' meeting points (shared memory). */
struct meet {
	volatile int go;  /* the clock started */
	int ready;        /* logged in and signed once */
	int done;         /* finished signing */
	volatile int let; /* the server's CPU was read: let go of the module */
};

static void worker(CK_FUNCTION_LIST_PTR f, const char *slotArg, char *pin, CK_ULONG pinlen, const char *label,
		   CK_MECHANISM_TYPE mech, double seconds, struct meet *mt, int i, struct result *r)
{
	/* One after another: see the head of this file. */
	while (__atomic_load_n(&mt->ready, __ATOMIC_SEQ_CST) < i)
		usleep(1000);
	CK_SESSION_HANDLE s = init_login_slot(f, slotArg, pin, pinlen);
	CK_OBJECT_HANDLE key = find_one(f, s, CKO_PRIVATE_KEY, label);
	pid_t helper = 0;
	child_pids(0, &helper, 1);
	CHECK(sign32(f, s, mech, key)); /* warm */
	__atomic_fetch_add(&mt->ready, 1, __ATOMIC_SEQ_CST);
	while (!mt->go)
		usleep(200);
	double cpu0 = cpu_us(), t0 = now_seconds(), h0 = helper ? proc_cpu_us(helper, &r->helper_rss_kb, &r->helper_anon_kb) : 0;
	while (now_seconds() - t0 < seconds) {
		if (sign32(f, s, mech, key) != CKR_OK) {
			r->failed = 1;
			break;
		}
		r->count++;
	}
	r->cpu_us = cpu_us() - cpu0;
	if (helper)
		r->helper_us = proc_cpu_us(helper, &r->helper_rss_kb, &r->helper_anon_kb) - h0;
	__atomic_fetch_add(&mt->done, 1, __ATOMIC_SEQ_CST);
	while (!mt->let)
		usleep(1000);
	f->C_Finalize(NULL);
}

int main(int argc, char **argv)
{
	char pin[256];
	if (argc != 9) {
		fprintf(stderr, "usage: forkbench helper|inprocess|softhsm|p11kit MODULE SLOT PINFILE LABEL ecdsa|rsa PROCS SECONDS\n");
		return 2;
	}
	int helper = strcmp(argv[1], "helper") == 0;
	CK_ULONG pinlen = read_pin(argv[4], pin, sizeof pin);
	CK_MECHANISM_TYPE mech = strcmp(argv[6], "rsa") == 0 ? CKM_RSA_PKCS : CKM_ECDSA;
	int procs = atoi(argv[7]);
	double seconds = atof(argv[8]);
	const char *serverEnv = getenv("HAP_BENCH_SERVER_PID");
	pid_t server = serverEnv != NULL ? atoi(serverEnv) : 0;
	struct result *res = mmap(NULL, sizeof *res * procs, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct meet *mt = mmap(NULL, sizeof *mt, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	memset(mt, 0, sizeof *mt);
	CK_FUNCTION_LIST_PTR f = NULL;
	if (helper) {
		CK_C_INITIALIZE_ARGS a = {0};
		a.flags = CKF_OS_LOCKING_OK;
		f = load_module(argv[2], NULL);
		CHECK(f->C_Initialize(&a)); /* the parent's engine; the children fork from it */
	}
	memset(res, 0, sizeof *res * procs);
	fflush(NULL);
	for (int i = 0; i < procs; i++) {
		if (fork() == 0) {
			CK_FUNCTION_LIST_PTR g = helper ? f : load_module(argv[2], NULL);
			worker(g, argv[3], pin, pinlen, argv[5], mech, seconds, mt, i, &res[i]);
			_exit(0);
		}
	}
	/* Every process logged in and signed once before the clock starts. */
	double t0 = now_seconds();
	while (__atomic_load_n(&mt->ready, __ATOMIC_SEQ_CST) < procs && now_seconds() - t0 < 120)
		usleep(1000);
	double s0 = server ? server_cpu_us(server) : 0;
	mt->go = 1;
	t0 = now_seconds();
	while (__atomic_load_n(&mt->done, __ATOMIC_SEQ_CST) < procs && now_seconds() - t0 < seconds + 120)
		usleep(1000);
	double serverUs = server ? server_cpu_us(server) - s0 : 0;
	mt->let = 1;
	int bad = 0, st;
	while (wait(&st) > 0)
		bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
	long count = 0, rss = 0, anon = 0;
	double cpu = serverUs;
	for (int i = 0; i < procs; i++) {
		count += res[i].count;
		cpu += res[i].cpu_us + res[i].helper_us;
		rss += res[i].helper_rss_kb;
		anon += res[i].helper_anon_kb;
		bad |= res[i].failed;
	}
	printf("%s %s procs=%d sign/s=%.0f cpu_us/sign=%.1f server_us/sign=%.1f helper_rss_kib=%ld helper_anon_kib=%ld\n", argv[1], argv[6],
	       procs, count / seconds, count ? cpu / count : 0, count ? serverUs / count : 0, rss / procs, anon / procs);
	return bad;
}
