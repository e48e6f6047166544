/*
 * paramwire.c — the helper's marshalling of mechanism parameters (rpc.c and
 * the generated rpc_params.c) as an attacker meets it, built with
 * AddressSanitizer: the parameters an application gives, sent by the
 * client's hap_put_mech and rebuilt by the helper's hap_take_mech, and the
 * same requests cut short at every byte and with every word replaced by
 * lying values. A read or write out of bounds on either side stops the
 * program (ASan); a rebuilt parameter must hold exactly what was sent, and
 * every byte pointer in it must have at least its length field's bytes
 * behind it (each is read whole).
 *
 *   paramwire      (prints "ok N requests", exit 0; or what failed)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hapkcs11.h"
#include "rpc.h"

static int failed;

#define FAIL(...)                                      \
	do {                                           \
		fprintf(stderr, "FAIL " __VA_ARGS__); \
		fprintf(stderr, "\n");                 \
		failed = 1;                            \
	} while (0)

/* send encodes mech as the client does; the frame's body in *body. */
static CK_RV send(CK_MECHANISM_PTR mech, unsigned char **body, size_t *len)
{
	struct hap_msg m;
	hap_msg_start(&m, 0);
	hap_put_mech(&m, mech);
	*len = m.len - 12; /* less the frame length and the op */
	*body = malloc(*len ? *len : 1);
	memcpy(*body, m.b + 12, *len);
	CK_RV local = m.local;
	free(m.b);
	return local;
}

/* touch reads every byte a rebuilt parameter's pointers claim (ASan stops
 * the program where one claims more than is behind it) and returns their
 * sum. */
static unsigned touch(const struct hap_param *d, const unsigned char *s)
{
	unsigned sum = 0;
	for (size_t i = 0; d != NULL && i < d->nptrs; i++) {
		const unsigned char *p;
		memcpy(&p, s + d->ptrs[i].at, sizeof p);
		if (p == NULL)
			continue;
		if (d->ptrs[i].to != NULL) {
			sum += touch(d->ptrs[i].to, p);
			continue;
		}
		CK_ULONG n;
		memcpy(&n, s + d->ptrs[i].len, sizeof n);
		for (CK_ULONG k = 0; k < n; k++)
			sum += p[k];
	}
	return sum;
}

static long requests;

/* take rebuilds a mechanism from body as the helper does: 1 when the
 * request is sound. Every pointer of a sound one is read whole. */
static int take(const unsigned char *body, size_t len, CK_MECHANISM_PTR *out, struct hap_req *r)
{
	memset(r, 0, sizeof *r);
	r->in = body;
	r->inlen = len;
	hap_take_mech(r, out);
	requests++;
	if (r->bad || r->pos != len || *out == NULL)
		return 0;
	const struct hap_param *d = hap_mech_param((*out)->mechanism);
	if (d != NULL && d != &hap_param_refused && (*out)->ulParameterLen == d->size)
		touch(d, (*out)->pParameter);
	else if ((*out)->pParameter != NULL)
		for (CK_ULONG k = 0; k < (*out)->ulParameterLen; k++)
			((volatile unsigned char *)(*out)->pParameter)[k];
	return 1;
}

/* same compares a sent parameter with its rebuilt copy: the bytes
 * between pointers, and what each pointer points at. */
static int same(const struct hap_param *d, const unsigned char *a, const unsigned char *b)
{
	unsigned char x[512], y[512];
	memcpy(x, a, d->size);
	memcpy(y, b, d->size);
	for (size_t i = 0; i < d->nptrs; i++) {
		const struct hap_ptr *f = &d->ptrs[i];
		const unsigned char *p, *q;
		memcpy(&p, a + f->at, sizeof p);
		memcpy(&q, b + f->at, sizeof q);
		memset(x + f->at, 0, sizeof p);
		memset(y + f->at, 0, sizeof q);
		if ((p == NULL) != (q == NULL))
			return 0;
		if (f->to != NULL) {
			if (p != NULL && !same(f->to, p, q))
				return 0;
			continue;
		}
		CK_ULONG n;
		memcpy(&n, a + f->len, sizeof n);
		if (p != NULL && memcmp(p, q, n) != 0)
			return 0;
	}
	return memcmp(x, y, d->size) == 0;
}

/* attack sends body cut at every length and with each word replaced by
 * lying values; none may read or write out of bounds, and a request cut
 * short is never sound. */
