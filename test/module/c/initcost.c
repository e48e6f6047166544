/*
 * initcost — what a group costs in an application's life cycle, for
 * tools that initialise the module per task (issue 16, item 9).
 *
 * usage: initcost MODULE SLOT_ID PIN_FILE N
 *
 * The module is loaded once; then, N times each (after one untimed
 * warm-up), with the median and quartiles in microseconds:
 *   init_finalize   C_Initialize, C_GetSlotList, C_Finalize
 *   init_login      C_Initialize, C_OpenSession and C_Login on SLOT_ID,
 *                   C_Finalize
 *   create_copy_destroy  in one logged-in session: C_CreateObject of a
 *                   token data object, C_CopyObject, C_DestroyObject of
 *                   both (each replicated to every member by a group)
 * Every call is checked; the program exits 2 on the first failure, and 3
 * when an object it destroyed can still be found.
 */
#include "common.h"

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void report(const char *name, double *us, int n)
{
	qsort(us, (size_t)n, sizeof *us, cmp_double);
	printf("%s median_us=%.0f q1_us=%.0f q3_us=%.0f n=%d\n", name, us[n / 2], us[n / 4], us[(3 * n) / 4], n);
}

static void init_os_locking(CK_FUNCTION_LIST_PTR f)
{
	CK_C_INITIALIZE_ARGS a;
	memset(&a, 0, sizeof a);
	a.flags = CKF_OS_LOCKING_OK;
	CHECK(f->C_Initialize(&a));
}

static void init_finalize(CK_FUNCTION_LIST_PTR f)
{
	CK_SLOT_ID slots[64];
	CK_ULONG n = 64;
	init_os_locking(f);
	CHECK(f->C_GetSlotList(CK_TRUE, slots, &n));
	if (n == 0) {
		fprintf(stderr, "FATAL no slot with a token\n");
		exit(2);
	}
	CHECK(f->C_Finalize(NULL));
}

/* rw_login initialises f and returns a read-write session on slot logged
 * in as the user. */
static CK_SESSION_HANDLE rw_login(CK_FUNCTION_LIST_PTR f, CK_SLOT_ID slot, char *pin, CK_ULONG pinlen)
{
	CK_SESSION_HANDLE s;
	init_os_locking(f);
	CHECK(f->C_OpenSession(slot, CKF_SERIAL_SESSION | CKF_RW_SESSION, NULL, NULL, &s));
	CHECK(f->C_Login(s, CKU_USER, (CK_UTF8CHAR_PTR)pin, pinlen));
	return s;
}

static void login_finalize(CK_FUNCTION_LIST_PTR f, CK_SLOT_ID slot, char *pin, CK_ULONG pinlen)
{
	rw_login(f, slot, pin, pinlen);
	CHECK(f->C_Finalize(NULL));
}

static CK_ULONG count_labelled(CK_FUNCTION_LIST_PTR f, CK_SESSION_HANDLE s, const char *label)
{
	CK_ATTRIBUTE t[] = {{CKA_LABEL, (void *)label, strlen(label)}};
	CK_OBJECT_HANDLE h[4];
	CK_ULONG n = 0;
	CHECK(f->C_FindObjectsInit(s, t, 1));
	CHECK(f->C_FindObjects(s, h, 4, &n));
	CHECK(f->C_FindObjectsFinal(s));
	return n;
}

static void create_copy_destroy(CK_FUNCTION_LIST_PTR f, CK_SESSION_HANDLE s, int i)
{
	CK_OBJECT_CLASS cls = CKO_DATA;
	CK_BBOOL yes = CK_TRUE;
	char label[48], copylabel[64];
	CK_BYTE value[32];
	CK_OBJECT_HANDLE obj, cp;
	snprintf(label, sizeof label, "initcost-%d-%d", (int)getpid(), i);
	snprintf(copylabel, sizeof copylabel, "%s-copy", label);
	memset(value, i & 0xff, sizeof value);
	CK_ATTRIBUTE t[] = {
		{CKA_CLASS, &cls, sizeof cls},
		{CKA_TOKEN, &yes, sizeof yes},
		{CKA_PRIVATE, &yes, sizeof yes},
		{CKA_LABEL, label, strlen(label)},
		{CKA_VALUE, value, sizeof value},
	};
	CK_ATTRIBUTE ct[] = {{CKA_LABEL, copylabel, strlen(copylabel)}};
	CHECK(f->C_CreateObject(s, t, 5, &obj));
	CHECK(f->C_CopyObject(s, obj, ct, 1, &cp));
	CHECK(f->C_DestroyObject(s, cp));
	CHECK(f->C_DestroyObject(s, obj));
	if (count_labelled(f, s, label) != 0 || count_labelled(f, s, copylabel) != 0) {
		fprintf(stderr, "FATAL %s or its copy is still there after C_DestroyObject\n", label);
		exit(3);
	}
}

int main(int argc, char **argv)
{
	CK_FUNCTION_LIST_PTR f;
	CK_SLOT_ID slot;
	CK_SESSION_HANDLE s;
	char pin[128];
	CK_ULONG pinlen;
	double *us, t0;
	int n, i;

	if (argc != 5) {
		fprintf(stderr, "usage: initcost MODULE SLOT_ID PIN_FILE N\n");
		return 2;
	}
	slot = strtoul(argv[2], NULL, 0);
	pinlen = read_pin(argv[3], pin, sizeof pin);
	n = atoi(argv[4]);
	if (n < 1) {
		fprintf(stderr, "FATAL N must be at least 1\n");
		return 2;
	}
	us = calloc((size_t)n, sizeof *us);
	f = load_module(argv[1], NULL);

	init_finalize(f);
	for (i = 0; i < n; i++) {
		t0 = now_seconds();
		init_finalize(f);
		us[i] = (now_seconds() - t0) * 1e6;
	}
	report("init_finalize", us, n);

	login_finalize(f, slot, pin, pinlen);
	for (i = 0; i < n; i++) {
		t0 = now_seconds();
		login_finalize(f, slot, pin, pinlen);
		us[i] = (now_seconds() - t0) * 1e6;
	}
	report("init_login", us, n);

	s = rw_login(f, slot, pin, pinlen);
	create_copy_destroy(f, s, -1);
	for (i = 0; i < n; i++) {
		t0 = now_seconds();
		create_copy_destroy(f, s, i);
		us[i] = (now_seconds() - t0) * 1e6;
	}
	report("create_copy_destroy", us, n);
	CHECK(f->C_Finalize(NULL));
	free(us);
	return 0;
}
