/*
 * abicheck — checks libhapkcs11.so against the PKCS#11 v2.40 rules an
 * application relies on: C_Initialize arguments and locking, the
 * length-query and short-buffer conventions (C_GetSlotList, C_Sign,
 * C_GetAttributeValue with sensitive, missing and short attributes),
 * operation state, searches, fork, and C_Finalize.
 *
 * usage: abicheck MODULE SLOT_ID PIN_FILE EC_LABEL RSA_LABEL
 * The slot holds an EC P-256 key pair labelled EC_LABEL and an RSA key pair
 * labelled RSA_LABEL (multi-part signing: SoftHSM has no hashing ECDSA).
 * Prints "ok NAME" or "FAIL NAME: detail" per check; exits 1 on a failure.
 */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

static int failures, passes;

static void expect(const char *name, int cond, const char *fmt, unsigned long a, unsigned long b)
{
	if (cond) {
		passes++;
		printf("ok %s\n", name);
		return;
	}
	failures++;
	printf("FAIL %s: ", name);
	printf(fmt, a, b);
	printf("\n");
}

/* Each argument is evaluated once: got is often the call under test. */
#define EXPECT_RV(name, got, want)                                                   \
	do {                                                                         \
		unsigned long g_ = (unsigned long)(got), w_ = (unsigned long)(want); \
		expect(name, g_ == w_, "rv=0x%lx, want 0x%lx", g_, w_);              \
	} while (0)
#define EXPECT_EQ(name, got, want)                                                   \
	do {                                                                         \
		unsigned long g_ = (unsigned long)(got), w_ = (unsigned long)(want); \
		expect(name, g_ == w_, "got %lu, want %lu", g_, w_);                 \
	} while (0)

/* Application mutex callbacks that count their calls. */
static unsigned long n_create, n_destroy, n_lock, n_unlock;
static CK_RV app_create(CK_VOID_PTR_PTR m)
{
	n_create++;
	*m = malloc(1);
	return CKR_OK;
}
static CK_RV app_destroy(CK_VOID_PTR m)
{
	n_destroy++;
	free(m);
	return CKR_OK;
}
static CK_RV app_lock(CK_VOID_PTR m)
{
	(void)m;
	__sync_fetch_and_add(&n_lock, 1);
	return CKR_OK;
}
static CK_RV app_unlock(CK_VOID_PTR m)
{
	(void)m;
	__sync_fetch_and_add(&n_unlock, 1);
	return CKR_OK;
}

