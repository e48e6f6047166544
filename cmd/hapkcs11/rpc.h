/*
 * rpc.h — the helper's protocol: the marshalling (rpc.c) and the
 * connections (conn.c), shared by the C client in an application's
 * process and the helper.
 *
 * Frames on one socketpair: a 4-byte length (native order: both ends are
 * the same build of this library on the same host) and at most
 * HAP_MAX_FRAME bytes of 8-byte fields. The helper opens with a welcome
 * on its control connection (its C_Initialize's CKR code and how long a
 * call may take); on each call connection a request is an op (rpc_gen.h)
 * and its arguments, a reply the CKR code and the outputs, in the kinds
 * rpcgen assigns (rpcgen/main.go).
 */
#ifndef HAPKCS11_RPC_H
#define HAPKCS11_RPC_H

#include <stddef.h>
#include <stdint.h>

#include "rpc_gen.h"

/* Bounds, checked by whoever reads: as pkg/remote's. */
#define HAP_MAX_FRAME (16u << 20)
#define HAP_MAX_ATTRS 1024
#define HAP_MAX_LIST 65536

/* A mechanism parameter structure that holds pointers (rpc_params.c,
 * generated from pkcs11t.h): its size and its pointers, each to bytes
 * whose length is the CK_ULONG at offset len, or to one structure of
 * layout to. */
struct hap_ptr {
	size_t at, len;
	const struct hap_param *to;
};
struct hap_param {
	size_t size, nptrs;
	const struct hap_ptr *ptrs;
};
/* hap_mech_param is the layout of mechanism t's parameter: NULL when it
 * crosses as its bytes, &hap_param_refused when it holds a pointer that
 * cannot cross (an output the member writes, a nested mechanism). */
const struct hap_param *hap_mech_param(CK_MECHANISM_TYPE t);
extern const struct hap_param hap_param_refused;

/* A request being built and then its reply being read, in the client. */
struct hap_msg {
	unsigned char *b;
	size_t len, cap, pos;
	CK_RV local; /* set by a put: the call fails here, nothing is sent */
	CK_RV fix;   /* set by a get: the CKR code the application sees instead */
	int bad;     /* the reply ended early or broke a bound */
	int changes; /* the call may change objects, logins or sessions (fold.c) */
};

/* A request being served, and its reply, in the helper. */
struct hap_req {
	uint64_t op;
	const unsigned char *in;
	size_t inlen, pos;
	int bad;
	CK_RV preset; /* not CKR_OK: the answer, without calling (a folded Init's) */
	struct hap_msg out;
	void **allocs;
	size_t nallocs, capallocs;
};

/* Message buffers (rpc.c). */
void hap_put64(struct hap_msg *m, uint64_t v);
void hap_putbytes(struct hap_msg *m, const void *p, size_t n);
uint64_t hap_get64(struct hap_msg *m);
const unsigned char *hap_getbytes(struct hap_msg *m, size_t n);
uint64_t hap_take_op(struct hap_req *r);
/* hap_req_free releases what a request's arguments took. */
void hap_req_free(struct hap_req *r);

/* Client side (conn.c): is this process served by a helper. */
int hap_remote(void);
CK_RV hap_remote_initialize(void);
CK_RV hap_remote_finalize(void);
/* hap_save_env keeps the environment for a forked child's helper. */
void hap_save_env(void);
/* In a fork child: drop the parent's connection without a word to its
 * helper (async-signal-safe). */
void hap_remote_forget(void);

void hap_msg_start(struct hap_msg *m, uint64_t op);
CK_RV hap_call(struct hap_msg *m);
CK_RV hap_msg_end(struct hap_msg *m, CK_RV rv);

