/*
 * rpc.c — the marshalling of each argument kind between the C client in
 * an application's process and the helper (the per-function code is
 * generated from pkcs11f.h: rpc_gen.c; the process and its connections
 * are conn.c). See docs/DESIGN.md, "Processes that fork: the helper".
 */
#include <stdlib.h>
#include <string.h>

#include "hapkcs11.h"
#include "rpc.h"

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

void hap_put64(struct hap_msg *m, uint64_t v)
{
	grow(m, 8);
	if (m->local == CKR_HOST_MEMORY)
		return;
	memcpy(m->b + m->len, &v, 8);
	m->len += 8;
}

void hap_putbytes(struct hap_msg *m, const void *p, size_t n)
{
	if (n > HAP_MAX_FRAME || m->len + n > HAP_MAX_FRAME) {
		m->local = CKR_ARGUMENTS_BAD;
		return;
	}
	grow(m, n);
	if (m->local == CKR_HOST_MEMORY || n == 0)
		return;
	memcpy(m->b + m->len, p, n);
	m->len += n;
}

uint64_t hap_get64(struct hap_msg *m)
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

const unsigned char *hap_getbytes(struct hap_msg *m, size_t n)
{
	if (n > m->len - m->pos) {
		m->bad = 1;
		return NULL;
	}
	const unsigned char *p = m->b + m->pos;
	m->pos += n;
	return p;
}

void hap_msg_start(struct hap_msg *m, uint64_t op)
{
	memset(m, 0, sizeof *m);
	grow(m, 256);
	m->len = 4; /* the frame's length */
	hap_put64(m, op);
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
	hap_put64(m, v);
}

void hap_put_in(struct hap_msg *m, CK_BYTE_PTR p, CK_ULONG n)
{
	hap_put64(m, p != NULL);
	hap_put64(m, n);
	if (p != NULL)
		hap_putbytes(m, p, n);
}

void hap_put_out(struct hap_msg *m, CK_BYTE_PTR p, CK_ULONG_PTR n)
{
	hap_put64(m, (p != NULL) | (n != NULL) << 1);
	hap_put64(m, n != NULL ? *n : 0);
}

void hap_put_label(struct hap_msg *m, CK_UTF8CHAR_PTR p)
{
	hap_put64(m, p != NULL);
	if (p != NULL)
		hap_putbytes(m, p, 32);
}

void hap_put_list(struct hap_msg *m, CK_ULONG_PTR p, CK_ULONG_PTR n)
{
	hap_put_out(m, (CK_BYTE_PTR)p, n);
}

void hap_put_listmax(struct hap_msg *m, CK_ULONG_PTR p, CK_ULONG max, CK_ULONG_PTR n)
{
	hap_put64(m, (p != NULL) | (n != NULL) << 1);
	hap_put64(m, max);
}

void hap_put_ulongout(struct hap_msg *m, CK_ULONG_PTR p)
{
	hap_put64(m, p != NULL);
}

void hap_put_structout(struct hap_msg *m, void *p, size_t size)
{
	(void)size;
	hap_put64(m, p != NULL);
}

/* How a mechanism's parameter crosses: as its bytes (a flat parameter),
 * as a structure whose pointers each cross as what they point at
 * (rpc_params.c says which mechanisms and where the pointers are), or, for
 * such a structure given with a length that is not its size, as that
 * length alone: the helper hands the member zeroes of that length, so the
 * member answers the wrong length as it would in process, and nothing is
 * read behind a length that may lie. */
enum { PARAM_BYTES, PARAM_STRUCT, PARAM_LENGTH };

static void put_struct(struct hap_msg *m, const struct hap_param *d, const unsigned char *s)
{
	hap_putbytes(m, s, d->size);
	for (size_t i = 0; i < d->nptrs && m->local == CKR_OK; i++) {
		const struct hap_ptr *f = &d->ptrs[i];
		void *p;
		memcpy(&p, s + f->at, sizeof p);
		if (f->to != NULL) {
			hap_put64(m, p != NULL);
			if (p != NULL)
				put_struct(m, f->to, p);
			continue;
		}
		CK_ULONG n;
		memcpy(&n, s + f->len, sizeof n);
		hap_put_in(m, p, n);
	}
}

