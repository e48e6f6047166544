/*
 * rpc.c — the helper process: its start, its connection and the
 * marshalling of each argument kind (the per-function code is generated:
 * rpc_gen.c). See docs/DESIGN.md, "Processes that fork".
 *
 * Client: a process that has forked from one that loaded this library
 * (the Go runtime cannot run there), or that asked for the helper, gets a
 * helper at C_Initialize: a fresh exec of hapkcs11-helper (beside this
 * library) that loads this library, runs the engine and serves this
 * process alone over a socketpair. Calls take the connection in turn. A
 * helper that dies, or does not answer within the bound it announced,
 * fails the call with CKR_DEVICE_ERROR and every later one, until the
 * next C_Initialize starts another.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
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
#define HAP_VERSION 1u
/* How long a helper may take from exec to its welcome (its C_Initialize
 * opens every member, each bounded by command_timeout). */
#define HAP_START_BOUND_MS 60000

/* ---- frames ---- */

static void grow(struct hap_msg *m, size_t n)
{
	if (m->len + n <= m->cap)
		return;
	size_t cap = m->cap ? m->cap : 256;
	while (cap < m->len + n)
		cap *= 2;
	unsigned char *b = realloc(m->b, cap);
	if (b == NULL) {
		m->local = CKR_HOST_MEMORY;
		m->len = m->cap ? 4 : 0;
		return;
	}
	m->b = b;
	m->cap = cap;
}

static void put64(struct hap_msg *m, uint64_t v)
{
	grow(m, 8);
	if (m->local == CKR_HOST_MEMORY)
		return;
	memcpy(m->b + m->len, &v, 8);
	m->len += 8;
}

static void putbytes(struct hap_msg *m, const void *p, size_t n)
{
	if (m->len + n > HAP_MAX_FRAME) {
		m->local = CKR_ARGUMENTS_BAD;
		return;
	}
	grow(m, n);
	if (m->local == CKR_HOST_MEMORY || n == 0)
		return;
	memcpy(m->b + m->len, p, n);
	m->len += n;
}

static uint64_t get64(struct hap_msg *m)
{
	uint64_t v = 0;
	if (m->pos + 8 > m->len) {
		m->bad = 1;
		return 0;
	}
	memcpy(&v, m->b + m->pos, 8);
	m->pos += 8;
	return v;
}

static const unsigned char *getbytes(struct hap_msg *m, size_t n)
{
	if (n > m->len - m->pos) {
		m->bad = 1;
		return NULL;
	}
	const unsigned char *p = m->b + m->pos;
	m->pos += n;
	return p;
}

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

/* ---- the client's connection ---- */