static void attack(const char *name, const unsigned char *body, size_t len)
{
	static const uint64_t lies[] = {0, 1, 2, 7, 8, 15, 16, 17, 255, 4096, 1u << 24, (1u << 24) + 1,
					(uint64_t)1 << 40, UINT64_MAX, UINT64_MAX - 7};
	CK_MECHANISM_PTR out;
	struct hap_req r;
	for (size_t cut = 0; cut < len; cut++) {
		unsigned char *b = malloc(cut ? cut : 1);
		memcpy(b, body, cut);
		if (take(b, cut, &out, &r))
			FAIL("%s: a request cut at %zu of %zu bytes was taken as sound", name, cut, len);
		hap_req_free(&r);
		free(b);
	}
	for (size_t w = 0; w + 8 <= len; w += 8)
		for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
			unsigned char *b = malloc(len);
			memcpy(b, body, len);
			memcpy(b + w, &lies[i], 8);
			take(b, len, &out, &r);
			hap_req_free(&r);
			free(b);
		}
}

/* roundtrip sends mech, rebuilds it, compares, then attacks its bytes. */
static void roundtrip(const char *name, CK_MECHANISM_PTR mech)
{
	unsigned char *body;
	size_t len;
	CK_RV local = send(mech, &body, &len);
	if (local != CKR_OK) {
		FAIL("%s: the client refused it (0x%lx)", name, (unsigned long)local);
		free(body);
		return;
	}
	CK_MECHANISM_PTR out;
	struct hap_req r;
	if (!take(body, len, &out, &r)) {
		FAIL("%s: the helper did not take what the client sent", name);
	} else {
		const struct hap_param *d = hap_mech_param(mech->mechanism);
		if (out->mechanism != mech->mechanism || out->ulParameterLen != mech->ulParameterLen ||
		    (d != NULL && !same(d, mech->pParameter, out->pParameter)) ||
		    (d == NULL && mech->ulParameterLen && memcmp(out->pParameter, mech->pParameter, mech->ulParameterLen)))
			FAIL("%s: the helper rebuilt another parameter", name);
	}
	hap_req_free(&r);
	attack(name, body, len);
	free(body);
}

static void *heaps[64];
static int nheaps;

/* heap copies n bytes to a buffer of exactly n (ASan sees its end). */
static void *heap(const void *p, size_t n)
{
	void *b = malloc(n);
	memcpy(b, p, n);
	heaps[nheaps++] = b;
	return b;
}

