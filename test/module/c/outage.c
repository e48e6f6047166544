/*
 * outage — one application session through a full outage of its group, for
 * the recovery-mode test. Driven by lines on standard input; answers one
 * line per command on standard output.
 *
 * usage: outage MODULE SLOT_ID PIN_FILE KEY_LABEL
 *
 * At start: opens a session, logs in, finds the key, signs once, prints
 * "ready". Commands:
 *   sign   C_SignInit + C_Sign on the first session: "sign rv=0xRV"
 *   state  C_GetSessionInfo on the first session: "state rv=0xRV state=N"
 *   fresh  a new session, C_Login, find the key, sign:
 *          "fresh open=0xRV login=0xRV sign=0xRV"
 */
#include "common.h"

static CK_FUNCTION_LIST_PTR f;

/* sign signs 32 bytes with the key labelled label found on session s (or
 * with key when it is not CK_INVALID_HANDLE). */
static CK_RV sign(CK_SESSION_HANDLE s, CK_OBJECT_HANDLE key)
{
	CK_MECHANISM m = {CKM_ECDSA, NULL, 0};
	CK_BYTE data[32], sig[64];
	CK_ULONG n = sizeof sig;
	CK_RV rv;
	memset(data, 7, sizeof data);
	rv = f->C_SignInit(s, &m, key);
	if (rv != CKR_OK)
		return rv;
	return f->C_Sign(s, data, sizeof data, sig, &n);
}

/* find finds the private key labelled label without dying on failure. */
static CK_RV find(CK_SESSION_HANDLE s, const char *label, CK_OBJECT_HANDLE *key)
{
	CK_OBJECT_CLASS cls = CKO_PRIVATE_KEY;
	CK_ATTRIBUTE t[] = {
		{CKA_CLASS, &cls, sizeof cls},
		{CKA_LABEL, (void *)label, strlen(label)},
	};
	CK_ULONG n = 0;
	CK_RV rv = f->C_FindObjectsInit(s, t, 2);
	if (rv != CKR_OK)
		return rv;
	rv = f->C_FindObjects(s, key, 1, &n);
	f->C_FindObjectsFinal(s);
	if (rv == CKR_OK && n != 1)
		rv = CKR_KEY_HANDLE_INVALID;
	return rv;
}

int main(int argc, char **argv)
{
	char pin[256], buf[64];
	CK_ULONG pinlen;
	CK_SLOT_ID slot;
	CK_SESSION_HANDLE s;
	CK_OBJECT_HANDLE key;

	if (argc != 5) {
		fprintf(stderr, "usage: outage MODULE SLOT_ID PIN_FILE KEY_LABEL\n");
		return 2;
	}
	f = load_module(argv[1], NULL);
	slot = strtoul(argv[2], NULL, 0);
	pinlen = read_pin(argv[3], pin, sizeof pin);

	s = init_login(f, slot, pin, pinlen);
	CHECK(find(s, argv[4], &key));
	CHECK(sign(s, key));
	printf("ready\n");
	fflush(stdout);

	while (fgets(buf, sizeof buf, stdin) != NULL) {
		if (strncmp(buf, "sign", 4) == 0) {
			printf("sign rv=0x%lx\n", (unsigned long)sign(s, key));
		} else if (strncmp(buf, "state", 5) == 0) {
			CK_SESSION_INFO info;
			CK_RV rv = f->C_GetSessionInfo(s, &info);
			printf("state rv=0x%lx state=%lu\n", (unsigned long)rv, rv == CKR_OK ? (unsigned long)info.state : 0UL);
		} else if (strncmp(buf, "fresh", 5) == 0) {
			CK_SESSION_HANDLE s2 = CK_INVALID_HANDLE;
			CK_OBJECT_HANDLE k2 = CK_INVALID_HANDLE;
			CK_RV orv, lrv = CKR_GENERAL_ERROR, srv = CKR_GENERAL_ERROR;
			orv = f->C_OpenSession(slot, CKF_SERIAL_SESSION, NULL, NULL, &s2);
			if (orv == CKR_OK) {
				lrv = f->C_Login(s2, CKU_USER, (CK_UTF8CHAR_PTR)pin, pinlen);
				srv = find(s2, argv[4], &k2);
				if (srv == CKR_OK)
					srv = sign(s2, k2);
			}
			printf("fresh open=0x%lx login=0x%lx sign=0x%lx\n", (unsigned long)orv, (unsigned long)lrv, (unsigned long)srv);
		} else {
			printf("unknown command\n");
		}
		fflush(stdout);
	}
	CHECK(f->C_Finalize(NULL));
	return 0;
}
