/*
 * conn.c — the helper process and the client's connections to it. See
 * docs/DESIGN.md, "Processes that fork: the helper".
 *
 * A process that has forked from one that loaded this library (the Go
 * runtime cannot run there), or that asked for the helper, gets one at
 * C_Initialize: a fresh exec of hapkcs11-helper (beside this library)
 * that loads this library, runs the engine and serves this process alone.
 * It is born with one end of a socketpair, the control connection: its
 * welcome comes that way, and every further connection is a socketpair
 * whose end the client passes over it (SCM_RIGHTS), served by a thread of
 * the helper. A call takes an idle connection, or opens one (up to
 * HAP_MAX_CONNS), so the threads of a threaded child sign side by side.
 * A helper that dies, or does not answer within the bound it announced,
 * fails the call with CKR_DEVICE_ERROR and every later one, until the
 * next C_Initialize starts another.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hapkcs11.h"
#include "entry.h"
#include "rpc.h"
#include "_cgo_export.h"

extern char **environ;

#define HAP_MAGIC 0x48415048u /* "HAPH" */
#define HAP_VERSION 3u
/* How long a helper may take from exec to its welcome (its C_Initialize
 * opens every member, each bounded by command_timeout). */
#define HAP_START_BOUND_MS 60000
/* Connections of one client: as many calls run at once. */
#define HAP_MAX_CONNS 16

/* ---- frames ---- */

static long long now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* io waits until fd is ready for ev or the deadline passes: 1 ready, 0
 * timed out, -1 error. */
static int io_wait(int fd, short ev, long long deadline)
{
	for (;;) {
		long long left = deadline - now_ms();
		if (deadline > 0 && left <= 0)
			return 0;
		struct pollfd p = {fd, ev, 0};
		int n = poll(&p, 1, deadline > 0 ? (int)left : -1);
		if (n > 0)
			return 1;
		if (n < 0 && errno != EINTR)
			return -1;
	}
}

/* The socket is blocking: the client's has SO_RCVTIMEO and SO_SNDTIMEO
 * set to the bound of a call (set_bound), the helper's none. One recv
 * per reply in the common case: every poll or partial read is a system
 * call on every PKCS#11 call. */