int main(void)
{
	CK_BYTE *nonce = heap("0123456789ab", 12), *aad = heap("header", 6), *data = heap("0123456789abcdef", 16);
	CK_BYTE *label = heap("label", 5), *rnd = heap("randomrandomrandomrandomrandom32", 32);

	CK_CCM_PARAMS *ccm = heap(&(CK_CCM_PARAMS){64, nonce, 12, aad, 6, 16}, sizeof(CK_CCM_PARAMS));
	roundtrip("CCM", &(CK_MECHANISM){CKM_AES_CCM, ccm, sizeof *ccm});
	CK_GCM_PARAMS *gcm = heap(&(CK_GCM_PARAMS){nonce, 12, 96, aad, 6, 128}, sizeof(CK_GCM_PARAMS));
	roundtrip("GCM", &(CK_MECHANISM){CKM_AES_GCM, gcm, sizeof *gcm});
	CK_KEY_DERIVATION_STRING_DATA *str = heap(&(CK_KEY_DERIVATION_STRING_DATA){data, 16}, sizeof *str);
	roundtrip("AES-ECB-ENCRYPT-DATA", &(CK_MECHANISM){CKM_AES_ECB_ENCRYPT_DATA, str, sizeof *str});
	roundtrip("CONCATENATE-DATA-AND-BASE", &(CK_MECHANISM){CKM_CONCATENATE_DATA_AND_BASE, str, sizeof *str});
	CK_AES_CBC_ENCRYPT_DATA_PARAMS cbcv = {{1, 2, 3}, data, 16};
	CK_AES_CBC_ENCRYPT_DATA_PARAMS *cbc = heap(&cbcv, sizeof cbcv);
	roundtrip("AES-CBC-ENCRYPT-DATA", &(CK_MECHANISM){CKM_AES_CBC_ENCRYPT_DATA, cbc, sizeof *cbc});
	CK_RSA_PKCS_OAEP_PARAMS *oaep = heap(&(CK_RSA_PKCS_OAEP_PARAMS){CKM_SHA256, CKG_MGF1_SHA256, CKZ_DATA_SPECIFIED, label, 5},
					     sizeof(CK_RSA_PKCS_OAEP_PARAMS));
	roundtrip("OAEP", &(CK_MECHANISM){CKM_RSA_PKCS_OAEP, oaep, sizeof *oaep});
	CK_RSA_AES_KEY_WRAP_PARAMS *wrap = heap(&(CK_RSA_AES_KEY_WRAP_PARAMS){256, oaep}, sizeof *wrap);
	roundtrip("RSA-AES-KEY-WRAP", &(CK_MECHANISM){CKM_RSA_AES_KEY_WRAP, wrap, sizeof *wrap});
	CK_RSA_AES_KEY_WRAP_PARAMS *nowrap = heap(&(CK_RSA_AES_KEY_WRAP_PARAMS){256, NULL}, sizeof *nowrap);
	roundtrip("RSA-AES-KEY-WRAP without OAEP", &(CK_MECHANISM){CKM_RSA_AES_KEY_WRAP, nowrap, sizeof *nowrap});
	CK_TLS_KDF_PARAMS kdfv = {CKM_SHA256, label, 5, {rnd, 32, rnd, 32}, NULL, 0};
	CK_TLS_KDF_PARAMS *kdf = heap(&kdfv, sizeof kdfv);
	roundtrip("TLS-KDF", &(CK_MECHANISM){CKM_TLS_KDF, kdf, sizeof *kdf});
	CK_ECDH1_DERIVE_PARAMS *ecdh = heap(&(CK_ECDH1_DERIVE_PARAMS){CKD_NULL, 0, NULL, 32, rnd}, sizeof(CK_ECDH1_DERIVE_PARAMS));
	roundtrip("ECDH1", &(CK_MECHANISM){CKM_ECDH1_DERIVE, ecdh, sizeof *ecdh});
	CK_BYTE *iv = heap("0123456789abcdef", 16);
	roundtrip("AES-CBC (flat)", &(CK_MECHANISM){CKM_AES_CBC, iv, 16});
	/* A NULL pointer with a length: crosses as it is (the member answers). */
	CK_KEY_DERIVATION_STRING_DATA *nulldata = heap(&(CK_KEY_DERIVATION_STRING_DATA){NULL, 16}, sizeof *str);
	roundtrip("derive-by-data with NULL data", &(CK_MECHANISM){CKM_AES_ECB_ENCRYPT_DATA, nulldata, sizeof *str});

	unsigned char *body;
	size_t len;
	/* An output the member would write: refused in the client. */
	CK_TLS_PRF_PARAMS prf = {0};
	if (send(&(CK_MECHANISM){CKM_TLS_PRF, &prf, sizeof prf}, &body, &len) != CKR_MECHANISM_PARAM_INVALID)
		FAIL("TLS-PRF (an output parameter) was not refused with CKR_MECHANISM_PARAM_INVALID");
	free(body);

	/* A parameter length that is not the structure's: only the length
	 * crosses (the structure is not read, ASan would see it), and the
	 * helper lends zeroes of that length. */
	CK_MECHANISM_PTR out;
	struct hap_req r;
	CK_MECHANISM longer = {CKM_AES_ECB_ENCRYPT_DATA, str, sizeof *str + 4096};
	if (send(&longer, &body, &len) != CKR_OK || !take(body, len, &out, &r) || out->ulParameterLen != sizeof *str + 4096 ||
	    ((CK_BYTE *)out->pParameter)[sizeof *str + 4095] != 0)
		FAIL("a derive-by-data parameter 4 KiB longer than its structure did not cross as its length alone");
	hap_req_free(&r);
	attack("a length alone", body, len);
	free(body);

	/* Inner lengths that lie: over the frame, none is read. */
	CK_ULONG huge[] = {(CK_ULONG)1 << 40, HAP_MAX_FRAME + 1, (CK_ULONG)-1, (CK_ULONG)-8};
	for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
		str->ulLen = huge[i];
		if (send(&(CK_MECHANISM){CKM_AES_ECB_ENCRYPT_DATA, str, sizeof *str}, &body, &len) != CKR_ARGUMENTS_BAD)
			FAIL("a derive-by-data length of 0x%lx was sent, want CKR_ARGUMENTS_BAD and nothing read",
			     (unsigned long)huge[i]);
		free(body);
	}
	str->ulLen = 16;

	/* A raw structure with pointers, as a hostile client would send it:
	 * the helper refuses it rather than hand its member those pointers. */
	struct hap_msg m;
	hap_msg_start(&m, 0);
	hap_put64(&m, 1);
	hap_put64(&m, CKM_AES_CCM);
	hap_put64(&m, 0); /* its bytes */
	hap_put_in(&m, (CK_BYTE_PTR)ccm, sizeof *ccm);
	if (take(m.b + 12, m.len - 12, &out, &r))
		FAIL("the helper took CCM parameters as raw bytes (the client's pointers)");
	hap_req_free(&r);
	free(m.b);

	while (nheaps > 0)
		free(heaps[--nheaps]);
	if (failed)
		return 1;
	printf("ok %ld requests\n", requests);
	return 0;
}