struct hap_conn {
	int fd;
	pid_t pid;
	long long bound_ms;
	int dead;
	pthread_mutex_t mu;
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

/* check_helper says what is wrong with the helper at path, or NULL. */
static const char *check_helper(const char *path, char *why, size_t n)
{
	struct stat st;
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

static void kill_helper(struct hap_conn *c)
{
	if (c->pid > 0) {
		kill(c->pid, SIGKILL);
		waitpid(c->pid, NULL, 0);
		c->pid = 0;
	}
}

/* reap ends the helper after its socket closed: it finalizes and exits on
 * EOF; one that does not within the bound is killed. */
static void reap(struct hap_conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
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
	snprintf(helper, sizeof helper, "%s/hapkcs11-helper", dirname(dir));
	if ((bad = check_helper(helper, why, sizeof why)) != NULL) {
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
	c->fd = sv[0];
	set_bound(c->fd, HAP_START_BOUND_MS);

	struct hap_msg w = {0};
	if (recv_frame(c->fd, &w) != 0) {
		free(w.b);
		fprintf(stderr, "libhapkcs11: the helper %s (pid %d) ended or did not answer within %d s\n",
			helper, (int)c->pid, HAP_START_BOUND_MS / 1000);
		kill_helper(c);
		return CKR_GENERAL_ERROR;
	}
	uint64_t magic = get64(&w), version = get64(&w), rv = get64(&w), bound = get64(&w);
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
	set_bound(c->fd, c->bound_ms);
	return CKR_OK;
}

CK_RV hap_remote_initialize(void)
{
	if (conn != NULL && !conn->dead)
		return CKR_CRYPTOKI_ALREADY_INITIALIZED;
	if (conn != NULL) { /* its helper died: start another */
		reap(conn);
		pthread_mutex_destroy(&conn->mu);
		free(conn);
		conn = NULL;
	}
	struct hap_conn *c = calloc(1, sizeof *c);
	if (c == NULL)
		return CKR_HOST_MEMORY;
	c->fd = -1;
	pthread_mutex_init(&c->mu, NULL);
	CK_RV rv = start_helper(c);
	if (rv != CKR_OK) {
		pthread_mutex_destroy(&c->mu);
		free(c);
		return rv;
	}
	conn = c;
	return CKR_OK;
}

CK_RV hap_remote_finalize(void)
{
	struct hap_conn *c = conn;
	if (c == NULL)
		return CKR_CRYPTOKI_NOT_INITIALIZED;
	conn = NULL;
	reap(c);
	pthread_mutex_destroy(&c->mu);
	free(c);
	return CKR_OK;
}

void hap_remote_forget(void)
{
	if (conn != NULL) {
		close(conn->fd);
		conn = NULL; /* the parent's; its memory stays */
	}
}

void hap_msg_start(struct hap_msg *m, uint64_t op)
{
	memset(m, 0, sizeof *m);
	grow(m, 256);
	m->len = 4; /* the frame's length */
	put64(m, op);
}

CK_RV hap_call(struct hap_msg *m)
{
	struct hap_conn *c = conn;
	if (m->local != CKR_OK)
		return m->local;
	if (c == NULL)
		return CKR_CRYPTOKI_NOT_INITIALIZED;
	pthread_mutex_lock(&c->mu);
	if (c->dead) {
		pthread_mutex_unlock(&c->mu);
		return CKR_DEVICE_ERROR;
	}
	if (send_frame(c->fd, m) != 0 || recv_frame(c->fd, m) != 0) {
		/* Dead, or stopped answering: either way the stream is lost. */
		c->dead = 1;
		if (c->pid > 0)
			kill(c->pid, SIGKILL);
		pthread_mutex_unlock(&c->mu);
		m->bad = 1;
		return CKR_DEVICE_ERROR;
	}
	pthread_mutex_unlock(&c->mu);
	CK_RV rv = (CK_RV)get64(m);
	return m->bad ? CKR_DEVICE_ERROR : rv;
}

CK_RV hap_msg_end(struct hap_msg *m, CK_RV rv)
{
	free(m->b);
	if (m->bad)
		return CKR_DEVICE_ERROR;
	if (rv == CKR_OK && m->fix != CKR_OK)
		return m->fix;
	return rv;
}

/* ---- argument kinds, client side ---- */

void hap_put_ulong(struct hap_msg *m, CK_ULONG v)
{
	put64(m, v);
}

void hap_put_in(struct hap_msg *m, CK_BYTE_PTR p, CK_ULONG n)
{
	put64(m, p != NULL);
	put64(m, n);
	if (p != NULL)
		putbytes(m, p, n);
}

void hap_put_out(struct hap_msg *m, CK_BYTE_PTR p, CK_ULONG_PTR n)
{
	put64(m, (p != NULL) | (n != NULL) << 1);
	put64(m, n != NULL ? *n : 0);
}

void hap_put_label(struct hap_msg *m, CK_UTF8CHAR_PTR p)
{
	put64(m, p != NULL);
	if (p != NULL)
		putbytes(m, p, 32);
}

void hap_put_list(struct hap_msg *m, CK_ULONG_PTR p, CK_ULONG_PTR n)
{
	hap_put_out(m, (CK_BYTE_PTR)p, n);
}

void hap_put_listmax(struct hap_msg *m, CK_ULONG_PTR p, CK_ULONG max, CK_ULONG_PTR n)
{
	put64(m, (p != NULL) | (n != NULL) << 1);
	put64(m, max);
}

void hap_put_ulongout(struct hap_msg *m, CK_ULONG_PTR p)
{
	put64(m, p != NULL);
}

void hap_put_structout(struct hap_msg *m, void *p, size_t size)
{
	(void)size;
	put64(m, p != NULL);
}

/* Mechanisms whose parameter structure holds pointers: they mean
 * something only in this process, so they are refused rather than sent. */
static int pointer_param(CK_MECHANISM_TYPE t)
{
	switch (t) {
	case CKM_RSA_PKCS_OAEP: case CKM_AES_GCM: case CKM_AES_CCM:
	case CKM_ECDH1_DERIVE: case CKM_ECDH1_COFACTOR_DERIVE: case CKM_ECMQV_DERIVE:
	case CKM_X9_42_DH_DERIVE: case CKM_RSA_AES_KEY_WRAP:
	case CKM_AES_ECB_ENCRYPT_DATA: case CKM_AES_CBC_ENCRYPT_DATA:
	case CKM_DES_ECB_ENCRYPT_DATA: case CKM_DES_CBC_ENCRYPT_DATA:
	case CKM_DES3_ECB_ENCRYPT_DATA: case CKM_DES3_CBC_ENCRYPT_DATA:
	case CKM_CONCATENATE_BASE_AND_DATA: case CKM_CONCATENATE_DATA_AND_BASE:
	case CKM_XOR_BASE_AND_DATA:
		return 1;
	}
	return 0;
}

void hap_put_mech(struct hap_msg *m, CK_MECHANISM_PTR p)
{
	put64(m, p != NULL);
	if (p == NULL)
		return;
	if (p->pParameter != NULL && p->ulParameterLen > 0 && pointer_param(p->mechanism))
		m->local = CKR_MECHANISM_PARAM_INVALID;
	put64(m, p->mechanism);
	hap_put_in(m, p->pParameter, p->ulParameterLen);
}

static void put_attrs(struct hap_msg *m, CK_ATTRIBUTE_PTR p, CK_ULONG n, int depth)
{
	put64(m, p != NULL);
	put64(m, n);
	if (p == NULL)
		return;
	if (n > HAP_MAX_ATTRS) {
		m->local = CKR_ARGUMENTS_BAD;
		return;
	}
	for (CK_ULONG i = 0; i < n && m->local == CKR_OK; i++) {
		put64(m, p[i].type);
		if ((p[i].type & CKF_ARRAY_ATTRIBUTE) && p[i].pValue != NULL) {
			if (depth > 0 || p[i].ulValueLen % sizeof(CK_ATTRIBUTE) != 0) {
				m->local = CKR_ATTRIBUTE_VALUE_INVALID;
				return;
			}
			put64(m, 2);
			put_attrs(m, p[i].pValue, p[i].ulValueLen / sizeof(CK_ATTRIBUTE), depth + 1);
			continue;
		}
		put64(m, p[i].pValue != NULL);
		put64(m, p[i].ulValueLen);
		if (p[i].pValue != NULL)
			putbytes(m, p[i].pValue, p[i].ulValueLen);
	}
}

void hap_put_tmpl(struct hap_msg *m, CK_ATTRIBUTE_PTR p, CK_ULONG n)
{
	put_attrs(m, p, n, 0);
}

void hap_put_tmplout(struct hap_msg *m, CK_ATTRIBUTE_PTR p, CK_ULONG n)
{
	put64(m, p != NULL);
	put64(m, n);
	if (p == NULL)
		return;
	if (n > HAP_MAX_ATTRS) {
		m->local = CKR_ARGUMENTS_BAD;
		return;
	}
	for (CK_ULONG i = 0; i < n; i++) {
		/* An attribute array is asked for by its length only: its
		 * values would be pointers into the helper (see hap_get_tmplout). */
		int array = (p[i].type & CKF_ARRAY_ATTRIBUTE) != 0;
		put64(m, p[i].type);
		put64(m, p[i].pValue != NULL && !array);
		put64(m, p[i].ulValueLen);
	}
}

/* The lengths an output carries back with these codes (the PKCS#11
 * length convention). */
static int sized(CK_RV rv)
{
	return rv == CKR_OK || rv == CKR_BUFFER_TOO_SMALL;
}

void hap_get_out(struct hap_msg *m, CK_RV rv, CK_BYTE_PTR p, CK_ULONG_PTR n)
{
	uint64_t len = get64(m), has = get64(m);
	const unsigned char *b = has ? getbytes(m, len) : NULL;
	if (m->bad || n == NULL)
		return;
	if (b != NULL && p != NULL && rv == CKR_OK) {
		if (len > *n) {
			m->bad = 1;
			return;
		}
		memcpy(p, b, len);
	}
	if (sized(rv))
		*n = len;
}

void hap_get_list(struct hap_msg *m, CK_RV rv, CK_ULONG_PTR p, CK_ULONG_PTR n)
{
	uint64_t count = get64(m), has = get64(m);
	const unsigned char *b = has ? getbytes(m, count * sizeof(CK_ULONG)) : NULL;
	if (m->bad || n == NULL)
		return;
	if (b != NULL && p != NULL && rv == CKR_OK) {
		if (count > *n || count > HAP_MAX_LIST) {
			m->bad = 1;
			return;
		}
		memcpy(p, b, count * sizeof(CK_ULONG));
	}
	if (sized(rv))
		*n = count;
}

void hap_get_listmax(struct hap_msg *m, CK_RV rv, CK_ULONG_PTR p, CK_ULONG max, CK_ULONG_PTR n)
{
	uint64_t count = get64(m), has = get64(m);
	const unsigned char *b = has ? getbytes(m, count * sizeof(CK_ULONG)) : NULL;
	if (m->bad || rv != CKR_OK || n == NULL)
		return;
	if (count > max || (count > 0 && (b == NULL || p == NULL))) {
		m->bad = 1;
		return;
	}
	if (count > 0)
		memcpy(p, b, count * sizeof(CK_ULONG));
	*n = count;
}

void hap_get_ulongout(struct hap_msg *m, CK_RV rv, CK_ULONG_PTR p)
{
	uint64_t v = get64(m);
	if (!m->bad && rv == CKR_OK && p != NULL)
		*p = v;
}

void hap_get_structout(struct hap_msg *m, CK_RV rv, void *p, size_t size)
{
	const unsigned char *b = getbytes(m, size);
	if (!m->bad && rv == CKR_OK && p != NULL)
		memcpy(p, b, size);
}

void hap_get_tmplout(struct hap_msg *m, CK_RV rv, CK_ATTRIBUTE_PTR p, CK_ULONG n)
{
	int lengths = rv == CKR_OK || rv == CKR_ATTRIBUTE_SENSITIVE || rv == CKR_ATTRIBUTE_TYPE_INVALID ||
		      rv == CKR_BUFFER_TOO_SMALL;
	for (CK_ULONG i = 0; p != NULL && i < n && !m->bad; i++) {
		uint64_t len = get64(m), has = get64(m);
		const unsigned char *b = has ? getbytes(m, len) : NULL;
		if (m->bad || !lengths)
			continue;
		if ((p[i].type & CKF_ARRAY_ATTRIBUTE) && p[i].pValue != NULL) {
			p[i].ulValueLen = CK_UNAVAILABLE_INFORMATION;
			m->fix = CKR_ATTRIBUTE_TYPE_INVALID;
			continue;
		}
		if (b != NULL && p[i].pValue != NULL) {
			if (len > p[i].ulValueLen) {
				m->bad = 1;
				return;
			}
			memcpy(p[i].pValue, b, len);
		}
		p[i].ulValueLen = (CK_ULONG)len;
	}
}

/* ---- argument kinds, helper side ---- */

static uint64_t take64(struct hap_req *r)
{
	uint64_t v = 0;
	if (r->pos + 8 > r->inlen) {
		r->bad = 1;
		return 0;
	}
	memcpy(&v, r->in + r->pos, 8);
	r->pos += 8;
	return v;
}

/* alloc returns n zeroed bytes freed after the reply, or NULL (and the
 * request is bad) when n breaks the frame bound. */
static void *alloc(struct hap_req *r, size_t n)
{
	if (n > HAP_MAX_FRAME) {
		r->bad = 1;
		return NULL;
	}
	if (r->nallocs == r->capallocs) {
		size_t cap = r->capallocs ? 2 * r->capallocs : 16;
		void **a = realloc(r->allocs, cap * sizeof *a);
		if (a == NULL) {
			r->bad = 1;
			return NULL;
		}
		r->allocs = a;
		r->capallocs = cap;
	}
	void *p = calloc(1, n ? n : 1);
	if (p == NULL) {
		r->bad = 1;
		return NULL;
	}
	r->allocs[r->nallocs++] = p;
	return p;
}

static void *takebytes(struct hap_req *r, size_t n)
{
	if (n > r->inlen - r->pos) {
		r->bad = 1;
		return NULL;
	}
	void *p = alloc(r, n);
	if (p != NULL)
		memcpy(p, r->in + r->pos, n);
	r->pos += n;
	return p;
}

CK_ULONG hap_take_ulong(struct hap_req *r)
{
	return (CK_ULONG)take64(r);
}

void hap_take_in(struct hap_req *r, void *p, CK_ULONG *n)
{
	uint64_t has = take64(r);
	*n = (CK_ULONG)take64(r);
	*(void **)p = has ? takebytes(r, *n) : NULL;
}

/* room is the buffer the helper lends an output: what the application
 * has, up to the frame bound. */
static CK_ULONG room(uint64_t cap, size_t elem)
{
	uint64_t max = HAP_MAX_FRAME / elem;
	return (CK_ULONG)(cap < max ? cap : max);
}

void hap_take_out(struct hap_req *r, void *p, CK_ULONG_PTR *n)
{
	uint64_t flags = take64(r), cap = room(take64(r), 1);
	*n = (flags & 2) ? alloc(r, sizeof(CK_ULONG)) : NULL;
	if (*n != NULL)
		**n = cap;
	*(void **)p = (flags & 1) ? alloc(r, cap) : NULL;
}

void hap_take_label(struct hap_req *r, void *p)
{
	*(void **)p = take64(r) ? takebytes(r, 32) : NULL;
}

void hap_take_list(struct hap_req *r, void *p, CK_ULONG_PTR *n)
{
	uint64_t flags = take64(r), cap = room(take64(r), sizeof(CK_ULONG));
	if (cap > HAP_MAX_LIST)
		cap = HAP_MAX_LIST;
	*n = (flags & 2) ? alloc(r, sizeof(CK_ULONG)) : NULL;
	if (*n != NULL)
		**n = cap;
	*(void **)p = (flags & 1) ? alloc(r, cap * sizeof(CK_ULONG)) : NULL;
}

void hap_take_listmax(struct hap_req *r, void *p, CK_ULONG *max, CK_ULONG_PTR *n)
{
	uint64_t flags = take64(r), cap = take64(r);
	if (cap > HAP_MAX_LIST)
		cap = HAP_MAX_LIST;
	*max = (CK_ULONG)cap;
	*n = (flags & 2) ? alloc(r, sizeof(CK_ULONG)) : NULL;
	*(void **)p = (flags & 1) ? alloc(r, cap * sizeof(CK_ULONG)) : NULL;
}

void hap_take_ulongout(struct hap_req *r, void *p)
{
	*(void **)p = take64(r) ? alloc(r, sizeof(CK_ULONG)) : NULL;
}

void hap_take_structout(struct hap_req *r, void *p, size_t size)
{
	*(void **)p = take64(r) ? alloc(r, size) : NULL;
}

void hap_take_mech(struct hap_req *r, CK_MECHANISM_PTR *p)
{
	*p = NULL;
	if (!take64(r))
		return;
	CK_MECHANISM_PTR mech = alloc(r, sizeof *mech);
	if (mech == NULL)
		return;
	mech->mechanism = (CK_MECHANISM_TYPE)take64(r);
	hap_take_in(r, &mech->pParameter, &mech->ulParameterLen);
	if (mech->pParameter != NULL && mech->ulParameterLen > 0 && pointer_param(mech->mechanism))
		r->bad = 1;
	*p = mech;
}

static void take_attrs(struct hap_req *r, CK_ATTRIBUTE_PTR *p, CK_ULONG *n, int depth)
{
	uint64_t has = take64(r), count = take64(r);
	*p = NULL;
	*n = (CK_ULONG)count;
	if (!has)
		return;
	if (count > HAP_MAX_ATTRS) {
		r->bad = 1;
		return;
	}
	CK_ATTRIBUTE_PTR a = alloc(r, count * sizeof *a);
	for (uint64_t i = 0; a != NULL && i < count && !r->bad; i++) {
		a[i].type = (CK_ATTRIBUTE_TYPE)take64(r);
		uint64_t form = take64(r);
		if (form == 2 && depth == 0) {
			CK_ATTRIBUTE_PTR inner;
			CK_ULONG k;
			take_attrs(r, &inner, &k, 1);
			a[i].pValue = inner;
			a[i].ulValueLen = k * sizeof(CK_ATTRIBUTE);
			continue;
		}
		if (form > 1) {
			r->bad = 1;
			return;
		}
		a[i].ulValueLen = (CK_ULONG)take64(r);
		a[i].pValue = form ? takebytes(r, a[i].ulValueLen) : NULL;
	}
	*p = a;
}

void hap_take_tmpl(struct hap_req *r, CK_ATTRIBUTE_PTR *p, CK_ULONG *n)
{
	take_attrs(r, p, n, 0);
}

void hap_take_tmplout(struct hap_req *r, CK_ATTRIBUTE_PTR *p, CK_ULONG *n)
{
	uint64_t has = take64(r), count = take64(r);
	*p = NULL;
	*n = (CK_ULONG)count;
	if (!has)
		return;
	if (count > HAP_MAX_ATTRS) {
		r->bad = 1;
		return;
	}
	CK_ATTRIBUTE_PTR a = alloc(r, count * sizeof *a);
	size_t total = 0;
	for (uint64_t i = 0; a != NULL && i < count && !r->bad; i++) {
		a[i].type = (CK_ATTRIBUTE_TYPE)take64(r);
		uint64_t want = take64(r);
		a[i].ulValueLen = room(take64(r), 1);
		total += a[i].ulValueLen;
		if (total > HAP_MAX_FRAME)
			r->bad = 1;
		a[i].pValue = want && !r->bad ? alloc(r, a[i].ulValueLen) : NULL;
	}
	*p = a;
}

static void reply64(struct hap_req *r, uint64_t v)
{
	put64(&r->out, v);
}

void hap_reply_rv(struct hap_req *r, CK_RV rv)
{
	reply64(r, rv);
}

void hap_reply_out(struct hap_req *r, CK_RV rv, CK_BYTE_PTR p, CK_ULONG_PTR n)
{
	uint64_t len = n != NULL ? *n : 0;
	int has = rv == CKR_OK && p != NULL && n != NULL;
	reply64(r, len);
	reply64(r, has);
	if (has)
		putbytes(&r->out, p, len);
}

void hap_reply_list(struct hap_req *r, CK_RV rv, CK_ULONG_PTR p, CK_ULONG_PTR n)
{
	uint64_t count = n != NULL ? *n : 0;
	int has = rv == CKR_OK && p != NULL && n != NULL;
	reply64(r, count);
	reply64(r, has);
	if (has)
		putbytes(&r->out, p, count * sizeof(CK_ULONG));
}

void hap_reply_listmax(struct hap_req *r, CK_RV rv, CK_ULONG_PTR p, CK_ULONG max, CK_ULONG_PTR n)
{
	uint64_t count = n != NULL && rv == CKR_OK ? *n : 0;
	if (count > max)
		count = max;
	reply64(r, count);
	reply64(r, p != NULL);
	if (p != NULL)
		putbytes(&r->out, p, count * sizeof(CK_ULONG));
}

void hap_reply_ulongout(struct hap_req *r, CK_RV rv, CK_ULONG_PTR p)
{
	reply64(r, rv == CKR_OK && p != NULL ? *p : 0);
}

void hap_reply_structout(struct hap_req *r, CK_RV rv, void *p, size_t size)
{
	static const unsigned char zero[512];
	(void)rv;
	putbytes(&r->out, p != NULL ? p : (const void *)zero, size);
}

void hap_reply_tmplout(struct hap_req *r, CK_RV rv, CK_ATTRIBUTE_PTR p, CK_ULONG n)
{
	(void)rv;
	for (CK_ULONG i = 0; p != NULL && i < n; i++) {
		uint64_t len = p[i].ulValueLen;
		int has = p[i].pValue != NULL && len != CK_UNAVAILABLE_INFORMATION;
		reply64(r, len);
		reply64(r, has);
		if (has)
			putbytes(&r->out, p[i].pValue, len);
	}
}

/* ---- the helper's loop ---- */

/* hap_helper_serve is the helper's main (hapkcs11-helper calls it): it
 * runs the engine in this fresh process, says so on fd, then serves the
 * requests of its one client until the client closes the socket. */
int hap_helper_serve(int fd)
{
	CK_C_INITIALIZE_ARGS args = {0};
	args.flags = CKF_OS_LOCKING_OK;
	hap_serving = 1;
	CK_RV rv = C_Initialize(&args);

	struct hap_msg w = {0};
	w.len = 4;
	put64(&w, HAP_MAGIC);
	put64(&w, HAP_VERSION);
	put64(&w, rv);
	put64(&w, rv == CKR_OK ? hapCallBoundMillis() : 0);
	int sent = w.local == CKR_OK && send_frame(fd, &w) == 0;
	free(w.b);
	if (rv != CKR_OK || !sent)
		return 1;

	struct hap_msg in = {0};
	while (recv_frame(fd, &in) == 0) {
		struct hap_req r = {0};
		r.in = in.b + in.pos;
		r.inlen = in.len - in.pos;
		r.op = take64(&r);
		r.out.len = 4;
		hap_dispatch(&r);
		for (size_t i = 0; i < r.nallocs; i++)
			free(r.allocs[i]);
		free(r.allocs);
		int ok = r.out.local == CKR_OK && send_frame(fd, &r.out) == 0;
		free(r.out.b);
		if (!ok)
			break;
	}
	free(in.b);
	C_Finalize(NULL);
	return 0;
}