/* set_bound makes every send and recv on fd give up after ms. */
static void set_bound(int fd, long long ms)
{
	struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/* send_frame writes the frame in m (its first 4 bytes are the length). */
static int send_frame(int fd, struct hap_msg *m)
{
	uint32_t n = (uint32_t)(m->len - 4);
	memcpy(m->b, &n, 4);
	size_t off = 0;
	while (off < m->len) {
		ssize_t w = send(fd, m->b + off, m->len - off, MSG_NOSIGNAL);
		if (w > 0)
			off += (size_t)w;
		else if (w < 0 && errno == EINTR)
			continue;
		else
			return -1; /* the peer is gone, or the bound passed */
	}
	return 0;
}

/* recv_some reads what is there, at least one byte; -1 on EOF, error or
 * the bound. */
static ssize_t recv_some(int fd, void *p, size_t n)
{
	for (;;) {
		ssize_t r = recv(fd, p, n, 0);
		if (r > 0)
			return r;
		if (r < 0 && errno == EINTR)
			continue;
		return -1;
	}
}

#define HAP_READ_AHEAD 65536

/* recv_frame reads one frame into m: its body is at m->b + m->pos (4),
 * up to m->len. A reply never follows another unasked, so reading ahead
 * takes nothing that belongs to the next frame; more is a broken peer. */
static int recv_frame(int fd, struct hap_msg *m)
{
	size_t cap = HAP_READ_AHEAD, got = 0;
	uint32_t n = 0;
	free(m->b);
	m->b = malloc(cap);
	if (m->b == NULL)
		return -1;
	m->cap = cap;
	while (got < 4) {
		ssize_t r = recv_some(fd, m->b + got, cap - got);
		if (r < 0)
			return -1;
		got += (size_t)r;
	}
	memcpy(&n, m->b, 4);
	if (n > HAP_MAX_FRAME || got > (size_t)n + 4)
		return -1;
	if ((size_t)n + 4 > cap) {
		unsigned char *b = realloc(m->b, (size_t)n + 4);
		if (b == NULL)
			return -1;
		m->b = b;
		m->cap = (size_t)n + 4;
	}
	while (got < (size_t)n + 4) {
		ssize_t r = recv_some(fd, m->b + got, (size_t)n + 4 - got);
		if (r < 0)
			return -1;
		got += (size_t)r;
	}
	m->len = (size_t)n + 4;
	m->pos = 4;
	return 0;
}

/* ---- the client ---- */

struct hap_conn {
	int ctl; /* the control connection the helper was born with */
	pid_t pid;
	long long bound_ms;
	pthread_mutex_t mu; /* guards what follows */
	pthread_cond_t freed;
	int dead;
	int fds[HAP_MAX_CONNS]; /* every call connection */
	int nfds;
	int idle[HAP_MAX_CONNS];
	int nidle;
};

/* The connection of this process to its helper; NULL when it has none.
 * Written only by C_Initialize and C_Finalize (serialised by entry.c) and
 * by the fork child handler. */
static struct hap_conn *conn;

int hap_remote(void)
{
	return conn != NULL;
}

/* The path of this library, resolved when it was loaded. */
static char module_path[PATH_MAX];

__attribute__((constructor)) static void hap_find_self(void)
{
	Dl_info info;
	if (dladdr((void *)hap_find_self, &info) && info.dli_fname != NULL &&
	    realpath(info.dli_fname, module_path) == NULL)
		snprintf(module_path, sizeof module_path, "%s", info.dli_fname);
	hap_save_env();
}

/* The environment the helper starts with: the one the library was loaded
 * in, taken again at every C_Initialize that runs the engine in this
 * process. A forking server may clear its children's environment (nginx
 * keeps only TZ for its workers); the child's helper then still finds the
 * configuration and the members' modules the parent's engine found. */
static char **saved_env;

void hap_save_env(void)
{
	size_t n = 0;
	while (environ != NULL && environ[n] != NULL)
		n++;
	char **env = calloc(n + 1, sizeof *env);
	if (env == NULL)
		return;
	for (size_t i = 0; i < n; i++)
		if ((env[i] = strdup(environ[i])) == NULL) {
			while (i > 0)
				free(env[--i]);
			free(env);
			return;
		}
	char **old = saved_env;
	saved_env = env;
	for (size_t i = 0; old != NULL && old[i] != NULL; i++)
		free(old[i]);
	free(old);
}

/* check_helper says what is wrong with the helper at path (in dir), or
 * NULL: it must be a file only root or this user could have put there. */
static const char *check_helper(const char *dir, const char *path, char *why, size_t n)
{
	struct stat st;
	if (stat(dir, &st) == 0 && (st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX)) {
		snprintf(why, n, "its directory %s is writable by group or others", dir);
		return why;
	}
	if (stat(path, &st) != 0) {
		snprintf(why, n, "%s", strerror(errno));
		return why;
	}
	if (!S_ISREG(st.st_mode))
		return "not a regular file";
	if (access(path, X_OK) != 0)
		return "not executable";
	if (st.st_uid != 0 && st.st_uid != geteuid())
		return "owned by another user (it must belong to root or to this process's user)";
	if (st.st_mode & (S_IWGRP | S_IWOTH))
		return "writable by group or others";
	return NULL;
}

static void close_all(struct hap_conn *c)
{
	if (c->ctl >= 0)
		close(c->ctl);
	c->ctl = -1;
	for (int i = 0; i < c->nfds; i++)
		close(c->fds[i]);
	c->nfds = c->nidle = 0;
}

static void kill_helper(struct hap_conn *c)
{
	close_all(c);
	if (c->pid > 0) {
		kill(c->pid, SIGKILL);
		waitpid(c->pid, NULL, 0);
		c->pid = 0;
	}
}

/* reap ends the helper after its connections closed: it finalizes and
 * exits on EOF; one that does not within the bound is killed. */
static void reap(struct hap_conn *c)
{
	close_all(c);
	if (c->pid <= 0)
		return;
	long long deadline = now_ms() + (c->bound_ms < 5000 ? 5000 : c->bound_ms);
	int pfd = (int)syscall(SYS_pidfd_open, c->pid, 0);
	if (pfd >= 0) {
		if (io_wait(pfd, POLLIN, deadline) != 1)
			kill(c->pid, SIGKILL);
		close(pfd);
	} else {
		kill(c->pid, SIGKILL);
	}
	waitpid(c->pid, NULL, 0);
	c->pid = 0;
}

static void free_conn(struct hap_conn *c)
{
	pthread_mutex_destroy(&c->mu);
	pthread_cond_destroy(&c->freed);
	free(c);
}

static CK_RV start_helper(struct hap_conn *c)
{
	char dir[PATH_MAX], helper[PATH_MAX + 32], why[256];
	const char *bad;
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t attr;
	sigset_t none, all;
	int sv[2], err;

	if (module_path[0] == 0) {
		fprintf(stderr, "libhapkcs11: cannot start the helper: the library cannot find its own path\n");
		return CKR_GENERAL_ERROR;
	}
	snprintf(dir, sizeof dir, "%s", module_path);
	char *libdir = dirname(dir);
	snprintf(helper, sizeof helper, "%s/hapkcs11-helper", libdir);
	if ((bad = check_helper(libdir, helper, why, sizeof why)) != NULL) {
		fprintf(stderr, "libhapkcs11: cannot start the helper %s: %s\n", helper, bad);
		return CKR_GENERAL_ERROR;
	}
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
		fprintf(stderr, "libhapkcs11: cannot start the helper: socketpair: %s\n", strerror(errno));
		return CKR_HOST_MEMORY;
	}
	char *argv[] = {helper, module_path, NULL};
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, sv[1], 3);
	posix_spawnattr_init(&attr);
	sigemptyset(&none);
	sigfillset(&all);
	posix_spawnattr_setsigmask(&attr, &none);
	posix_spawnattr_setsigdefault(&attr, &all);
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
	err = posix_spawn(&c->pid, helper, &fa, &attr, argv, hap_is_child() && saved_env != NULL ? saved_env : environ);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&attr);
	close(sv[1]);
	if (err != 0) {
		close(sv[0]);
		c->pid = 0;
		fprintf(stderr, "libhapkcs11: cannot start the helper %s: %s\n", helper, strerror(err));
		return CKR_GENERAL_ERROR;
	}
	c->ctl = sv[0];
	set_bound(c->ctl, HAP_START_BOUND_MS);

	struct hap_msg w = {0};
	if (recv_frame(c->ctl, &w) != 0) {
		free(w.b);
		fprintf(stderr, "libhapkcs11: the helper %s (pid %d) ended or did not answer within %d s\n",
			helper, (int)c->pid, HAP_START_BOUND_MS / 1000);
		kill_helper(c);
		return CKR_GENERAL_ERROR;
	}
	uint64_t magic = hap_get64(&w), version = hap_get64(&w), rv = hap_get64(&w), bound = hap_get64(&w);
	int bad_welcome = w.bad || magic != HAP_MAGIC || version != HAP_VERSION;
	free(w.b);
	if (bad_welcome) {
		fprintf(stderr, "libhapkcs11: the helper %s is not of this library's version\n", helper);
		kill_helper(c);
		return CKR_GENERAL_ERROR;
	}
	if (rv != CKR_OK) {
		reap(c);
		return (CK_RV)rv;
	}
	c->bound_ms = (long long)bound;
	set_bound(c->ctl, c->bound_ms);
	return CKR_OK;
}

