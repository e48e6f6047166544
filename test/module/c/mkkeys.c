/*
 * mkkeys — what one key creation costs on a token already holding many
 * objects (issue 32: many objects cost what the members cost).
 *
 * usage: mkkeys MODULE SLOT_ID PIN_FILE N PREFIX
 *
 * Logs in on SLOT_ID, then generates N AES-256 token keys (CKM_AES_KEY_GEN,
 * labelled PREFIX-0…), each timed alone, and prints
 *   create median_us=… q1_us=… q3_us=… first_us=… n=N
 * first_us is the first creation (the process's look-ups warm up there).
 * Every call is checked; the program exits 2 on the first failure.
 */
#include "common.h"

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	CK_FUNCTION_LIST_PTR f;
	CK_C_INITIALIZE_ARGS a;
	CK_SESSION_HANDLE s;
	char pin[256];
	CK_ULONG pinlen;
	int n, i;
	double *us, first;

	if (argc != 6) {
		fprintf(stderr, "usage: mkkeys MODULE SLOT_ID PIN_FILE N PREFIX\n");
		return 2;
	}
	f = load_module(argv[1], NULL);
	pinlen = read_pin(argv[3], pin, sizeof pin);
	n = atoi(argv[4]);
	if (n < 1) {
		fprintf(stderr, "FATAL N must be at least 1\n");
		return 2;
	}
	us = calloc((size_t)n, sizeof *us);
	memset(&a, 0, sizeof a);
	a.flags = CKF_OS_LOCKING_OK;
	CHECK(f->C_Initialize(&a));
	CHECK(f->C_OpenSession(strtoul(argv[2], NULL, 0), CKF_SERIAL_SESSION | CKF_RW_SESSION, NULL, NULL, &s));
	CHECK(f->C_Login(s, CKU_USER, (CK_UTF8CHAR_PTR)pin, pinlen));
	for (i = 0; i < n; i++) {
		char label[128];
		CK_BBOOL yes = CK_TRUE;
		CK_ULONG len = 32;
		CK_MECHANISM m = {CKM_AES_KEY_GEN, NULL, 0};
		CK_OBJECT_HANDLE h;
		double t0;
		snprintf(label, sizeof label, "%s-%d", argv[5], i);
		CK_ATTRIBUTE t[] = {
			{CKA_TOKEN, &yes, sizeof yes},
			{CKA_PRIVATE, &yes, sizeof yes},
			{CKA_SENSITIVE, &yes, sizeof yes},
			{CKA_ENCRYPT, &yes, sizeof yes},
			{CKA_DECRYPT, &yes, sizeof yes},
			{CKA_VALUE_LEN, &len, sizeof len},
			{CKA_LABEL, label, strlen(label)},
			{CKA_ID, label, strlen(label)},
		};
		t0 = now_seconds();
		CHECK(f->C_GenerateKey(s, &m, t, sizeof t / sizeof t[0], &h));
		us[i] = (now_seconds() - t0) * 1e6;
	}
	first = us[0];
	qsort(us, (size_t)n, sizeof *us, cmp_double);
	printf("create median_us=%.0f q1_us=%.0f q3_us=%.0f first_us=%.0f n=%d\n", us[n / 2], us[n / 4], us[(3 * n) / 4], first, n);
	CHECK(f->C_Logout(s));
	CHECK(f->C_Finalize(NULL));
	return 0;
}