void hap_put_mech(struct hap_msg *m, CK_MECHANISM_PTR p)
{
	hap_put64(m, p != NULL);
	if (p == NULL)
		return;
	const struct hap_param *d = p->pParameter != NULL ? hap_mech_param(p->mechanism) : NULL;
	hap_put64(m, p->mechanism);
	if (d == &hap_param_refused) {
		m->local = CKR_MECHANISM_PARAM_INVALID;
	} else if (d == NULL) {
		hap_put64(m, PARAM_BYTES);
		hap_put_in(m, p->pParameter, p->ulParameterLen);
	} else if (p->ulParameterLen != d->size) {
		hap_put64(m, PARAM_LENGTH);
		hap_put64(m, p->ulParameterLen);
	} else {
		hap_put64(m, PARAM_STRUCT);
		put_struct(m, d, p->pParameter);
	}
}

static void put_attrs(struct hap_msg *m, CK_ATTRIBUTE_PTR p, CK_ULONG n, int depth)
{
	hap_put64(m, p != NULL);
	hap_put64(m, n);
	if (p == NULL)
		return;
	if (n > HAP_MAX_ATTRS) {
		m->local = CKR_ARGUMENTS_BAD;
		return;
	}
	for (CK_ULONG i = 0; i < n && m->local == CKR_OK; i++) {
		hap_put64(m, p[i].type);
		if ((p[i].type & CKF_ARRAY_ATTRIBUTE) && p[i].pValue != NULL) {
			if (depth > 0 || p[i].ulValueLen % sizeof(CK_ATTRIBUTE) != 0) {
				m->local = CKR_ATTRIBUTE_VALUE_INVALID;
				return;
			}
			hap_put64(m, 2);
			put_attrs(m, p[i].pValue, p[i].ulValueLen / sizeof(CK_ATTRIBUTE), depth + 1);
			continue;
		}
		hap_put64(m, p[i].pValue != NULL);
		hap_put64(m, p[i].ulValueLen);
		if (p[i].pValue != NULL)
			hap_putbytes(m, p[i].pValue, p[i].ulValueLen);
	}
}

void hap_put_tmpl(struct hap_msg *m, CK_ATTRIBUTE_PTR p, CK_ULONG n)
{
	put_attrs(m, p, n, 0);
}

void hap_put_tmplout(struct hap_msg *m, CK_ATTRIBUTE_PTR p, CK_ULONG n)
{
	hap_put64(m, p != NULL);
	hap_put64(m, n);
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
		hap_put64(m, p[i].type);
		hap_put64(m, p[i].pValue != NULL && !array);
		hap_put64(m, p[i].ulValueLen);
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
	uint64_t len = hap_get64(m), has = hap_get64(m);
	const unsigned char *b = has ? hap_getbytes(m, len) : NULL;
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
	uint64_t count = hap_get64(m), has = hap_get64(m);
	const unsigned char *b = has ? hap_getbytes(m, count * sizeof(CK_ULONG)) : NULL;
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
	uint64_t count = hap_get64(m), has = hap_get64(m);
	const unsigned char *b = has ? hap_getbytes(m, count * sizeof(CK_ULONG)) : NULL;
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
	uint64_t v = hap_get64(m);
	if (!m->bad && rv == CKR_OK && p != NULL)
		*p = v;
}

void hap_get_structout(struct hap_msg *m, CK_RV rv, void *p, size_t size)
{
	const unsigned char *b = hap_getbytes(m, size);
	if (!m->bad && rv == CKR_OK && p != NULL)
		memcpy(p, b, size);
}

