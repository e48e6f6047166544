/*
 * forkfleet.c — a parent that runs the engine in process and a child it
 * forks, which initialises again (its helper runs the engine) and signs
 * until its standard input closes, for the fleet view.
 *
 *   forkfleet MODULE SLOT PINFILE LABEL
 *
 * Prints "parent PID", "child PID helper PID" once the child signed, then
 * "progress N" every 100 signatures of the child, and its "total" line
 * when its input closed (a failed signature ends it with FATAL).
 */
#include <poll.h>
#include <sys/wait.h>

#include "common.h"

/* input_closed says whether standard input reached its end. */
static int input_closed(void)
{
	struct pollfd p = {0, POLLIN, 0};
	char b[64];
	return poll(&p, 1, 0) == 1 && read(0, b, sizeof b) <= 0;
}

int main(int argc, char **argv)
{
	char pin[256];
	if (argc != 5) {
		fprintf(stderr, "usage: forkfleet MODULE SLOT PINFILE LABEL\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	CK_FUNCTION_LIST_PTR f = load_module(argv[1], NULL);
	CK_SLOT_ID slot = strtoul(argv[2], NULL, 0);
	CK_ULONG pinlen = read_pin(argv[3], pin, sizeof pin);
	CK_SESSION_HANDLE s = init_login(f, slot, pin, pinlen);
	CK_OBJECT_HANDLE key = find_one(f, s, CKO_PRIVATE_KEY, argv[4]);
	CHECK(sign32(f, s, CKM_ECDSA, key));
	printf("parent %d\n", (int)getpid());

	pid_t child = fork();
	if (child < 0) {
		perror("fork");
		return 2;
	}
	if (child == 0) {
		s = init_login(f, slot, pin, pinlen);
		key = find_one(f, s, CKO_PRIVATE_KEY, argv[4]);
		CHECK(sign32(f, s, CKM_ECDSA, key));
		pid_t helper = 0;
		child_pids(0, &helper, 1);
		printf("child %d helper %d\n", (int)getpid(), (int)helper);
		long n = 1;
		while (!input_closed()) {
			CHECK(sign32(f, s, CKM_ECDSA, key));
			if (++n % 100 == 0)
				printf("progress %ld\n", n);
		}
		CHECK(f->C_Finalize(NULL));
		printf("total signed=%ld sign_failed=0\n", n);
		_exit(0);
	}
	int st;
	if (waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fprintf(stderr, "FATAL the child failed (status 0x%x)\n", st);
		return 1;
	}
	CHECK(sign32(f, s, CKM_ECDSA, key)); /* the parent's engine still works */
	CHECK(f->C_Finalize(NULL));
	printf("done parent\n");
	return 0;
}
