/*
 * inhelper.c — an unforked application with library.process = "helper":
 * its C_Initialize starts a helper, its calls go there, C_Finalize ends it.
 *
 *   inhelper MODULE SLOT PINFILE LABEL
 *
 * Prints "helpers=N" after C_Initialize and after C_Finalize, and "ok"
 * when a signature verified.
 */
#include "common.h"

static int children(void)
{
	pid_t pids[64];
	return (int)child_pids(0, pids, 64);
}

int main(int argc, char **argv)
{
	char pin[256];
	if (argc != 5) {
		fprintf(stderr, "usage: inhelper MODULE SLOT PINFILE LABEL\n");
		return 2;
	}
	CK_FUNCTION_LIST_PTR f = load_module(argv[1], NULL);
	CK_ULONG pinlen = read_pin(argv[3], pin, sizeof pin);
	CK_SESSION_HANDLE s = init_login(f, strtoul(argv[2], NULL, 0), pin, pinlen);
	printf("helpers=%d\n", children());
	CK_OBJECT_HANDLE priv = find_one(f, s, CKO_PRIVATE_KEY, argv[4]);
	CK_OBJECT_HANDLE pub = find_one(f, s, CKO_PUBLIC_KEY, argv[4]);
	CK_MECHANISM m = {CKM_ECDSA, NULL, 0};
	CK_BYTE data[32] = {9}, sig[256];
	CK_ULONG n = sizeof sig;
	CHECK(f->C_SignInit(s, &m, priv));
	CHECK(f->C_Sign(s, data, sizeof data, sig, &n));
	CHECK(f->C_VerifyInit(s, &m, pub));
	CHECK(f->C_Verify(s, data, sizeof data, sig, n));
	printf("ok\n");
	CHECK(f->C_Finalize(NULL));
	printf("helpers=%d\n", children());
	return 0;
}
