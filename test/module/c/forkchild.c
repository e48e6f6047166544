/*
 * forkchild.c — forks at each point where a forking server does, and has
 * every child be a new PKCS#11 application as the Usage Guide says: it
 * calls its own C_Initialize, logs in, signs and verifies.
 *
 *   forkchild MODULE SLOT PINFILE LABEL
 *
 * Forks after C_Initialize, after C_Login (twice: one child then signs on
 * 4 threads at once), in the middle of a multi-part
 * digest (which the parent then finishes), and three times while another
 * thread signs. Each child first uses what it inherited without
 * C_Initialize (a session, a key), which must fail with
 * CKR_CRYPTOKI_NOT_INITIALIZED, and checks that its helper's command line
 * and environment do not hold the PIN. Prints "ok STAGE" per stage; exit 0
 * when every child and the parent succeeded.
 */
#include <pthread.h>
#include <sys/wait.h>

#include "common.h"

static CK_FUNCTION_LIST_PTR f;
static CK_SLOT_ID slot;
static char pin[256];
static CK_ULONG pinlen;
static const char *label;

/* Inherited from the parent, for the children to misuse. */
static CK_SESSION_HANDLE parent_session = CK_INVALID_HANDLE;
static CK_OBJECT_HANDLE parent_key = CK_INVALID_HANDLE;

static int fail(const char *stage, const char *what, CK_RV rv)
{
	fprintf(stderr, "FAIL %s: %s: rv=0x%lx\n", stage, what, (unsigned long)rv);
	return 1;
}

/* sign_verify signs n digests with the private key labelled label and
 * verifies each with its public key. */
static int sign_verify(const char *stage, CK_SESSION_HANDLE s, int n)
{
	CK_OBJECT_HANDLE priv = find_one(f, s, CKO_PRIVATE_KEY, label);
	CK_OBJECT_HANDLE pub = find_one(f, s, CKO_PUBLIC_KEY, label);
	CK_MECHANISM m = {CKM_ECDSA, NULL, 0};
	for (int i = 0; i < n; i++) {
		CK_BYTE data[32], sig[256];
		CK_ULONG siglen = sizeof sig;
		CK_RV rv;
		memset(data, i + 1, sizeof data);
		if ((rv = f->C_SignInit(s, &m, priv)) != CKR_OK)
			return fail(stage, "C_SignInit", rv);
		if ((rv = f->C_Sign(s, data, sizeof data, sig, &siglen)) != CKR_OK)
			return fail(stage, "C_Sign", rv);
		if ((rv = f->C_VerifyInit(s, &m, pub)) != CKR_OK)
			return fail(stage, "C_VerifyInit", rv);
		if ((rv = f->C_Verify(s, data, sizeof data, sig, siglen)) != CKR_OK)
			return fail(stage, "C_Verify", rv);
	}
	return 0;
}

/* file_holds reports whether the file at path contains needle. */
static int file_holds(const char *path, const char *needle, size_t n)
{
	static char buf[1 << 16];
	FILE *fp = fopen(path, "r");
	if (fp == NULL)
		return 0;
	size_t got = fread(buf, 1, sizeof buf, fp);
	fclose(fp);
	for (size_t i = 0; i + n <= got; i++)
		if (memcmp(buf + i, needle, n) == 0)
			return 1;
	return 0;
}

/* helper_leaks checks every child process of this one (the helper) for
 * the PIN in its argv and environment; returns how many children it saw
 * in *seen. */
static int helper_leaks(int *seen)
{
	char path[128];
	pid_t pids[64];
	size_t n = child_pids(0, pids, 64);
	*seen = (int)n;
	for (size_t i = 0; i < n; i++) {
		snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pids[i]);
		if (file_holds(path, pin, pinlen))
			return 1;
		snprintf(path, sizeof path, "/proc/%d/environ", (int)pids[i]);
		if (file_holds(path, pin, pinlen))
			return 1;
	}
	return 0;
}

#define THREADED "a child whose 4 threads sign at once"

struct signer_arg {
	const char *stage;
	int failed;
};