int main(int argc, char **argv)
{
	CK_FUNCTION_LIST_PTR f;
	CK_SLOT_ID slot;
	char pin[256];
	CK_ULONG pinlen;
	CK_RV rv;

	if (argc != 6) {
		fprintf(stderr, "usage: abicheck MODULE SLOT_ID PIN_FILE EC_LABEL RSA_LABEL\n");
		return 2;
	}
	f = load_module(argv[1], NULL);
	slot = strtoul(argv[2], NULL, 0);
	pinlen = read_pin(argv[3], pin, sizeof pin);
	const char *label = argv[4];
	const char *rsa_label = argv[5];

	/* The function list. */
	{
		CK_RV (*get)(CK_FUNCTION_LIST_PTR_PTR) = f->C_GetFunctionList;
		EXPECT_RV("GetFunctionList NULL", get(NULL), CKR_ARGUMENTS_BAD);
		EXPECT_EQ("function list version major", f->version.major, 2);
		EXPECT_EQ("function list version minor", f->version.minor, 40);
		CK_INFO info;
		EXPECT_RV("GetInfo before Initialize", f->C_GetInfo(&info), CKR_CRYPTOKI_NOT_INITIALIZED);
	}

	/* C_Initialize arguments. */
	{
		CK_C_INITIALIZE_ARGS a;
		memset(&a, 0, sizeof a);
		a.pReserved = &a;
		EXPECT_RV("Initialize pReserved", f->C_Initialize(&a), CKR_ARGUMENTS_BAD);
		memset(&a, 0, sizeof a);
		a.CreateMutex = app_create;
		a.LockMutex = app_lock;
		EXPECT_RV("Initialize half the callbacks", f->C_Initialize(&a), CKR_ARGUMENTS_BAD);

		/* Callbacks without CKF_OS_LOCKING_OK: the library uses them. */
		memset(&a, 0, sizeof a);
		a.CreateMutex = app_create;
		a.DestroyMutex = app_destroy;
		a.LockMutex = app_lock;
		a.UnlockMutex = app_unlock;
		EXPECT_RV("Initialize app mutexes", f->C_Initialize(&a), CKR_OK);
		CK_INFO info;
		EXPECT_RV("GetInfo", f->C_GetInfo(&info), CKR_OK);
		EXPECT_EQ("GetInfo cryptoki 2.40", info.cryptokiVersion.major * 100 + info.cryptokiVersion.minor, 240);
		EXPECT_EQ("app mutex created", n_create, 1);
		expect("app mutex locked per call", n_lock >= 1 && n_lock == n_unlock, "lock=%lu unlock=%lu", n_lock, n_unlock);
		EXPECT_RV("Initialize twice", f->C_Initialize(NULL), CKR_CRYPTOKI_ALREADY_INITIALIZED);
		EXPECT_RV("Finalize pReserved", f->C_Finalize(&a), CKR_ARGUMENTS_BAD);
		EXPECT_RV("Finalize", f->C_Finalize(NULL), CKR_OK);
		EXPECT_EQ("app mutex destroyed", n_destroy, 1);
		EXPECT_RV("GetInfo after Finalize", f->C_GetInfo(&info), CKR_CRYPTOKI_NOT_INITIALIZED);
		EXPECT_RV("Finalize twice", f->C_Finalize(NULL), CKR_CRYPTOKI_NOT_INITIALIZED);

		/* OS locking allowed, and the flag p11tool passes: own locking. */
		unsigned long before = n_lock;
		a.flags = CKF_OS_LOCKING_OK | CKF_LIBRARY_CANT_CREATE_OS_THREADS;
		EXPECT_RV("Initialize OS locking + CANT_CREATE_OS_THREADS", f->C_Initialize(&a), CKR_OK);
		EXPECT_RV("GetInfo (OS locking)", f->C_GetInfo(&info), CKR_OK);
		EXPECT_EQ("app mutex unused with OS locking", n_lock - before, 0);
	}

	/* C_GetSlotList conventions. */
	{
		CK_ULONG n = 0, m;
		CK_SLOT_ID ids[64];
		EXPECT_RV("GetSlotList NULL pulCount", f->C_GetSlotList(CK_FALSE, NULL, NULL), CKR_ARGUMENTS_BAD);
		EXPECT_RV("GetSlotList length", f->C_GetSlotList(CK_FALSE, NULL, &n), CKR_OK);
		expect("slot count", n >= 1 && n <= 64, "n=%lu%lu", n, 0);
		if (n > 1) {
			m = n - 1;
			EXPECT_RV("GetSlotList short", f->C_GetSlotList(CK_FALSE, ids, &m), CKR_BUFFER_TOO_SMALL);
			EXPECT_EQ("GetSlotList short sets count", m, n);
		}
		m = 64;
		EXPECT_RV("GetSlotList", f->C_GetSlotList(CK_FALSE, ids, &m), CKR_OK);
		int seen = 0;
		for (CK_ULONG i = 0; i < m; i++)
			seen |= ids[i] == slot;
		EXPECT_EQ("slot listed", seen, 1);
		EXPECT_RV("GetSlotInfo bad slot", f->C_GetSlotInfo(0x7ffffffe, (CK_SLOT_INFO_PTR)ids), CKR_SLOT_ID_INVALID);
	}

	CK_SESSION_HANDLE s;
	EXPECT_RV("OpenSession without SERIAL", f->C_OpenSession(slot, 0, NULL, NULL, &s), CKR_SESSION_PARALLEL_NOT_SUPPORTED);
	CHECK(f->C_OpenSession(slot, CKF_SERIAL_SESSION, NULL, NULL, &s));
	EXPECT_RV("Login wrong user type", f->C_Login(s, 77, (CK_UTF8CHAR_PTR)pin, pinlen), CKR_USER_TYPE_INVALID);
	EXPECT_RV("Login", f->C_Login(s, CKU_USER, (CK_UTF8CHAR_PTR)pin, pinlen), CKR_OK);
	EXPECT_RV("Login twice", f->C_Login(s, CKU_USER, (CK_UTF8CHAR_PTR)pin, pinlen), CKR_USER_ALREADY_LOGGED_IN);
	{
		CK_SESSION_INFO si;
		CHECK(f->C_GetSessionInfo(s, &si));
		EXPECT_EQ("session state RO user", si.state, CKS_RO_USER_FUNCTIONS);
		EXPECT_EQ("session slot", si.slotID, slot);
		EXPECT_RV("GetSessionInfo bad handle", f->C_GetSessionInfo(987654, &si), CKR_SESSION_HANDLE_INVALID);
	}

	CK_OBJECT_HANDLE priv = find_one(f, s, CKO_PRIVATE_KEY, label);
	CK_OBJECT_HANDLE pub = find_one(f, s, CKO_PUBLIC_KEY, label);

	/* C_GetAttributeValue with a sensitive, a missing, a short and a good
	 * attribute at once. */
	{
		char lbl[128], shortbuf[1], value[256], modulus[256];
		CK_ATTRIBUTE t[] = {
			{CKA_LABEL, lbl, sizeof lbl},
			{CKA_VALUE, value, sizeof value},
			{CKA_MODULUS, modulus, sizeof modulus},
			{CKA_EC_PARAMS, shortbuf, sizeof shortbuf},
		};
		rv = f->C_GetAttributeValue(s, priv, t, 4);
		expect("GetAttributeValue mix rv", rv == CKR_ATTRIBUTE_SENSITIVE || rv == CKR_ATTRIBUTE_TYPE_INVALID || rv == CKR_BUFFER_TOO_SMALL,
		       "rv=0x%lx%lu", rv, 0);
		EXPECT_EQ("mix: good attribute length", t[0].ulValueLen, strlen(label));
		expect("mix: good attribute value", t[0].ulValueLen == strlen(label) && memcmp(lbl, label, strlen(label)) == 0, "%lu%lu", 0, 0);
		EXPECT_EQ("mix: sensitive unavailable", t[1].ulValueLen, CK_UNAVAILABLE_INFORMATION);
		EXPECT_EQ("mix: missing unavailable", t[2].ulValueLen, CK_UNAVAILABLE_INFORMATION);
		EXPECT_EQ("mix: short unavailable", t[3].ulValueLen, CK_UNAVAILABLE_INFORMATION);

		CK_ATTRIBUTE q[] = {{CKA_EC_PARAMS, NULL, 0}};
		EXPECT_RV("GetAttributeValue length query", f->C_GetAttributeValue(s, priv, q, 1), CKR_OK);
		EXPECT_EQ("EC params length (P-256 OID)", q[0].ulValueLen, 10);
		q[0].pValue = value;
		q[0].ulValueLen = 9;
		EXPECT_RV("GetAttributeValue short", f->C_GetAttributeValue(s, priv, q, 1), CKR_BUFFER_TOO_SMALL);
		EXPECT_EQ("short gives unavailable", q[0].ulValueLen, CK_UNAVAILABLE_INFORMATION);
		q[0].ulValueLen = 10;
		EXPECT_RV("GetAttributeValue exact", f->C_GetAttributeValue(s, priv, q, 1), CKR_OK);
		EXPECT_RV("GetAttributeValue bad handle", f->C_GetAttributeValue(s, 0x7fff0000, q, 1), CKR_OBJECT_HANDLE_INVALID);
	}

	/* C_Sign: length query, short buffer, real buffer, operation ended. */
	{
		CK_MECHANISM m = {CKM_ECDSA, NULL, 0};
		CK_BYTE data[32], sig[128];
		CK_ULONG n = 0;
		memset(data, 0x5a, sizeof data);
		EXPECT_RV("Sign without SignInit", f->C_Sign(s, data, sizeof data, sig, &n), CKR_OPERATION_NOT_INITIALIZED);
		EXPECT_RV("SignInit bad key", f->C_SignInit(s, &m, 0x7fff0000), CKR_OBJECT_HANDLE_INVALID); /* SoftHSM's code */
		CK_MECHANISM bad = {CKM_VENDOR_DEFINED | 0x1234, NULL, 0};
		EXPECT_RV("SignInit bad mechanism", f->C_SignInit(s, &bad, priv), CKR_MECHANISM_INVALID);
		EXPECT_RV("SignInit with a public key", f->C_SignInit(s, &m, pub), CKR_KEY_FUNCTION_NOT_PERMITTED);
		EXPECT_RV("SignInit", f->C_SignInit(s, &m, priv), CKR_OK);
		EXPECT_RV("SignInit twice", f->C_SignInit(s, &m, priv), CKR_OPERATION_ACTIVE);
		EXPECT_RV("Sign length query", f->C_Sign(s, data, sizeof data, NULL, &n), CKR_OK);
		EXPECT_EQ("Sign length", n, 64);
		n = 10;
		EXPECT_RV("Sign short buffer", f->C_Sign(s, data, sizeof data, sig, &n), CKR_BUFFER_TOO_SMALL);
		EXPECT_EQ("Sign short buffer length", n, 64);
		n = sizeof sig;
		EXPECT_RV("Sign", f->C_Sign(s, data, sizeof data, sig, &n), CKR_OK);
		EXPECT_EQ("signature length", n, 64);
		CK_ULONG n2 = sizeof sig;
		EXPECT_RV("Sign after the operation ended", f->C_Sign(s, data, sizeof data, sig, &n2), CKR_OPERATION_NOT_INITIALIZED);
		EXPECT_RV("VerifyInit", f->C_VerifyInit(s, &m, pub), CKR_OK);
		EXPECT_RV("Verify", f->C_Verify(s, data, sizeof data, sig, n), CKR_OK);
		sig[3] ^= 1;
		EXPECT_RV("VerifyInit", f->C_VerifyInit(s, &m, pub), CKR_OK);
		EXPECT_RV("Verify tampered", f->C_Verify(s, data, sizeof data, sig, n), CKR_SIGNATURE_INVALID);
		EXPECT_RV("SignInit NULL mechanism ends nothing", f->C_SignInit(s, NULL, priv), CKR_OPERATION_NOT_INITIALIZED);
		EXPECT_RV("SignInit to cancel", f->C_SignInit(s, &m, priv), CKR_OK);
		EXPECT_RV("SignInit NULL mechanism cancels", f->C_SignInit(s, NULL, priv), CKR_OK);
		EXPECT_RV("SignInit after cancel", f->C_SignInit(s, &m, priv), CKR_OK);
		n = sizeof sig;
		EXPECT_RV("Sign after cancel", f->C_Sign(s, data, sizeof data, sig, &n), CKR_OK);
	}

	/* Multi-part sign and verify. */
	{
		CK_OBJECT_HANDLE rpriv = find_one(f, s, CKO_PRIVATE_KEY, rsa_label);
		CK_OBJECT_HANDLE rpub = find_one(f, s, CKO_PUBLIC_KEY, rsa_label);
		CK_MECHANISM m = {CKM_SHA256_RSA_PKCS, NULL, 0};
		CK_BYTE part[100], sig[512];
		CK_ULONG n = 0;
		memset(part, 0x33, sizeof part);
		EXPECT_RV("SignInit SHA256_RSA_PKCS", f->C_SignInit(s, &m, rpriv), CKR_OK);
		EXPECT_RV("SignUpdate 1", f->C_SignUpdate(s, part, 50), CKR_OK);
		EXPECT_RV("SignUpdate 2", f->C_SignUpdate(s, part + 50, 50), CKR_OK);
		/* The member token's answer (SoftHSM ends the operation), not a rule of ours. */
		EXPECT_RV("Sign single-part during multi-part", f->C_Sign(s, part, 1, sig, &n), CKR_OPERATION_NOT_INITIALIZED);
		EXPECT_RV("SignInit SHA256_RSA_PKCS again", f->C_SignInit(s, &m, rpriv), CKR_OK);
		EXPECT_RV("SignUpdate 1 again", f->C_SignUpdate(s, part, 50), CKR_OK);
		EXPECT_RV("SignUpdate 2 again", f->C_SignUpdate(s, part + 50, 50), CKR_OK);
		n = 0;
		EXPECT_RV("SignFinal length", f->C_SignFinal(s, NULL, &n), CKR_OK);
		EXPECT_EQ("SignFinal length value", n, 256);
		n = 8;
		EXPECT_RV("SignFinal short", f->C_SignFinal(s, sig, &n), CKR_BUFFER_TOO_SMALL);
		EXPECT_EQ("SignFinal short length", n, 256);
		n = sizeof sig;
		EXPECT_RV("SignFinal", f->C_SignFinal(s, sig, &n), CKR_OK);
		EXPECT_RV("VerifyInit SHA256_RSA_PKCS", f->C_VerifyInit(s, &m, rpub), CKR_OK);
		EXPECT_RV("VerifyUpdate", f->C_VerifyUpdate(s, part, sizeof part), CKR_OK);
		EXPECT_RV("VerifyFinal", f->C_VerifyFinal(s, sig, n), CKR_OK);
		EXPECT_RV("VerifyInit single", f->C_VerifyInit(s, &m, rpub), CKR_OK);
		EXPECT_RV("Verify single of multi-part signature", f->C_Verify(s, part, sizeof part, sig, n), CKR_OK);
	}

	/* Multi-part digest equals single-part. */
	{
		CK_MECHANISM m = {CKM_SHA256, NULL, 0};
		CK_BYTE a[32], b[32];
		CK_ULONG na = sizeof a, nb = sizeof b;
		EXPECT_RV("DigestInit multi", f->C_DigestInit(s, &m), CKR_OK);
		EXPECT_RV("DigestUpdate", f->C_DigestUpdate(s, (CK_BYTE_PTR) "ab", 2), CKR_OK);
		EXPECT_RV("DigestUpdate", f->C_DigestUpdate(s, (CK_BYTE_PTR) "c", 1), CKR_OK);
		EXPECT_RV("DigestFinal", f->C_DigestFinal(s, a, &na), CKR_OK);
		EXPECT_RV("DigestInit single", f->C_DigestInit(s, &m), CKR_OK);
		EXPECT_RV("Digest single", f->C_Digest(s, (CK_BYTE_PTR) "abc", 3, b, &nb), CKR_OK);
		expect("multi-part digest equals single-part", na == 32 && nb == 32 && memcmp(a, b, 32) == 0, "%lu %lu", na, nb);
	}

	/* Digest and random. */
	{
		CK_MECHANISM m = {CKM_SHA256, NULL, 0};
		CK_BYTE out[64];
		CK_ULONG n = 0;
		EXPECT_RV("DigestInit", f->C_DigestInit(s, &m), CKR_OK);
		EXPECT_RV("Digest length", f->C_Digest(s, (CK_BYTE_PTR) "abc", 3, NULL, &n), CKR_OK);
		EXPECT_EQ("Digest length value", n, 32);
		n = sizeof out;
		EXPECT_RV("Digest", f->C_Digest(s, (CK_BYTE_PTR) "abc", 3, out, &n), CKR_OK);
		EXPECT_EQ("SHA-256(abc) first byte", out[0], 0xba);
		EXPECT_RV("GenerateRandom", f->C_GenerateRandom(s, out, 32), CKR_OK);
	}

	/* A search in pages, one per session. */
	{
		CK_OBJECT_HANDLE h;
		CK_ULONG n = 0, total = 0;
		EXPECT_RV("FindObjects without Init", f->C_FindObjects(s, &h, 1, &n), CKR_OPERATION_NOT_INITIALIZED);
		EXPECT_RV("FindObjectsInit all", f->C_FindObjectsInit(s, NULL, 0), CKR_OK);
		EXPECT_RV("FindObjectsInit twice", f->C_FindObjectsInit(s, NULL, 0), CKR_OPERATION_ACTIVE);
		do {
			CHECK(f->C_FindObjects(s, &h, 1, &n));
			total += n;
		} while (n == 1 && total < 1000);
		expect("found both halves one by one", total >= 2, "total=%lu%lu", total, 0);
		EXPECT_RV("FindObjectsFinal", f->C_FindObjectsFinal(s), CKR_OK);
		EXPECT_RV("FindObjectsFinal twice", f->C_FindObjectsFinal(s), CKR_OPERATION_NOT_INITIALIZED);
	}

	/* Legacy and unsupported functions answer as a module would. */
	{
		CK_SLOT_ID ev;
		EXPECT_RV("GetFunctionStatus", f->C_GetFunctionStatus(s), CKR_FUNCTION_NOT_PARALLEL);
		EXPECT_RV("CancelFunction", f->C_CancelFunction(s), CKR_FUNCTION_NOT_PARALLEL);
		EXPECT_RV("WaitForSlotEvent DONT_BLOCK", f->C_WaitForSlotEvent(CKF_DONT_BLOCK, &ev, NULL), CKR_NO_EVENT);
		EXPECT_RV("InitToken", f->C_InitToken(slot, (CK_UTF8CHAR_PTR)pin, pinlen, (CK_UTF8CHAR_PTR) "x"), CKR_FUNCTION_NOT_SUPPORTED);
		EXPECT_RV("InitPIN", f->C_InitPIN(s, (CK_UTF8CHAR_PTR)pin, pinlen), CKR_FUNCTION_NOT_SUPPORTED);
		EXPECT_RV("SetPIN", f->C_SetPIN(s, (CK_UTF8CHAR_PTR)pin, pinlen, (CK_UTF8CHAR_PTR)pin, pinlen), CKR_FUNCTION_NOT_SUPPORTED);
		EXPECT_RV("GetOperationState", f->C_GetOperationState(s, NULL, &ev), CKR_FUNCTION_NOT_SUPPORTED);
		EXPECT_RV("SignRecoverInit", f->C_SignRecoverInit(s, NULL, 0), CKR_FUNCTION_NOT_SUPPORTED);
		EXPECT_RV("DigestEncryptUpdate", f->C_DigestEncryptUpdate(s, NULL, 0, NULL, &ev), CKR_FUNCTION_NOT_SUPPORTED);
		/* A refusal still checks the session first. */
		EXPECT_RV("GetFunctionStatus, bad session", f->C_GetFunctionStatus(s + 1000), CKR_SESSION_HANDLE_INVALID);
		EXPECT_RV("SignRecover, bad session", f->C_SignRecover(s + 1000, NULL, 0, NULL, &ev), CKR_SESSION_HANDLE_INVALID);
	}

	/* Fork: the child fails fast instead of hanging in the Go runtime,
	 * until its own C_Initialize, which gives it a working module. */
	{
		fflush(stdout);
		pid_t child = fork();
		if (child == 0) {
			CK_INFO info;
			alarm(30); /* a hang kills the child: the check then fails */
			if (f->C_GetInfo(&info) != CKR_CRYPTOKI_NOT_INITIALIZED)
				_exit(3);
			if (f->C_Initialize(NULL) != CKR_OK)
				_exit(4);
			if (f->C_GetInfo(&info) != CKR_OK || memcmp(info.manufacturerID, "hagroup", 7) != 0)
				_exit(5);
			if (f->C_Finalize(NULL) != CKR_OK)
				_exit(6);
			_exit(0);
		}
		int st = 0;
		waitpid(child, &st, 0);
		expect("forked child: NOT_INITIALIZED until its own C_Initialize, then works", WIFEXITED(st) && WEXITSTATUS(st) == 0,
		       "child status 0x%lx%lu", (unsigned long)st, 0);
	}

	/* Closing the last session logs out; Finalize; initialize again. */
	{
		CK_SESSION_INFO si;
		EXPECT_RV("Logout", f->C_Logout(s), CKR_OK);
		EXPECT_RV("Logout twice", f->C_Logout(s), CKR_USER_NOT_LOGGED_IN);
		EXPECT_RV("CloseSession", f->C_CloseSession(s), CKR_OK);
		EXPECT_RV("CloseSession twice", f->C_CloseSession(s), CKR_SESSION_HANDLE_INVALID);
		EXPECT_RV("Finalize", f->C_Finalize(NULL), CKR_OK);
		EXPECT_RV("Initialize again", f->C_Initialize(NULL), CKR_OK);
		CHECK(f->C_OpenSession(slot, CKF_SERIAL_SESSION | CKF_RW_SESSION, NULL, NULL, &s));
		CHECK(f->C_GetSessionInfo(s, &si));
		EXPECT_EQ("fresh session is RW public", si.state, CKS_RW_PUBLIC_SESSION);
		EXPECT_RV("Finalize with a session open", f->C_Finalize(NULL), CKR_OK);
	}

	printf("checks: %d ok, %d failed\n", passes, failures);
	return failures ? 1 : 0;
}