void hap_get_tmplout(struct hap_msg *m, CK_RV rv, CK_ATTRIBUTE_PTR p, CK_ULONG n)
{
	int lengths = rv == CKR_OK || rv == CKR_ATTRIBUTE_SENSITIVE || rv == CKR_ATTRIBUTE_TYPE_INVALID ||
		      rv == CKR_BUFFER_TOO_SMALL;
	for (CK_ULONG i = 0; p != NULL && i < n && !m->bad; i++) {
		uint64_t len = hap_get64(m), has = hap_get64(m);
		const unsigned char *b = has ? hap_getbytes(m, len) : NULL;
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

/* take_struct rebuilds a parameter structure of layout d: its bytes, then
 * each pointer to what crossed for it, with its length field set to the
 * length that crossed (never the one in the structure's bytes). */
static void *take_struct(struct hap_req *r, const struct hap_param *d)
{
	unsigned char *s = takebytes(r, d->size);
	if (s == NULL)
		return NULL;
	for (size_t i = 0; i < d->nptrs; i++)
		memset(s + d->ptrs[i].at, 0, sizeof(void *));
	for (size_t i = 0; i < d->nptrs && !r->bad; i++) {
		const struct hap_ptr *f = &d->ptrs[i];
		void *p = NULL;
		if (f->to != NULL) {
			if (take64(r))
				p = take_struct(r, f->to);
		} else {
			CK_ULONG n;
			hap_take_in(r, &p, &n);
			memcpy(s + f->len, &n, sizeof n);
		}
		memcpy(s + f->at, &p, sizeof p);
	}
	return s;
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
	const struct hap_param *d = hap_mech_param(mech->mechanism);
	int real = d != NULL && d != &hap_param_refused;
	switch (take64(r)) {
	case PARAM_BYTES:
		hap_take_in(r, &mech->pParameter, &mech->ulParameterLen);
		/* Raw bytes of a structure with pointers point nowhere here. */
		if (mech->pParameter != NULL && d != NULL)
			r->bad = 1;
		break;
	case PARAM_STRUCT:
		if (!real) {
			r->bad = 1;
			break;
		}
		mech->pParameter = take_struct(r, d);
		mech->ulParameterLen = d->size;
		break;
	case PARAM_LENGTH:
		mech->ulParameterLen = (CK_ULONG)take64(r);
		if (!real || mech->ulParameterLen == d->size) {
			r->bad = 1;
			break;
		}
		mech->pParameter = alloc(r, mech->ulParameterLen);
		break;
	default:
		r->bad = 1;
	}
	*p = mech;
}

/* take_template_head reads a template's presence and count into *p (NULL)
 * and *n, and returns room for its attributes: NULL when there is none
 * (no template, too many attributes, or no memory: r->bad says which). */
static CK_ATTRIBUTE_PTR take_template_head(struct hap_req *r, CK_ATTRIBUTE_PTR *p, CK_ULONG *n, uint64_t *count)
{
	uint64_t has = take64(r);
	*count = take64(r);
	*p = NULL;
	*n = (CK_ULONG)*count;
	if (!has)
		return NULL;
	if (*count > HAP_MAX_ATTRS) {
		r->bad = 1;
		return NULL;
	}
	return alloc(r, *count * sizeof(CK_ATTRIBUTE));
}

static void take_attrs(struct hap_req *r, CK_ATTRIBUTE_PTR *p, CK_ULONG *n, int depth)
{
	uint64_t count;
	CK_ATTRIBUTE_PTR a = take_template_head(r, p, n, &count);
	if (a == NULL)
		return;
	for (uint64_t i = 0; i < count && !r->bad; i++) {
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
	uint64_t count;
	CK_ATTRIBUTE_PTR a = take_template_head(r, p, n, &count);
	if (a == NULL)
		return;
	size_t total = 0;
	for (uint64_t i = 0; i < count && !r->bad; i++) {
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

uint64_t hap_take_op(struct hap_req *r)
{
	return take64(r);
}

void hap_req_free(struct hap_req *r)
{
	for (size_t i = 0; i < r->nallocs; i++)
		free(r->allocs[i]);
	free(r->allocs);
	r->allocs = NULL;
	r->nallocs = r->capallocs = 0;
}

static void reply64(struct hap_req *r, uint64_t v)
{
	hap_put64(&r->out, v);
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
		hap_putbytes(&r->out, p, len);
}

void hap_reply_list(struct hap_req *r, CK_RV rv, CK_ULONG_PTR p, CK_ULONG_PTR n)
{
	uint64_t count = n != NULL ? *n : 0;
	int has = rv == CKR_OK && p != NULL && n != NULL;
	reply64(r, count);
	reply64(r, has);
	if (has)
		hap_putbytes(&r->out, p, count * sizeof(CK_ULONG));
}

void hap_reply_listmax(struct hap_req *r, CK_RV rv, CK_ULONG_PTR p, CK_ULONG max, CK_ULONG_PTR n)
{
	uint64_t count = n != NULL && rv == CKR_OK ? *n : 0;
	if (count > max)
		count = max;
	reply64(r, count);
	reply64(r, p != NULL);
	if (p != NULL)
		hap_putbytes(&r->out, p, count * sizeof(CK_ULONG));
}

void hap_reply_ulongout(struct hap_req *r, CK_RV rv, CK_ULONG_PTR p)
{
	reply64(r, rv == CKR_OK && p != NULL ? *p : 0);
}

void hap_reply_structout(struct hap_req *r, CK_RV rv, void *p, size_t size)
{
	static const unsigned char zero[512];
	(void)rv;
	hap_putbytes(&r->out, p != NULL ? p : (const void *)zero, size);
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
			hap_putbytes(&r->out, p[i].pValue, len);
	}
}

