/*
 * common.h — what the C test programs share: loading a PKCS#11 module with
 * dlopen, reading a PIN from a file (never from argv), finding a key by
 * label, and checked calls.
 */
#ifndef HAP_TEST_COMMON_H
#define HAP_TEST_COMMON_H

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <unistd.h>

#include "hapkcs11.h"

static inline void die(const char *what, CK_RV rv)
{
	fprintf(stderr, "FATAL %s: rv=0x%lx\n", what, (unsigned long)rv);
	exit(2);
}

#define CHECK(call)                          \
	do {                                 \
		CK_RV rv_ = (call);          \
		if (rv_ != CKR_OK)           \
			die(#call, rv_);     \
	} while (0)

/* child_pids puts the pids of process of's children (0: this process's)
 * in pids, at most max of them, and returns how many it has (the helper a
 * forked child starts is its child). */
static inline size_t child_pids(pid_t of, pid_t *pids, size_t max)
{
	char path[128], list[4096];
	if (of == 0)
		of = getpid();
	snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)of, (int)of);
	FILE *fp = fopen(path, "r");
	if (fp == NULL)
		return 0;
	size_t n = fread(list, 1, sizeof list - 1, fp), count = 0;
	fclose(fp);
	list[n] = 0;
	char *save = NULL;
	for (char *t = strtok_r(list, " \n", &save); t != NULL && count < max; t = strtok_r(NULL, " \n", &save))
		pids[count++] = (pid_t)atoi(t);
	return count;
}

/* load_module dlopens path and returns its function list. */
static inline CK_FUNCTION_LIST_PTR load_module(const char *path, void **handle)
{
	CK_RV (*get)(CK_FUNCTION_LIST_PTR_PTR);
	CK_FUNCTION_LIST_PTR f = NULL;
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		fprintf(stderr, "FATAL dlopen %s: %s\n", path, dlerror());
		exit(2);
	}
	get = (CK_RV(*)(CK_FUNCTION_LIST_PTR_PTR))dlsym(h, "C_GetFunctionList");
	if (get == NULL) {
		fprintf(stderr, "FATAL %s has no C_GetFunctionList\n", path);
		exit(2);
	}
	CHECK(get(&f));
	if (handle)
		*handle = h;
	return f;
}

/* read_pin reads the first line of a file into buf. */
static inline CK_ULONG read_pin(const char *file, char *buf, size_t size)
{
	FILE *fp = fopen(file, "r");
	size_t n;
	if (fp == NULL) {
		fprintf(stderr, "FATAL open PIN file %s: %s\n", file, strerror(errno));
		exit(2);
	}
	if (fgets(buf, (int)size, fp) == NULL) {
		fprintf(stderr, "FATAL PIN file %s is empty\n", file);
		exit(2);
	}
	fclose(fp);
	n = strcspn(buf, "\r\n");
	buf[n] = 0;
	return (CK_ULONG)n;
}

/* find_one returns the one object of class cls labelled label. */
static inline CK_OBJECT_HANDLE find_one(CK_FUNCTION_LIST_PTR f, CK_SESSION_HANDLE s, CK_OBJECT_CLASS cls, const char *label)
{
	CK_ATTRIBUTE t[] = {
		{CKA_CLASS, &cls, sizeof cls},
		{CKA_LABEL, (void *)label, strlen(label)},
	};
	CK_OBJECT_HANDLE h[2];
	CK_ULONG n = 0;
	CHECK(f->C_FindObjectsInit(s, t, 2));
	CHECK(f->C_FindObjects(s, h, 2, &n));
	CHECK(f->C_FindObjectsFinal(s));
	if (n != 1) {
		fprintf(stderr, "FATAL found %lu objects labelled %s, want 1\n", (unsigned long)n, label);
		exit(2);
	}
	return h[0];
}

/* init_login initialises f (OS locking) and returns a session on slot
 * logged in as the user. */
static inline CK_SESSION_HANDLE init_login(CK_FUNCTION_LIST_PTR f, CK_SLOT_ID slot, char *pin, CK_ULONG pinlen)
{
	CK_C_INITIALIZE_ARGS a;
	CK_SESSION_HANDLE s;
	memset(&a, 0, sizeof a);
	a.flags = CKF_OS_LOCKING_OK;
	CHECK(f->C_Initialize(&a));
	CHECK(f->C_OpenSession(slot, CKF_SERIAL_SESSION, NULL, NULL, &s));
	CHECK(f->C_Login(s, CKU_USER, (CK_UTF8CHAR_PTR)pin, pinlen));
	return s;
}

/* slot_of reads SLOT: a number, or label=L (found after C_Initialize). */
static inline CK_SLOT_ID slot_of(CK_FUNCTION_LIST_PTR f, const char *arg)
{
	if (strncmp(arg, "label=", 6) != 0)
		return strtoul(arg, NULL, 0);
	CK_SLOT_ID ids[64];
	CK_ULONG n = 64;
	size_t len = strlen(arg + 6);
	CHECK(f->C_GetSlotList(CK_TRUE, ids, &n));
	for (CK_ULONG i = 0; i < n; i++) {
		CK_TOKEN_INFO ti;
		if (f->C_GetTokenInfo(ids[i], &ti) == CKR_OK && len <= sizeof ti.label &&
		    memcmp(ti.label, arg + 6, len) == 0 && (len == sizeof ti.label || ti.label[len] == ' '))
			return ids[i];
	}
	fprintf(stderr, "FATAL no token %s\n", arg);
	exit(2);
}

/* init_login_slot is init_login on SLOT as slot_of reads it. */
static inline CK_SESSION_HANDLE init_login_slot(CK_FUNCTION_LIST_PTR f, const char *slotArg, char *pin, CK_ULONG pinlen)
{
	CK_C_INITIALIZE_ARGS a;
	CK_SESSION_HANDLE s;
	memset(&a, 0, sizeof a);
	a.flags = CKF_OS_LOCKING_OK;
	CHECK(f->C_Initialize(&a));
	CHECK(f->C_OpenSession(slot_of(f, slotArg), CKF_SERIAL_SESSION, NULL, NULL, &s));
	CHECK(f->C_Login(s, CKU_USER, (CK_UTF8CHAR_PTR)pin, pinlen));
	return s;
}

/* sign32 signs 32 bytes with key under mech (no parameter), C_SignInit
 * then C_Sign, as the benchmarks' threads do on every turn. */
static inline CK_RV sign32(CK_FUNCTION_LIST_PTR f, CK_SESSION_HANDLE s, CK_MECHANISM_TYPE mech, CK_OBJECT_HANDLE key)
{
	CK_MECHANISM m = {mech, NULL, 0};
	CK_BYTE data[32], sig[512];
	CK_ULONG n = sizeof sig;
	memset(data, 7, sizeof data);
	CK_RV rv = f->C_SignInit(s, &m, key);
	return rv == CKR_OK ? f->C_Sign(s, data, sizeof data, sig, &n) : rv;
}

/* cpu_us is the CPU time (user + system) the whole process has used, in
 * µs: every thread's, the module's own worker threads included. */
static inline double cpu_us(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 + ru.ru_utime.tv_usec + ru.ru_stime.tv_usec;
}

static inline double now_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* run_for lets the benchmark threads go, stops them after seconds and
 * returns when it let them go. */
static inline double run_for(volatile int *go, volatile int *stop, double seconds)
{
	double t0 = now_seconds();
	*go = 1;
	while (now_seconds() - t0 < seconds)
		usleep(10000);
	*stop = 1;
	return t0;
}

#endif
