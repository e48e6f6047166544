/*
 * coexist — an application that uses SoftHSM directly and through
 * libhapkcs11.so at once: finalizing libhapkcs11.so must not finalize the
 * SoftHSM the application initialized itself.
 *
 * usage: coexist HAPKCS11 SOFTHSM VIRTUAL_SLOT
 * Prints "ok" and exits 0, or says what broke and exits 1.
 */
#include "common.h"

int main(int argc, char **argv)
{
	CK_FUNCTION_LIST_PTR soft, ha;
	CK_C_INITIALIZE_ARGS a;
	CK_ULONG n = 0;
	CK_TOKEN_INFO ti;
	CK_RV rv;

	if (argc != 4) {
		fprintf(stderr, "usage: coexist HAPKCS11 SOFTHSM VIRTUAL_SLOT\n");
		return 2;
	}
	memset(&a, 0, sizeof a);
	a.flags = CKF_OS_LOCKING_OK;
	soft = load_module(argv[2], NULL);
	CHECK(soft->C_Initialize(&a));
	ha = load_module(argv[1], NULL);
	CHECK(ha->C_Initialize(&a));
	CHECK(ha->C_GetTokenInfo(strtoul(argv[3], NULL, 0), &ti));
	CHECK(ha->C_Finalize(NULL));
	rv = soft->C_GetSlotList(CK_TRUE, NULL, &n);
	if (rv != CKR_OK || n == 0) {
		printf("SoftHSM unusable after libhapkcs11.so was finalized: rv=0x%lx, %lu slots\n", (unsigned long)rv, (unsigned long)n);
		return 1;
	}
	CHECK(soft->C_Finalize(NULL));
	printf("ok\n");
	return 0;
}