CK_RV hap_remote_initialize(void)
{
	if (conn != NULL && !conn->dead)
		return CKR_CRYPTOKI_ALREADY_INITIALIZED;
	if (conn != NULL) { /* its helper died: start another */
		reap(conn);
		free_conn(conn);
		conn = NULL;
	}
	struct hap_conn *c = calloc(1, sizeof *c);
	if (c == NULL)
		return CKR_HOST_MEMORY;
	c->ctl = -1;
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->freed, NULL);
	CK_RV rv = start_helper(c);
	if (rv != CKR_OK) {
		free_conn(c);
		return rv;
	}
	hap_fold_reset();
	conn = c;
	return CKR_OK;
}

CK_RV hap_remote_finalize(void)
{
	struct hap_conn *c = conn;
	if (c == NULL)
		return CKR_CRYPTOKI_NOT_INITIALIZED;
	conn = NULL;
	hap_fold_reset();
	reap(c);
	free_conn(c);
	return CKR_OK;
}

void hap_remote_forget(void)
{
	struct hap_conn *c = conn;
	if (c == NULL)
		return;
	/* The parent's: close this process's copies of its descriptors, so
	 * that the parent's helper still sees EOF when the parent is done;
	 * its memory and its lock (another thread may hold it) stay as they
	 * are. */
	close(c->ctl);
	for (int i = 0; i < c->nfds && i < HAP_MAX_CONNS; i++)
		close(c->fds[i]);
	conn = NULL;
	hap_fold_forget();
}

/* send_fd passes fd to the helper over the control connection. */
static int send_fd(int ctl, int fd)
{
	char byte = 0;
	struct iovec iov = {&byte, 1};
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct msghdr msg = {0};
	memset(&u, 0, sizeof u);
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = u.buf;
	msg.msg_controllen = sizeof u.buf;
	struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	for (;;) {
		ssize_t n = sendmsg(ctl, &msg, MSG_NOSIGNAL);
		if (n == 1)
			return 0;
		if (n < 0 && errno == EINTR)
			continue;
		return -1;
	}
}

/* take_fd returns an idle call connection, or opens one, or waits for
 * one; -1 when the helper is dead. Called with c->mu held. */