/* thread_signs signs and verifies on a session of its own. */
static void *thread_signs(void *p)
{
	struct signer_arg *a = p;
	CK_SESSION_HANDLE s;
	if (f->C_OpenSession(slot, CKF_SERIAL_SESSION, NULL, NULL, &s) != CKR_OK) {
		a->failed = fail(a->stage, "C_OpenSession in a thread", 0);
		return NULL;
	}
	a->failed = sign_verify(a->stage, s, 20);
	f->C_CloseSession(s);
	return NULL;
}

static int threads_sign(const char *stage)
{
	pthread_t th[4];
	struct signer_arg args[4];
	int bad = 0;
	for (int i = 0; i < 4; i++) {
		args[i] = (struct signer_arg){stage, 0};
		pthread_create(&th[i], NULL, thread_signs, &args[i]);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		bad |= args[i].failed;
	}
	return bad;
}

static int child(const char *stage)
{
	CK_SESSION_INFO info;
	CK_MECHANISM m = {CKM_ECDSA, NULL, 0};
	CK_SESSION_HANDLE s;
	CK_RV rv;
	int helpers;

	/* What the child inherited is the parent's, not its own. */
	if ((rv = f->C_GetSlotList(CK_TRUE, NULL, &(CK_ULONG){0})) != CKR_CRYPTOKI_NOT_INITIALIZED)
		return fail(stage, "C_GetSlotList before the child's C_Initialize", rv);
	if (parent_session != CK_INVALID_HANDLE &&
	    (rv = f->C_GetSessionInfo(parent_session, &info)) != CKR_CRYPTOKI_NOT_INITIALIZED)
		return fail(stage, "C_GetSessionInfo on the parent's session", rv);
	if (parent_key != CK_INVALID_HANDLE &&
	    (rv = f->C_SignInit(parent_session, &m, parent_key)) != CKR_CRYPTOKI_NOT_INITIALIZED)
		return fail(stage, "C_SignInit with the parent's key", rv);

	if ((rv = f->C_Initialize(NULL)) != CKR_OK)
		return fail(stage, "C_Initialize in the child", rv);
	if ((rv = f->C_Initialize(NULL)) != CKR_CRYPTOKI_ALREADY_INITIALIZED)
		return fail(stage, "a second C_Initialize in the child", rv);
	if ((rv = f->C_OpenSession(slot, CKF_SERIAL_SESSION, NULL, NULL, &s)) != CKR_OK)
		return fail(stage, "C_OpenSession", rv);
	if ((rv = f->C_Login(s, CKU_USER, (CK_UTF8CHAR_PTR)pin, pinlen)) != CKR_OK)
		return fail(stage, "C_Login", rv);
	/* libp11 (nginx, Apache) re-initialises in the child and may go on
	 * with the handle the parent had: the child's helper numbers the
	 * token's objects as the parent's engine did. */
	if (parent_key != CK_INVALID_HANDLE && find_one(f, s, CKO_PRIVATE_KEY, label) != parent_key)
		return fail(stage, "the child's handle for the key is not the parent's", 0);
	if (helper_leaks(&helpers))
		return fail(stage, "the helper's argv or environment holds the PIN", 0);
	if (helpers != 1)
		return fail(stage, "the child has not exactly one helper process", (CK_RV)helpers);
	if (sign_verify(stage, s, 3))
		return 1;
	if (strcmp(stage, THREADED) == 0 && threads_sign(stage))
		return 1;
	if ((rv = f->C_Logout(s)) != CKR_OK)
		return fail(stage, "C_Logout", rv);
	if ((rv = f->C_CloseSession(s)) != CKR_OK)
		return fail(stage, "C_CloseSession", rv);
	if ((rv = f->C_Finalize(NULL)) != CKR_OK)
		return fail(stage, "C_Finalize in the child", rv);
	if (helper_leaks(&helpers), helpers != 0)
		return fail(stage, "the helper outlived C_Finalize", (CK_RV)helpers);
	return 0;
}

/* fork_child forks; the child runs child(stage) and exits with its
 * result, which the parent checks. */
