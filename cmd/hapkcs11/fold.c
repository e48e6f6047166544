/*
 * fold.c — a proven Init rides with its call. See docs/DESIGN.md,
 * "Processes that fork: the helper", for why it answers as the engine does.
 *
 * Through a helper every call is a round trip, and a single-part
 * operation (C_SignInit, C_Sign) is two. The client keeps, per session,
 * the last Init the helper answered CKR_OK. The same Init again on that
 * session, with its operation ended and nothing since that could change
 * the answer (the epoch: every call that may change objects, logins or
 * sessions moves it, before it is sent and after it returns), is not sent
 * then: it is answered CKR_OK and sent in front of its call, one request
 * (HAP_OP_FOLD), which the helper runs as the two calls. Any other call on
 * that session first sends the Init alone, so the helper sees every call
 * in the application's order. The engine does the same with an Init a
 * member has proven (pkg/group, opstate.Proofs): it answers it and
 * places it with the call.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hapkcs11.h"
#include "rpc.h"

/* Sessions whose last Init is kept; more sessions than this are served
 * without folding. */
#define HAP_FOLD_SESSIONS 128

struct fold {
	CK_SESSION_HANDLE session; /* 0: a free entry */
	uint64_t call;             /* the op of the Init's single-part call */
	uint64_t epoch;            /* when the Init was answered */
	int active;                /* its operation has not ended */
	int pending;               /* answered here, not sent yet */
	unsigned char *init;       /* the Init's request: op and arguments */
	size_t len;
};

static pthread_mutex_t fold_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fold folds[HAP_FOLD_SESSIONS];
static uint64_t fold_epoch;

static struct fold *find(CK_SESSION_HANDLE s)
{
	for (int i = 0; i < HAP_FOLD_SESSIONS; i++)
		if (folds[i].session == s)
			return &folds[i];
	return NULL;
}

static void drop(struct fold *f)
{
	free(f->init);
	memset(f, 0, sizeof *f);
}

void hap_fold_changed(void)
{
	pthread_mutex_lock(&fold_mu);
	fold_epoch++;
	pthread_mutex_unlock(&fold_mu);
}

void hap_fold_reset(void)
{
	pthread_mutex_lock(&fold_mu);
	for (int i = 0; i < HAP_FOLD_SESSIONS; i++)
		drop(&folds[i]);
	fold_epoch++;
	pthread_mutex_unlock(&fold_mu);
}

void hap_fold_forget(void)
{
	/* A fork child: one thread, whatever the parent's threads held; the
	 * parent's kept requests are left, not freed (async-signal-safe). */
	fold_mu = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
	memset(folds, 0, sizeof folds);
}

/* send_init sends a kept Init alone and returns its answer. */
static CK_RV send_init(unsigned char *init, size_t len)
{
	struct hap_msg m;
	memset(&m, 0, sizeof m);
	m.len = 4;
	hap_putbytes(&m, init, len);
	free(init);
	CK_RV rv = hap_call(&m);
	return hap_msg_end(&m, rv);
}

CK_RV hap_fold_flush(CK_SESSION_HANDLE s)
{
	pthread_mutex_lock(&fold_mu);
	struct fold *f = find(s);
	unsigned char *init = NULL;
	size_t len = 0;
	if (f != NULL && f->pending) {
		init = f->init, len = f->len;
		f->init = NULL;
	}
	if (f != NULL)
		drop(f);
	pthread_mutex_unlock(&fold_mu);
	return init == NULL ? CKR_OK : send_init(init, len);
}

CK_RV hap_fold_init(struct hap_msg *m, CK_SESSION_HANDLE s, uint64_t call)
{
	if (m->local != CKR_OK)
		return m->local;
	const unsigned char *req = m->b + 4;
	size_t len = m->len - 4;
	pthread_mutex_lock(&fold_mu);
	struct fold *f = find(s);
	if (f != NULL && !f->active && f->epoch == fold_epoch && f->call == call &&
	    f->len == len && memcmp(f->init, req, len) == 0) {
		f->active = f->pending = 1;
		pthread_mutex_unlock(&fold_mu);
		return CKR_OK;
	}
	uint64_t epoch = fold_epoch;
	pthread_mutex_unlock(&fold_mu);

	CK_RV held = hap_fold_flush(s);
	if (held != CKR_OK)
		return held;
	unsigned char *keep = malloc(len);
	if (keep != NULL)
		memcpy(keep, req, len);
	CK_RV rv = hap_call(m);
	pthread_mutex_lock(&fold_mu);
	if ((f = find(s)) == NULL && rv == CKR_OK && keep != NULL)
		f = find(0);
	if (f != NULL)
		drop(f);
	if (f != NULL && rv == CKR_OK && keep != NULL) {
		*f = (struct fold){.session = s, .call = call, .epoch = epoch, .active = 1, .init = keep, .len = len};
		keep = NULL;
	}
	pthread_mutex_unlock(&fold_mu);
	free(keep);
	return rv;
}

CK_RV hap_fold_call(struct hap_msg *m, CK_SESSION_HANDLE s, uint64_t call, int ends)
{
	if (m->local != CKR_OK)
		return m->local; /* not sent: the operation stands, as without folding */
	struct hap_msg both = {0};
	unsigned char *alone = NULL;
	size_t len = 0;
	pthread_mutex_lock(&fold_mu);
	struct fold *f = find(s);
	if (f != NULL && f->pending && f->call == call) {
		/* The Init stays kept: only its pending send is taken. */
		hap_msg_start(&both, HAP_OP_FOLD);
		hap_put64(&both, f->len);
		hap_putbytes(&both, f->init, f->len);
		hap_putbytes(&both, m->b + 4, m->len - 4);
		f->pending = 0;
	} else if (f != NULL && f->pending) { /* another operation's call */
		alone = f->init, len = f->len;
		f->init = NULL;
		drop(f);
	}
	pthread_mutex_unlock(&fold_mu);

	if (alone != NULL) {
		CK_RV held = send_init(alone, len);
		if (held != CKR_OK)
			return held;
	}
	if (both.b != NULL) {
		free(m->b);
		*m = both;
	}
	CK_RV rv = hap_call(m);

	pthread_mutex_lock(&fold_mu);
	if ((f = find(s)) != NULL && f->call == call) {
		/* PKCS#11 5.2: the call ends the operation unless it returned
		 * CKR_BUFFER_TOO_SMALL or told a length. An answer other than
		 * those and CKR_OK keeps nothing: the Init is sent again. */
		if (rv == CKR_BUFFER_TOO_SMALL || (rv == CKR_OK && !ends))
			f->active = 1;
		else if (rv == CKR_OK)
			f->active = 0;
		else
			drop(f);
	}
	pthread_mutex_unlock(&fold_mu);
	return rv;
}

/* ---- the helper ---- */

void hap_serve_fold(struct hap_req *r)
{
	CK_ULONG len = hap_take_ulong(r);
	if (r->bad || len > r->inlen - r->pos) {
		hap_reply_rv(r, CKR_ARGUMENTS_BAD);
		return;
	}
	struct hap_req init = {0};
	init.in = r->in + r->pos;
	init.inlen = len;
	init.op = hap_take_op(&init);
	init.out.len = 4;
	hap_dispatch(&init);
	CK_RV rv = CKR_DEVICE_ERROR;
	if (init.out.local == CKR_OK && init.out.len >= 12)
		memcpy(&rv, init.out.b + 4, 8);
	hap_req_free(&init);
	free(init.out.b);
	r->pos += len;
	r->op = hap_take_op(r);
	r->preset = rv;
	hap_dispatch(r);
}
