/*
 * helperfault.c — a forked child whose helper cannot start, dies or hangs.
 *
 *   helperfault missing MODULE
 *   helperfault kill|stop MODULE SLOT PINFILE LABEL
 *
 * missing: the child's C_Initialize must fail, at once, with a CKR code
 * (the library says on stderr what is missing); prints "rv=0x..".
 * kill: the child SIGKILLs its helper; the next call must answer
 * CKR_DEVICE_ERROR, the next C_Initialize start a new helper that signs;
 * the same again through C_Finalize and C_Initialize.
 * stop: the child SIGSTOPs its helper; a sign must answer
 * CKR_DEVICE_ERROR within the helper's call bound; prints "stopped_ms=N".
 */
#include <signal.h>
#include <sys/wait.h>

#include "common.h"

static CK_FUNCTION_LIST_PTR f;
static CK_SLOT_ID slot;
static char pin[256];
static CK_ULONG pinlen;
static const char *label;

/* signal_and_wait sends sig to the helper, and returns once it took
 * effect (stopped, or dead but not reaped: the library reaps its own
 * helper): kill returns before a process on another CPU has stopped, and
 * a call sent meanwhile would be answered. */
static void signal_and_wait(pid_t pid, int sig)
{
	siginfo_t info;
	kill(pid, sig);
	if (waitid(P_PID, (id_t)pid, &info, (sig == SIGSTOP ? WSTOPPED : WEXITED) | WNOWAIT) != 0) {
		perror("waitid");
		exit(1);
	}
}

/* helper_pid returns the one child process of this one: the helper. */
static pid_t helper_pid(void)
{
	pid_t pids[2];
	if (child_pids(0, pids, 2) != 1) {
		fprintf(stderr, "FAIL the child has not exactly one helper\n");
		exit(1);
	}
	return pids[0];
}

static CK_RV sign_once(CK_SESSION_HANDLE s, CK_OBJECT_HANDLE key)
{
	return sign32(f, s, CKM_ECDSA, key);
}

/* session logs in on a new session and finds the key. */
static CK_SESSION_HANDLE session(CK_OBJECT_HANDLE *key)
{
	CK_SESSION_HANDLE s;
	CHECK(f->C_OpenSession(slot, CKF_SERIAL_SESSION, NULL, NULL, &s));
	CHECK(f->C_Login(s, CKU_USER, (CK_UTF8CHAR_PTR)pin, pinlen));
	*key = find_one(f, s, CKO_PRIVATE_KEY, label);
	return s;
}

static int expect(const char *what, CK_RV got, CK_RV want)
{
	if (got == want)
		return 0;
	fprintf(stderr, "FAIL %s: rv=0x%lx, want 0x%lx\n", what, (unsigned long)got, (unsigned long)want);
	return 1;
}

static int child_kill(void)
{
	CK_OBJECT_HANDLE key;
	CK_SESSION_HANDLE s;
	int bad = 0;

	CHECK(f->C_Initialize(NULL));
	s = session(&key);
	bad |= expect("a signature before the kill", sign_once(s, key), CKR_OK);
	pid_t first = helper_pid();
	signal_and_wait(first, SIGKILL);
	bad |= expect("a signature after the helper died", sign_once(s, key), CKR_DEVICE_ERROR);
	bad |= expect("a call after that", f->C_GetSessionInfo(s, &(CK_SESSION_INFO){0}), CKR_DEVICE_ERROR);
	/* The next C_Initialize starts another helper. */
	bad |= expect("C_Initialize after the helper died", f->C_Initialize(NULL), CKR_OK);
	if (helper_pid() == first)
		bad |= expect("a new helper", 1, 0);
	s = session(&key);
	bad |= expect("a signature through the new helper", sign_once(s, key), CKR_OK);
	/* And through C_Finalize, as the specification has it. */
	signal_and_wait(helper_pid(), SIGKILL);
	bad |= expect("a signature after the second helper died", sign_once(s, key), CKR_DEVICE_ERROR);
	bad |= expect("C_Finalize after the helper died", f->C_Finalize(NULL), CKR_OK);
	bad |= expect("C_Initialize after C_Finalize", f->C_Initialize(NULL), CKR_OK);
	s = session(&key);
	bad |= expect("a signature through the third helper", sign_once(s, key), CKR_OK);
	bad |= expect("C_Finalize", f->C_Finalize(NULL), CKR_OK);
	if (!bad)
		printf("ok kill\n");
	return bad;
}

static int child_stop(void)
{
	CK_OBJECT_HANDLE key;
	CK_SESSION_HANDLE s;
	int bad = 0;

	CHECK(f->C_Initialize(NULL));
	s = session(&key);
	pid_t pid = helper_pid();
	signal_and_wait(pid, SIGSTOP);
	double t0 = now_seconds();
	bad |= expect("a signature while the helper is stopped", sign_once(s, key), CKR_DEVICE_ERROR);
	printf("stopped_ms=%d\n", (int)((now_seconds() - t0) * 1000));
	bad |= expect("C_Finalize", f->C_Finalize(NULL), CKR_OK);
	if (kill(pid, 0) == 0) {
		fprintf(stderr, "FAIL the hung helper outlived C_Finalize\n");
		bad = 1;
	}
	return bad;
}

static int child_missing(void)
{
	double t0 = now_seconds();
	CK_RV rv = f->C_Initialize(NULL);
	printf("rv=0x%lx ms=%d\n", (unsigned long)rv, (int)((now_seconds() - t0) * 1000));
	/* Nothing is left half-started: a call answers as before. */
	if (rv != CKR_OK && f->C_GetSlotList(CK_TRUE, NULL, &(CK_ULONG){0}) != CKR_CRYPTOKI_NOT_INITIALIZED) {
		fprintf(stderr, "FAIL a call after the failed C_Initialize\n");
		return 1;
	}
	return rv == CKR_OK;
}

int main(int argc, char **argv)
{
	CK_C_INITIALIZE_ARGS a;
	int st;

	if (argc < 3 || (strcmp(argv[1], "missing") != 0 && argc != 6)) {
		fprintf(stderr, "usage: helperfault missing MODULE | helperfault kill|stop MODULE SLOT PINFILE LABEL\n");
		return 2;
	}
	f = load_module(argv[2], NULL);
	if (argc == 6) {
		slot = strtoul(argv[3], NULL, 0);
		pinlen = read_pin(argv[4], pin, sizeof pin);
		label = argv[5];
	}
	memset(&a, 0, sizeof a);
	a.flags = CKF_OS_LOCKING_OK;
	CHECK(f->C_Initialize(&a));
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		int bad;
		if (strcmp(argv[1], "missing") == 0)
			bad = child_missing();
		else if (strcmp(argv[1], "kill") == 0)
			bad = child_kill();
		else
			bad = child_stop();
		fflush(NULL);
		_exit(bad);
	}
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fprintf(stderr, "FAIL the child ended with status 0x%x\n", st);
		return 1;
	}
	CHECK(f->C_Finalize(NULL));
	return 0;
}