static int fork_child(const char *stage)
{
	int st;
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0)
		return fail(stage, "fork", 0);
	if (pid == 0)
		_exit(child(stage));
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fprintf(stderr, "FAIL %s: the child ended with status 0x%x\n", stage, st);
		return 1;
	}
	printf("ok %s\n", stage);
	return 0;
}

static volatile int stop;
static volatile int signer_failed, signer_count;

static void *signer(void *arg)
{
	CK_SESSION_HANDLE s;
	CK_MECHANISM m = {CKM_ECDSA, NULL, 0};
	(void)arg;
	if (f->C_OpenSession(slot, CKF_SERIAL_SESSION, NULL, NULL, &s) != CKR_OK) {
		signer_failed = 1;
		return NULL;
	}
	while (!stop) {
		CK_BYTE data[32] = {1}, sig[256];
		CK_ULONG n = sizeof sig;
		if (f->C_SignInit(s, &m, parent_key) != CKR_OK || f->C_Sign(s, data, sizeof data, sig, &n) != CKR_OK) {
			signer_failed = 1;
			break;
		}
		signer_count++;
	}
	f->C_CloseSession(s);
	return NULL;
}

int main(int argc, char **argv)
{
	CK_C_INITIALIZE_ARGS a;
	CK_MECHANISM sha = {CKM_SHA256, NULL, 0};
	CK_BYTE part[1000], whole[2000], d1[32], d2[32];
	CK_ULONG n1 = sizeof d1, n2 = sizeof d2;
	CK_RV rv;
	int bad = 0;

	if (argc != 5) {
		fprintf(stderr, "usage: forkchild MODULE SLOT PINFILE LABEL\n");
		return 2;
	}
	f = load_module(argv[1], NULL);
	slot = strtoul(argv[2], NULL, 0);
	pinlen = read_pin(argv[3], pin, sizeof pin);
	label = argv[4];

	memset(&a, 0, sizeof a);
	a.flags = CKF_OS_LOCKING_OK;
	CHECK(f->C_Initialize(&a));
	bad |= fork_child("after C_Initialize");

	CHECK(f->C_OpenSession(slot, CKF_SERIAL_SESSION, NULL, NULL, &parent_session));
	CHECK(f->C_Login(parent_session, CKU_USER, (CK_UTF8CHAR_PTR)pin, pinlen));
	parent_key = find_one(f, parent_session, CKO_PRIVATE_KEY, label);
	bad |= fork_child("after C_Login");
	bad |= fork_child(THREADED);

	memset(part, 0x5a, sizeof part);
	memcpy(whole, part, sizeof part);
	memcpy(whole + sizeof part, part, sizeof part);
	CHECK(f->C_DigestInit(parent_session, &sha));
	CHECK(f->C_DigestUpdate(parent_session, part, sizeof part));
	bad |= fork_child("mid multi-part operation");
	CHECK(f->C_DigestUpdate(parent_session, part, sizeof part));
	CHECK(f->C_DigestFinal(parent_session, d1, &n1));
	CHECK(f->C_DigestInit(parent_session, &sha));
	CHECK(f->C_Digest(parent_session, whole, sizeof whole, d2, &n2));
	if (n1 != n2 || memcmp(d1, d2, n1) != 0)
		bad |= fail("mid multi-part operation", "the parent's digest across the fork differs", 0);

	pthread_t th;
	pthread_create(&th, NULL, signer, NULL);
	for (int i = 0; i < 3; i++) {
		while (signer_count < (i + 1) * 5 && !signer_failed)
			sched_yield();
		bad |= fork_child("while another thread signs");
	}
	stop = 1;
	pthread_join(th, NULL);
	if (signer_failed)
		bad |= fail("while another thread signs", "the parent's signing thread", 0);

	/* The parent keeps working after all of that. */
	if (sign_verify("the parent after the forks", parent_session, 3) == 0)
		printf("ok the parent after the forks\n");
	else
		bad = 1;
	if ((rv = f->C_Finalize(NULL)) != CKR_OK)
		bad |= fail("the parent", "C_Finalize", rv);
	return bad;
}
