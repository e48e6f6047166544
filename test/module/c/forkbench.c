/*
 * forkbench.c — sign throughput and CPU per signature of N processes, each
 * either forked from a parent that initialised the module (its calls go
 * through its helper) or loading the module itself after the fork (the
 * engine in its own process).
 *
 *   forkbench helper|inprocess MODULE SLOT PINFILE LABEL ecdsa|rsa PROCS SECONDS
 *
 * Prints one line: mode, mechanism, processes, signatures per second in
 * all, CPU µs per signature (the processes' and their helpers'), and the
 * helpers' mean RSS in KiB and the anonymous part of it (0 in process).
 */
#include <sched.h>
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

static pid_t only_child(void)
{
	char path[128], list[256];
	int pid = 0;
	snprintf(path, sizeof path, "/proc/self/task/%d/children", (int)getpid());
	FILE *fp = fopen(path, "r");
	if (fp == NULL)
		return 0;
	size_t n = fread(list, 1, sizeof list - 1, fp);
	fclose(fp);
	list[n] = 0;
	sscanf(list, "%d", &pid);
	return pid;
}

/* proc_cpu_us returns a process's user + system CPU, and its RSS. */
static double proc_cpu_us(pid_t pid, long *rss_kb, long *anon_kb)
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
	/* fields after the command: state(3) ... utime(14) stime(15) */
	if (p == NULL || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		return 0;
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

static void worker(CK_FUNCTION_LIST_PTR f, CK_SLOT_ID slot, char *pin, CK_ULONG pinlen, const char *label,
		   CK_MECHANISM_TYPE mech, double seconds, volatile int *go, int *ready, struct result *r)
{
	CK_SESSION_HANDLE s = init_login(f, slot, pin, pinlen);
	CK_OBJECT_HANDLE key = find_one(f, s, CKO_PRIVATE_KEY, label);
	pid_t helper = only_child();
	CHECK(sign32(f, s, mech, key)); /* warm */
	__atomic_fetch_add(ready, 1, __ATOMIC_SEQ_CST);
	while (!*go)
		sched_yield();
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
	f->C_Finalize(NULL);
}

int main(int argc, char **argv)
{
	char pin[256];
	if (argc != 9) {
		fprintf(stderr, "usage: forkbench helper|inprocess MODULE SLOT PINFILE LABEL ecdsa|rsa PROCS SECONDS\n");
		return 2;
	}
	int helper = strcmp(argv[1], "helper") == 0;
	CK_SLOT_ID slot = strtoul(argv[3], NULL, 0);
	CK_ULONG pinlen = read_pin(argv[4], pin, sizeof pin);
	CK_MECHANISM_TYPE mech = strcmp(argv[6], "rsa") == 0 ? CKM_RSA_PKCS : CKM_ECDSA;
	int procs = atoi(argv[7]);
	double seconds = atof(argv[8]);
	struct result *res = mmap(NULL, sizeof *res * procs, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	int *shared = mmap(NULL, 2 * sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	volatile int *go = &shared[0];
	int *ready = &shared[1];
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
			worker(g, slot, pin, pinlen, argv[5], mech, seconds, go, ready, &res[i]);
			_exit(0);
		}
	}
	/* Every process logged in and signed once before the clock starts. */
	double t0 = now_seconds();
	while (__atomic_load_n(ready, __ATOMIC_SEQ_CST) < procs && now_seconds() - t0 < 60)
		usleep(1000);
	*go = 1;
	int bad = 0, st;
	while (wait(&st) > 0)
		bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
	long count = 0, rss = 0, anon = 0;
	double cpu = 0;
	for (int i = 0; i < procs; i++) {
		count += res[i].count;
		cpu += res[i].cpu_us + res[i].helper_us;
		rss += res[i].helper_rss_kb;
		anon += res[i].helper_anon_kb;
		bad |= res[i].failed;
	}
	printf("%s %s procs=%d sign/s=%.0f cpu_us/sign=%.1f helper_rss_kib=%ld helper_anon_kib=%ld\n", argv[1], argv[6], procs,
	       count / seconds, count ? cpu / count : 0, rss / procs, anon / procs);
	return bad;
}