void hap_put_ulong(struct hap_msg *m, CK_ULONG v);
void hap_put_in(struct hap_msg *m, CK_BYTE_PTR p, CK_ULONG n);
void hap_put_out(struct hap_msg *m, CK_BYTE_PTR p, CK_ULONG_PTR n);
void hap_put_label(struct hap_msg *m, CK_UTF8CHAR_PTR p);
void hap_put_list(struct hap_msg *m, CK_ULONG_PTR p, CK_ULONG_PTR n);
void hap_put_listmax(struct hap_msg *m, CK_ULONG_PTR p, CK_ULONG max, CK_ULONG_PTR n);
void hap_put_ulongout(struct hap_msg *m, CK_ULONG_PTR p);
void hap_put_structout(struct hap_msg *m, void *p, size_t size);
void hap_put_mech(struct hap_msg *m, CK_MECHANISM_PTR p);
void hap_put_tmpl(struct hap_msg *m, CK_ATTRIBUTE_PTR p, CK_ULONG n);
void hap_put_tmplout(struct hap_msg *m, CK_ATTRIBUTE_PTR p, CK_ULONG n);

void hap_get_out(struct hap_msg *m, CK_RV rv, CK_BYTE_PTR p, CK_ULONG_PTR n);
void hap_get_list(struct hap_msg *m, CK_RV rv, CK_ULONG_PTR p, CK_ULONG_PTR n);
void hap_get_listmax(struct hap_msg *m, CK_RV rv, CK_ULONG_PTR p, CK_ULONG max, CK_ULONG_PTR n);
void hap_get_ulongout(struct hap_msg *m, CK_RV rv, CK_ULONG_PTR p);
void hap_get_structout(struct hap_msg *m, CK_RV rv, void *p, size_t size);
void hap_get_tmplout(struct hap_msg *m, CK_RV rv, CK_ATTRIBUTE_PTR p, CK_ULONG n);

/* Helper side. */
CK_ULONG hap_take_ulong(struct hap_req *r);
void hap_take_in(struct hap_req *r, void *p, CK_ULONG *n);
void hap_take_out(struct hap_req *r, void *p, CK_ULONG_PTR *n);
void hap_take_label(struct hap_req *r, void *p);
void hap_take_list(struct hap_req *r, void *p, CK_ULONG_PTR *n);
void hap_take_listmax(struct hap_req *r, void *p, CK_ULONG *max, CK_ULONG_PTR *n);
void hap_take_ulongout(struct hap_req *r, void *p);
void hap_take_structout(struct hap_req *r, void *p, size_t size);
void hap_take_mech(struct hap_req *r, CK_MECHANISM_PTR *p);
void hap_take_tmpl(struct hap_req *r, CK_ATTRIBUTE_PTR *p, CK_ULONG *n);
void hap_take_tmplout(struct hap_req *r, CK_ATTRIBUTE_PTR *p, CK_ULONG *n);

void hap_reply_rv(struct hap_req *r, CK_RV rv);
void hap_reply_out(struct hap_req *r, CK_RV rv, CK_BYTE_PTR p, CK_ULONG_PTR n);
void hap_reply_list(struct hap_req *r, CK_RV rv, CK_ULONG_PTR p, CK_ULONG_PTR n);
void hap_reply_listmax(struct hap_req *r, CK_RV rv, CK_ULONG_PTR p, CK_ULONG max, CK_ULONG_PTR n);
void hap_reply_ulongout(struct hap_req *r, CK_RV rv, CK_ULONG_PTR p);
void hap_reply_structout(struct hap_req *r, CK_RV rv, void *p, size_t size);
void hap_reply_tmplout(struct hap_req *r, CK_RV rv, CK_ATTRIBUTE_PTR p, CK_ULONG n);

void hap_dispatch(struct hap_req *r);

/* A proven Init rides with its call (fold.c): HAP_OP_FOLD, the Init's
 * request's length, the Init's request, then the call's request; the
 * reply is the call's (its code the Init's, when that failed). */
#define HAP_OP_FOLD 0x10000u
CK_RV hap_fold_init(struct hap_msg *m, CK_SESSION_HANDLE s, uint64_t call);
CK_RV hap_fold_call(struct hap_msg *m, CK_SESSION_HANDLE s, uint64_t call, int ends);
CK_RV hap_fold_flush(CK_SESSION_HANDLE s);
void hap_fold_changed(void);
void hap_fold_reset(void);
void hap_fold_forget(void);
void hap_serve_fold(struct hap_req *r);

#endif