static int take_fd(struct hap_conn *c)
{
	for (;;) {
		if (c->dead)
			return -1;
		if (c->nidle > 0)
			return c->idle[--c->nidle];
		if (c->nfds < HAP_MAX_CONNS) {
			int sv[2];
			if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
				return -1;
			int sent = send_fd(c->ctl, sv[1]);
			close(sv[1]);
			if (sent != 0) {
				close(sv[0]);
				c->dead = 1;
				return -1;
			}
			set_bound(sv[0], c->bound_ms);
			c->fds[c->nfds++] = sv[0];
			return sv[0];
		}
		pthread_cond_wait(&c->freed, &c->mu);
	}
}

CK_RV hap_call(struct hap_msg *m)
{
	struct hap_conn *c = conn;
	if (m->local != CKR_OK)
		return m->local;
	if (c == NULL)
		return CKR_CRYPTOKI_NOT_INITIALIZED;
	if (m->changes)
		hap_fold_changed();
	pthread_mutex_lock(&c->mu);
	int fd = take_fd(c);
	pthread_mutex_unlock(&c->mu);
	if (fd < 0) {
		m->bad = 1;
		return CKR_DEVICE_ERROR;
	}
	int ok = send_frame(fd, m) == 0 && recv_frame(fd, m) == 0;
	pthread_mutex_lock(&c->mu);
	if (ok) {
		c->idle[c->nidle++] = fd;
	} else if (!c->dead) {
		/* Dead, or stopped answering: either way its streams are lost. */
		c->dead = 1;
		if (c->pid > 0)
			kill(c->pid, SIGKILL);
	}
	pthread_cond_broadcast(&c->freed);
	pthread_mutex_unlock(&c->mu);
	if (m->changes)
		hap_fold_changed();
	if (!ok) {
		m->bad = 1;
		return CKR_DEVICE_ERROR;
	}
	CK_RV rv = (CK_RV)hap_get64(m);
	return m->bad ? CKR_DEVICE_ERROR : rv;
}

/* ---- the helper ---- */

/* recv_fd returns a connection the client passed over ctl; -1 at EOF. */
static int recv_fd(int ctl)
{
	char byte;
	struct iovec iov = {&byte, 1};
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct msghdr msg = {0};
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = u.buf;
	msg.msg_controllen = sizeof u.buf;
	for (;;) {
		ssize_t n = recvmsg(ctl, &msg, MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR)
			continue;
		if (n != 1)
			return -1;
		struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
		if (cm == NULL || cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS ||
		    cm->cmsg_len != CMSG_LEN(sizeof(int)))
			return -1;
		int fd;
		memcpy(&fd, CMSG_DATA(cm), sizeof fd);
		return fd;
	}
}

/* serve answers the requests on one call connection until the client
 * closes it. */
static void *serve(void *arg)
{
	int fd = (int)(intptr_t)arg;
	struct hap_msg in = {0};
	while (recv_frame(fd, &in) == 0) {
		struct hap_req r = {0};
		r.in = in.b + in.pos;
		r.inlen = in.len - in.pos;
		r.op = hap_take_op(&r);
		r.out.len = 4;
		if (r.op == HAP_OP_FOLD)
			hap_serve_fold(&r);
		else
			hap_dispatch(&r);
		hap_req_free(&r);
		int ok = r.out.local == CKR_OK && send_frame(fd, &r.out) == 0;
		free(r.out.b);
		if (!ok)
			break;
	}
	free(in.b);
	close(fd);
	return NULL;
}

/* hap_helper_serve is the helper's main (hapkcs11-helper calls it): it
 * runs the engine in this fresh process, says so on ctl, then serves each
 * connection its one client passes over ctl, on a thread of its own,
 * until the client closes ctl. */
int hap_helper_serve(int ctl)
{
	CK_C_INITIALIZE_ARGS args = {0};
	args.flags = CKF_OS_LOCKING_OK;
	hap_serving = 1;
	CK_RV rv = C_Initialize(&args);

	struct hap_msg w = {0};
	w.len = 4;
	hap_put64(&w, HAP_MAGIC);
	hap_put64(&w, HAP_VERSION);
	hap_put64(&w, rv);
	hap_put64(&w, rv == CKR_OK ? hapCallBoundMillis() : 0);
	int sent = w.local == CKR_OK && send_frame(ctl, &w) == 0;
	free(w.b);
	if (rv != CKR_OK || !sent)
		return 1;

	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	int fd;
	while ((fd = recv_fd(ctl)) >= 0) {
		pthread_t t;
		if (pthread_create(&t, &attr, serve, (void *)(intptr_t)fd) != 0)
			close(fd); /* the client's call fails: EOF */
	}
	pthread_attr_destroy(&attr);
	C_Finalize(NULL);
	return 0;
}
