/*
 * conform.c — one PKCS#11 call sequence, printed so that two modules'
 * answers can be compared line for line: every CKR code, length and
 * output, never a handle (handles differ between a group and a token).
 *
 *   conform MODULE TOKEN_LABEL PIN_FILE PART...
 *
 * Parts: info (token manufacturer and model), mechs (C_GetMechanismList
 * in order), cbc (AES-CBC-PAD multi-part encryption and decryption with a
 * length query before every Update and Final), digestkey (C_DigestKey
 * inside a SHA-256 digest, and its error cases). cbc and digestkey log in
 * and make an AES key of a fixed value, destroyed at the end. initerr
 * (the errors *Init calls give, then the buffer convention on C_Sign and
 * C_Decrypt) makes its own keys too, and so does params (mechanism
 * parameters that hold pointers, well and badly formed). fold (an Init
 * made again on its session, which a helper sends with its call) makes its
 * own keys, and logs out and in again from a second session: run it last.
 */
#include "common.h"

static CK_FUNCTION_LIST_PTR f;

/* rv prints a call's name and result; returns the result. */
static CK_RV rv(const char *what, CK_RV r)
{
	printf("%s rv=0x%lx\n", what, (unsigned long)r);
	return r;
}

static void hex(const char *what, const CK_BYTE *b, CK_ULONG n)
{
	printf("%s len=%lu ", what, (unsigned long)n);
	for (CK_ULONG i = 0; i < n; i++)
		printf("%02x", b[i]);
	printf("\n");
}

/* padded compares a blank-padded PKCS#11 string with s. */
static int padded_is(const CK_UTF8CHAR *p, size_t size, const char *s)
{
	size_t n = strlen(s);
	if (n > size || memcmp(p, s, n) != 0)
		return 0;
	for (size_t i = n; i < size; i++)
		if (p[i] != ' ')
			return 0;
	return 1;
}

static CK_SLOT_ID find_slot(const char *label)
{
	CK_SLOT_ID ids[64];
	CK_ULONG n = 64;
	CHECK(f->C_GetSlotList(CK_TRUE, ids, &n));
	for (CK_ULONG i = 0; i < n; i++) {
		CK_TOKEN_INFO ti;
		if (f->C_GetTokenInfo(ids[i], &ti) == CKR_OK && padded_is(ti.label, sizeof ti.label, label))
			return ids[i];
	}
	fprintf(stderr, "FATAL no token labelled %s\n", label);
	exit(2);
}

static void part_info(CK_SLOT_ID slot)
{
	CK_TOKEN_INFO ti;
	CHECK(f->C_GetTokenInfo(slot, &ti));
	printf("token manufacturer=%.32s model=%.16s\n", ti.manufacturerID, ti.model);
}

static void part_mechs(CK_SLOT_ID slot)
{
	CK_MECHANISM_TYPE m[512];
	CK_ULONG n = 512;
	CHECK(f->C_GetMechanismList(slot, m, &n));
	for (CK_ULONG i = 0; i < n; i++)
		printf("mech 0x%lx\n", (unsigned long)m[i]);
}

static CK_OBJECT_HANDLE make_key(CK_SESSION_HANDLE s)
{
	static CK_BYTE value[16] = {0x2b, 0x7e, 0x15, 0x16, 0x28, 0xae, 0xd2, 0xa6,
				    0xab, 0xf7, 0x15, 0x88, 0x09, 0xcf, 0x4f, 0x3c};
	CK_OBJECT_CLASS cls = CKO_SECRET_KEY;
	CK_KEY_TYPE kt = CKK_AES;
	CK_BBOOL yes = CK_TRUE, no = CK_FALSE;
	char label[64];
	snprintf(label, sizeof label, "conform-%d", (int)getpid());
	CK_ATTRIBUTE t[] = {
		{CKA_CLASS, &cls, sizeof cls},
		{CKA_KEY_TYPE, &kt, sizeof kt},
		{CKA_TOKEN, &yes, sizeof yes},
		{CKA_PRIVATE, &yes, sizeof yes},
		{CKA_SENSITIVE, &no, sizeof no},
		{CKA_EXTRACTABLE, &yes, sizeof yes},
		{CKA_ENCRYPT, &yes, sizeof yes},
		{CKA_DECRYPT, &yes, sizeof yes},
		{CKA_LABEL, label, strlen(label)},
		{CKA_ID, "cf", 2},
		{CKA_VALUE, value, sizeof value},
	};
	CK_OBJECT_HANDLE k;
	CHECK(f->C_CreateObject(s, t, sizeof t / sizeof t[0], &k));
	return k;
}

typedef CK_RV (*updateFn)(CK_SESSION_HANDLE, CK_BYTE_PTR, CK_ULONG, CK_BYTE_PTR, CK_ULONG_PTR);
typedef CK_RV (*finalFn)(CK_SESSION_HANDLE, CK_BYTE_PTR, CK_ULONG_PTR);

/*
 * multi runs one multi-part operation over in, cut at cuts: each Update
 * and the Final first asked for its length (NULL buffer), then given a
 * buffer of exactly that length. Returns the output's length in out.
 */
static CK_ULONG multi(const char *name, CK_SESSION_HANDLE s, updateFn up, finalFn fin,
		      const CK_BYTE *in, const CK_ULONG *cuts, int ncuts, CK_BYTE *out)
{
	CK_ULONG total = 0, at = 0;
	char what[64];
	for (int i = 0; i < ncuts; i++) {
		CK_ULONG n = 0;
		snprintf(what, sizeof what, "%s update %d query", name, i);
		if (rv(what, up(s, (CK_BYTE_PTR)in + at, cuts[i], NULL, &n)) != CKR_OK)
			return total;
		printf("%s len=%lu\n", what, (unsigned long)n);
		snprintf(what, sizeof what, "%s update %d", name, i);
		if (rv(what, up(s, (CK_BYTE_PTR)in + at, cuts[i], out + total, &n)) != CKR_OK)
			return total;
		hex(what, out + total, n);
		total += n;
		at += cuts[i];
	}
	CK_ULONG n = 0;
	snprintf(what, sizeof what, "%s final query", name);
	if (rv(what, fin(s, NULL, &n)) != CKR_OK)
		return total;
	printf("%s len=%lu\n", what, (unsigned long)n);
	snprintf(what, sizeof what, "%s final", name);
	if (rv(what, fin(s, out + total, &n)) != CKR_OK)
		return total;
	hex(what, out + total, n);
	total += n;
	snprintf(what, sizeof what, "%s final again", name);
	rv(what, fin(s, out + total, &n));
	return total;
}

static void part_cbc(CK_SESSION_HANDLE s, CK_OBJECT_HANDLE key)
{
	CK_BYTE iv[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
	CK_MECHANISM m = {CKM_AES_CBC_PAD, iv, sizeof iv};
	CK_BYTE plain[64], ct[96], back[96];
	for (int i = 0; i < 64; i++)
		plain[i] = (CK_BYTE)(i * 7 + 1);
	/* 37 bytes: a partial block left for the final; 32: whole blocks, so
	 * the decryption's last Update holds a block back and its Final
	 * returns nothing; 5: every Update returns nothing. */
	struct {
		const char *name;
		CK_ULONG cuts[4];
		int ncuts;
	} cases[] = {
		{"partial", {16, 5, 16}, 3},
		{"blocks", {16, 16}, 2},
		{"short", {5}, 1},
	};
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		char name[64];
		CK_ULONG len = 0;
		for (int i = 0; i < cases[c].ncuts; i++)
			len += cases[c].cuts[i];
		snprintf(name, sizeof name, "%s encrypt", cases[c].name);
		if (rv(name, f->C_EncryptInit(s, &m, key)) != CKR_OK)
			continue;
		CK_ULONG n = multi(name, s, f->C_EncryptUpdate, f->C_EncryptFinal, plain, cases[c].cuts, cases[c].ncuts, ct);
		hex(name, ct, n);
		/* Decrypt in 16-byte parts (the last one shorter if need be). */
		CK_ULONG dcuts[8];
		int nd = 0;
		for (CK_ULONG at = 0; at < n; at += 16)
			dcuts[nd++] = n - at < 16 ? n - at : 16;
		snprintf(name, sizeof name, "%s decrypt", cases[c].name);
		if (rv(name, f->C_DecryptInit(s, &m, key)) != CKR_OK)
			continue;
		CK_ULONG p = multi(name, s, f->C_DecryptUpdate, f->C_DecryptFinal, ct, dcuts, nd, back);
		printf("%s round trip %s\n", cases[c].name, p == len && memcmp(back, plain, len) == 0 ? "equal" : "DIFFERENT");
	}
}

static void part_digestkey(CK_SESSION_HANDLE s, CK_OBJECT_HANDLE key)
{
	CK_MECHANISM m = {CKM_SHA256, NULL, 0};
	CK_BYTE out[32];
	CK_ULONG n;
	rv("digestkey without init", f->C_DigestKey(s, key));
	rv("digest init", f->C_DigestInit(s, &m));
	rv("digest update", f->C_DigestUpdate(s, (CK_BYTE_PTR) "abc", 3));
	rv("digestkey", f->C_DigestKey(s, key));
	n = sizeof out;
	if (rv("digest final", f->C_DigestFinal(s, out, &n)) == CKR_OK)
		hex("digest", out, n);
	/* The key first: the digest is placed where the key is. */
	rv("digest init", f->C_DigestInit(s, &m));
	rv("digestkey first", f->C_DigestKey(s, key));
	rv("digest update", f->C_DigestUpdate(s, (CK_BYTE_PTR) "abc", 3));
	n = sizeof out;
	if (rv("digest final", f->C_DigestFinal(s, out, &n)) == CKR_OK)
		hex("digest", out, n);
	/* A handle that is no key, then whether the digest survived it. */
	rv("digest init", f->C_DigestInit(s, &m));
	rv("digestkey bad handle", f->C_DigestKey(s, 0x7ffff0));
	n = sizeof out;
	if (rv("digest final after bad handle", f->C_DigestFinal(s, out, &n)) == CKR_OK)
		hex("digest", out, n);
	/* An object that is no key. */
	CK_OBJECT_CLASS cls = CKO_DATA;
	CK_BBOOL no = CK_FALSE;
	CK_ATTRIBUTE t[] = {
		{CKA_CLASS, &cls, sizeof cls},
		{CKA_TOKEN, &no, sizeof no},
		{CKA_LABEL, "conform-data", 12},
		{CKA_VALUE, "data", 4},
	};
	CK_OBJECT_HANDLE data;
	CHECK(f->C_CreateObject(s, t, sizeof t / sizeof t[0], &data));
	rv("digest init", f->C_DigestInit(s, &m));
	rv("digest update", f->C_DigestUpdate(s, (CK_BYTE_PTR) "abc", 3));
	rv("digestkey data object", f->C_DigestKey(s, data));
	n = sizeof out;
	if (rv("digest final after data object", f->C_DigestFinal(s, out, &n)) == CKR_OK)
		hex("digest", out, n);
	CHECK(f->C_DestroyObject(s, data));
}

/* secret makes a token generic secret (HMAC) key of n bytes, for signing. */
static CK_OBJECT_HANDLE secret(CK_SESSION_HANDLE s, const char *label, CK_ULONG n)
{
	CK_BYTE value[64];
	CK_OBJECT_CLASS cls = CKO_SECRET_KEY;
	CK_KEY_TYPE kt = CKK_GENERIC_SECRET;
	CK_BBOOL yes = CK_TRUE, no = CK_FALSE;
	char name[64];
	for (CK_ULONG i = 0; i < n; i++)
		value[i] = (CK_BYTE)(i * 13 + 5);
	snprintf(name, sizeof name, "%s-%d", label, (int)getpid());
	CK_ATTRIBUTE t[] = {
		{CKA_CLASS, &cls, sizeof cls},
		{CKA_KEY_TYPE, &kt, sizeof kt},
		{CKA_TOKEN, &yes, sizeof yes},
		{CKA_PRIVATE, &yes, sizeof yes},
		{CKA_SENSITIVE, &yes, sizeof yes},
		{CKA_EXTRACTABLE, &no, sizeof no},
		{CKA_SIGN, &yes, sizeof yes},
		{CKA_VERIFY, &yes, sizeof yes},
		{CKA_LABEL, name, strlen(name)},
		{CKA_ID, "ie", 2},
		{CKA_VALUE, value, n},
	};
	CK_OBJECT_HANDLE k;
	CHECK(f->C_CreateObject(s, t, sizeof t / sizeof t[0], &k));
	return k;
}

/* sign_once runs C_SignInit and C_Sign (length query, a short buffer,
 * then the buffer) and prints each answer. */
static void sign_once(const char *name, CK_SESSION_HANDLE s, CK_MECHANISM *m, CK_OBJECT_HANDLE key)
{
	CK_BYTE out[128];
	CK_ULONG n = 0;
	char what[80];
	snprintf(what, sizeof what, "%s signinit", name);
	rv(what, f->C_SignInit(s, m, key));
	snprintf(what, sizeof what, "%s sign query", name);
	if (rv(what, f->C_Sign(s, (CK_BYTE_PTR) "data", 4, NULL, &n)) == CKR_OK)
		printf("%s len=%lu\n", what, (unsigned long)n);
	snprintf(what, sizeof what, "%s sign short", name);
	n = 1;
	if (rv(what, f->C_Sign(s, (CK_BYTE_PTR) "data", 4, out, &n)) == CKR_BUFFER_TOO_SMALL)
		printf("%s len=%lu\n", what, (unsigned long)n);
	snprintf(what, sizeof what, "%s sign", name);
	n = sizeof out;
	if (rv(what, f->C_Sign(s, (CK_BYTE_PTR) "data", 4, out, &n)) == CKR_OK)
		hex(what, out, n);
	snprintf(what, sizeof what, "%s sign again", name);
	n = sizeof out;
	rv(what, f->C_Sign(s, (CK_BYTE_PTR) "data", 4, out, &n));
}

/*
 * part_initerr: errors an *Init call gives (issue 16 item 2): a key too
 * short for HMAC-SHA1, OAEP parameters the token refuses, a CBC IV of the
 * wrong length, a key that may not encrypt, a mechanism that is no
 * digest. Each Init is made twice (the second time must not be answered
 * from memory of a different outcome), then the data call, which must
 * find no operation. Then a good HMAC twice, with the buffer convention.
 */
static void part_initerr(CK_SESSION_HANDLE s, CK_OBJECT_HANDLE aes)
{
	CK_MECHANISM hmac1 = {CKM_SHA_1_HMAC, NULL, 0};
	CK_OBJECT_HANDLE shortKey = secret(s, "conform-short", 4);
	CK_OBJECT_HANDLE goodKey = secret(s, "conform-hmac", 32);
	for (int i = 0; i < 2; i++)
		sign_once("hmac short key", s, &hmac1, shortKey);
	for (int i = 0; i < 2; i++)
		sign_once("hmac good key", s, &hmac1, goodKey);

	CK_BYTE out[512];
	CK_ULONG n;
	CK_BYTE iv8[8] = {0};
	CK_MECHANISM cbc8 = {CKM_AES_CBC_PAD, iv8, sizeof iv8};
	for (int i = 0; i < 2; i++) {
		rv("cbc short iv encryptinit", f->C_EncryptInit(s, &cbc8, aes));
		n = sizeof out;
		rv("cbc short iv encrypt", f->C_Encrypt(s, (CK_BYTE_PTR) "data", 4, out, &n));
	}
	CK_BYTE iv[16] = {0};
	CK_MECHANISM cbc = {CKM_AES_CBC_PAD, iv, sizeof iv};
	for (int i = 0; i < 2; i++) {
		rv("hmac key encryptinit", f->C_EncryptInit(s, &cbc, goodKey));
		n = sizeof out;
		rv("hmac key encrypt", f->C_Encrypt(s, (CK_BYTE_PTR) "data", 4, out, &n));
	}
	CK_MECHANISM nodigest = {CKM_SHA256_HMAC, NULL, 0};
	rv("hmac digestinit", f->C_DigestInit(s, &nodigest));

	CK_MECHANISM gen = {CKM_RSA_PKCS_KEY_PAIR_GEN, NULL, 0};
	CK_ULONG bits = 2048;
	CK_BYTE e[] = {1, 0, 1};
	CK_BBOOL yes = CK_TRUE;
	char label[64];
	snprintf(label, sizeof label, "conform-rsa-%d", (int)getpid());
	CK_ATTRIBUTE pub[] = {
		{CKA_TOKEN, &yes, sizeof yes},
		{CKA_ENCRYPT, &yes, sizeof yes},
		{CKA_MODULUS_BITS, &bits, sizeof bits},
		{CKA_PUBLIC_EXPONENT, e, sizeof e},
		{CKA_LABEL, label, strlen(label)},
		{CKA_ID, "ir", 2},
	};
	CK_ATTRIBUTE priv[] = {
		{CKA_TOKEN, &yes, sizeof yes},
		{CKA_PRIVATE, &yes, sizeof yes},
		{CKA_SENSITIVE, &yes, sizeof yes},
		{CKA_DECRYPT, &yes, sizeof yes},
		{CKA_LABEL, label, strlen(label)},
		{CKA_ID, "ir", 2},
	};
	CK_OBJECT_HANDLE pk, sk;
	CHECK(f->C_GenerateKeyPair(s, &gen, pub, 6, priv, 6, &pk, &sk));
	/* SHA-256 with MGF1-SHA1: the token refuses the mix. */
	CK_RSA_PKCS_OAEP_PARAMS bad = {CKM_SHA256, CKG_MGF1_SHA1, CKZ_DATA_SPECIFIED, NULL, 0};
	CK_MECHANISM oaepBad = {CKM_RSA_PKCS_OAEP, &bad, sizeof bad};
	CK_BYTE ct[256];
	memset(ct, 0x5a, sizeof ct);
	for (int i = 0; i < 2; i++) {
		rv("oaep bad params decryptinit", f->C_DecryptInit(s, &oaepBad, sk));
		n = sizeof out;
		rv("oaep bad params decrypt", f->C_Decrypt(s, ct, sizeof ct, out, &n));
	}
	/* Good parameters: a round trip, the decryption with a length query. */
	CK_RSA_PKCS_OAEP_PARAMS good = {CKM_SHA_1, CKG_MGF1_SHA1, CKZ_DATA_SPECIFIED, NULL, 0};
	CK_MECHANISM oaep = {CKM_RSA_PKCS_OAEP, &good, sizeof good};
	CK_ULONG cn = sizeof ct;
	rv("oaep encryptinit", f->C_EncryptInit(s, &oaep, pk));
	if (rv("oaep encrypt", f->C_Encrypt(s, (CK_BYTE_PTR) "secret", 6, ct, &cn)) == CKR_OK)
		printf("oaep encrypt len=%lu\n", (unsigned long)cn);
	rv("oaep decryptinit", f->C_DecryptInit(s, &oaep, sk));
	n = 0;
	if (rv("oaep decrypt query", f->C_Decrypt(s, ct, cn, NULL, &n)) == CKR_OK)
		printf("oaep decrypt query len=%lu\n", (unsigned long)n);
	n = sizeof out;
	if (rv("oaep decrypt", f->C_Decrypt(s, ct, cn, out, &n)) == CKR_OK)
		hex("oaep decrypt", out, n);
	CHECK(f->C_DestroyObject(s, pk));
	CHECK(f->C_DestroyObject(s, sk));
	CHECK(f->C_DestroyObject(s, shortKey));
	CHECK(f->C_DestroyObject(s, goodKey));
}

/*
 * part_fold: an Init made again on its session answers as when it is made
 * the first time (through a helper it rides with its call: fold.c):
 * repeated single-part operations, an Init while one stands, a multi-part
 * operation and a length query after one, a key destroyed and a logout
 * from another session in between, a verification that fails.
 */
static CK_OBJECT_HANDLE find_label(CK_SESSION_HANDLE s, const char *prefix)
{
	char label[64];
	snprintf(label, sizeof label, "%s-%d", prefix, (int)getpid());
	CK_ATTRIBUTE byLabel = {CKA_LABEL, label, strlen(label)};
	CK_OBJECT_HANDLE h = CK_INVALID_HANDLE;
	CK_ULONG found = 0;
	CHECK(f->C_FindObjectsInit(s, &byLabel, 1));
	CHECK(f->C_FindObjects(s, &h, 1, &found));
	CHECK(f->C_FindObjectsFinal(s));
	printf("found %s=%lu\n", prefix, (unsigned long)found);
	return h;
}

static void part_fold(CK_SLOT_ID slot, CK_SESSION_HANDLE s, CK_OBJECT_HANDLE *aesp, const char *pin, CK_ULONG pinLen)
{
	CK_MECHANISM hmac = {CKM_SHA256_HMAC, NULL, 0};
	CK_OBJECT_HANDLE key = secret(s, "fold-hmac", 32), aes = *aesp;
	CK_BYTE out[64], sig[64];
	CK_ULONG n, sigLen;
	for (int i = 0; i < 3; i++) {
		rv("fold signinit", f->C_SignInit(s, &hmac, key));
		n = sizeof out;
		if (rv("fold sign", f->C_Sign(s, (CK_BYTE_PTR) "data", 4, out, &n)) == CKR_OK)
			hex("fold sign", out, n);
	}
	rv("fold signinit", f->C_SignInit(s, &hmac, key));
	rv("fold signinit while one stands", f->C_SignInit(s, &hmac, key));
	n = sizeof out;
	if (rv("fold sign", f->C_Sign(s, (CK_BYTE_PTR) "data", 4, out, &n)) == CKR_OK)
		hex("fold sign", out, n);
	rv("fold signinit", f->C_SignInit(s, &hmac, key));
	rv("fold signupdate", f->C_SignUpdate(s, (CK_BYTE_PTR) "da", 2));
	rv("fold signupdate", f->C_SignUpdate(s, (CK_BYTE_PTR) "ta", 2));
	n = sizeof out;
	if (rv("fold signfinal", f->C_SignFinal(s, out, &n)) == CKR_OK)
		hex("fold signfinal", out, n);
	for (int i = 0; i < 2; i++) {
		rv("fold signinit", f->C_SignInit(s, &hmac, key));
		n = 0;
		if (rv("fold sign query", f->C_Sign(s, (CK_BYTE_PTR) "data", 4, NULL, &n)) == CKR_OK)
			printf("fold sign query len=%lu\n", (unsigned long)n);
		n = sizeof out;
		if (rv("fold sign", f->C_Sign(s, (CK_BYTE_PTR) "data", 4, out, &n)) == CKR_OK)
			hex("fold sign", out, n);
	}

	CK_SESSION_HANDLE s2;
	CHECK(f->C_OpenSession(slot, CKF_SERIAL_SESSION | CKF_RW_SESSION, NULL, NULL, &s2));
	CK_OBJECT_HANDLE doomed = secret(s, "fold-doomed", 32);
	for (int i = 0; i < 2; i++) {
		rv("fold signinit doomed key", f->C_SignInit(s, &hmac, doomed));
		n = sizeof out;
		rv("fold sign doomed key", f->C_Sign(s, (CK_BYTE_PTR) "data", 4, out, &n));
		if (i == 0)
			rv("fold destroy from another session", f->C_DestroyObject(s2, doomed));
	}

	sigLen = sizeof sig;
	rv("fold signinit", f->C_SignInit(s, &hmac, key));
	rv("fold sign", f->C_Sign(s, (CK_BYTE_PTR) "data", 4, sig, &sigLen));
	for (int i = 0; i < 4; i++) {
		if (i == 2)
			sig[0] ^= 1;
		if (i == 3)
			sig[0] ^= 1;
		rv("fold verifyinit", f->C_VerifyInit(s, &hmac, key));
		rv("fold verify", f->C_Verify(s, (CK_BYTE_PTR) "data", 4, sig, sigLen));
	}

	CK_BYTE iv[16] = {0};
	CK_MECHANISM cbc = {CKM_AES_CBC_PAD, iv, sizeof iv};
	for (int i = 0; i < 2; i++) {
		rv("fold encryptinit", f->C_EncryptInit(s, &cbc, aes));
		n = sizeof out;
		if (rv("fold encrypt", f->C_Encrypt(s, (CK_BYTE_PTR) "data", 4, out, &n)) == CKR_OK)
			hex("fold encrypt", out, n);
	}

	rv("fold signinit", f->C_SignInit(s, &hmac, key));
	n = sizeof out;
	rv("fold sign", f->C_Sign(s, (CK_BYTE_PTR) "data", 4, out, &n));
	rv("fold logout from another session", f->C_Logout(s2));
	rv("fold signinit logged out", f->C_SignInit(s, &hmac, key));
	n = sizeof out;
	rv("fold sign logged out", f->C_Sign(s, (CK_BYTE_PTR) "data", 4, out, &n));
	rv("fold login again", f->C_Login(s, CKU_USER, (CK_UTF8CHAR_PTR)pin, pinLen));
	/* A token may forget private objects' handles at a logout (SoftHSM
	 * does): the keys are found again by their labels. */
	key = find_label(s, "fold-hmac");
	*aesp = find_label(s, "conform");
	rv("fold signinit", f->C_SignInit(s, &hmac, key));
	n = sizeof out;
	if (rv("fold sign", f->C_Sign(s, (CK_BYTE_PTR) "data", 4, out, &n)) == CKR_OK)
		hex("fold sign", out, n);
	CHECK(f->C_CloseSession(s2));
	CHECK(f->C_DestroyObject(s, key));
}

/* derive runs C_DeriveKey from base with mech and prints its answer and,
 * when it made a key, the key's value; the key is destroyed. */
static void derive(const char *name, CK_SESSION_HANDLE s, CK_MECHANISM *m, CK_OBJECT_HANDLE base)
{
	CK_OBJECT_CLASS cls = CKO_SECRET_KEY;
	CK_KEY_TYPE kt = CKK_AES;
	CK_ULONG len = 16;
	CK_BBOOL yes = CK_TRUE, no = CK_FALSE;
	CK_ATTRIBUTE t[] = {
		{CKA_CLASS, &cls, sizeof cls},
		{CKA_KEY_TYPE, &kt, sizeof kt},
		{CKA_VALUE_LEN, &len, sizeof len},
		{CKA_TOKEN, &no, sizeof no},
		{CKA_SENSITIVE, &no, sizeof no},
		{CKA_EXTRACTABLE, &yes, sizeof yes},
		{CKA_ENCRYPT, &yes, sizeof yes},
	};
	CK_OBJECT_HANDLE k = CK_INVALID_HANDLE;
	char what[80];
	snprintf(what, sizeof what, "%s derive", name);
	if (rv(what, f->C_DeriveKey(s, m, base, t, sizeof t / sizeof t[0], &k)) != CKR_OK)
		return;
	CK_BYTE v[64];
	CK_ATTRIBUTE a = {CKA_VALUE, v, sizeof v};
	snprintf(what, sizeof what, "%s value", name);
	if (rv(what, f->C_GetAttributeValue(s, k, &a, 1)) == CKR_OK)
		hex(what, v, a.ulValueLen);
	CHECK(f->C_DestroyObject(s, k));
}

/*
 * part_params: mechanism parameters that hold pointers (issue 33): AES-GCM
 * with an IV and AAD, CCM, derivation by data (ECB and CBC encryption of
 * data, concatenation, XOR), RSA-AES key wrap with its OAEP parameters,
 * and the same derivation with a parameter length that is not its
 * structure's, a data length the token refuses and no parameter at all.
 * Through a helper each must cross and be answered as in process.
 */
static void part_params(CK_SESSION_HANDLE s)
{
	static CK_BYTE value[16] = {0x60, 0x3d, 0xeb, 0x10, 0x15, 0xca, 0x71, 0xbe,
				    0x2b, 0x73, 0xae, 0xf0, 0x85, 0x7d, 0x77, 0x81};
	CK_OBJECT_CLASS cls = CKO_SECRET_KEY;
	CK_KEY_TYPE kt = CKK_AES;
	CK_BBOOL yes = CK_TRUE, no = CK_FALSE;
	char label[64];
	snprintf(label, sizeof label, "conform-derive-%d", (int)getpid());
	CK_ATTRIBUTE t[] = {
		{CKA_CLASS, &cls, sizeof cls},
		{CKA_KEY_TYPE, &kt, sizeof kt},
		{CKA_TOKEN, &no, sizeof no},
		{CKA_SENSITIVE, &no, sizeof no},
		{CKA_EXTRACTABLE, &yes, sizeof yes},
		{CKA_ENCRYPT, &yes, sizeof yes},
		{CKA_DECRYPT, &yes, sizeof yes},
		{CKA_DERIVE, &yes, sizeof yes},
		{CKA_WRAP, &yes, sizeof yes},
		{CKA_LABEL, label, strlen(label)},
		{CKA_VALUE, value, sizeof value},
	};
	CK_OBJECT_HANDLE base;
	CHECK(f->C_CreateObject(s, t, sizeof t / sizeof t[0], &base));

	CK_BYTE out[256], back[256];
	CK_ULONG n, bn;
	CK_BYTE iv[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, aad[6] = "header";
	CK_GCM_PARAMS gcm = {iv, sizeof iv, 96, aad, sizeof aad, 128};
	CK_MECHANISM mgcm = {CKM_AES_GCM, &gcm, sizeof gcm};
	n = sizeof out;
	if (rv("gcm encryptinit", f->C_EncryptInit(s, &mgcm, base)) == CKR_OK &&
	    rv("gcm encrypt", f->C_Encrypt(s, (CK_BYTE_PTR) "plaintext", 9, out, &n)) == CKR_OK) {
		hex("gcm encrypt", out, n);
		bn = sizeof back;
		if (rv("gcm decryptinit", f->C_DecryptInit(s, &mgcm, base)) == CKR_OK &&
		    rv("gcm decrypt", f->C_Decrypt(s, out, n, back, &bn)) == CKR_OK)
			hex("gcm decrypt", back, bn);
	}
	/* The parameter's memory is the application's again once the Init
	 * returned (PKCS#11 5.2): overwritten before the Encrypt, the output is
	 * the same. */
	CK_BYTE iv2[12], aad2[6];
	memcpy(iv2, iv, sizeof iv2);
	memcpy(aad2, aad, sizeof aad2);
	CK_GCM_PARAMS gcm2 = {iv2, sizeof iv2, 96, aad2, sizeof aad2, 128};
	CK_MECHANISM mgcm2 = {CKM_AES_GCM, &gcm2, sizeof gcm2};
	n = sizeof out;
	if (rv("gcm encryptinit, then its parameter overwritten", f->C_EncryptInit(s, &mgcm2, base)) == CKR_OK) {
		memset(iv2, 0xa5, sizeof iv2);
		memset(aad2, 0xa5, sizeof aad2);
		memset(&gcm2, 0xa5, sizeof gcm2);
		if (rv("gcm encrypt after the overwrite", f->C_Encrypt(s, (CK_BYTE_PTR) "plaintext", 9, out, &n)) == CKR_OK)
			hex("gcm encrypt after the overwrite", out, n);
	}
	CK_CCM_PARAMS ccm = {9, iv, sizeof iv, aad, sizeof aad, 16};
	CK_MECHANISM mccm = {CKM_AES_CCM, &ccm, sizeof ccm};
	n = sizeof out;
	if (rv("ccm encryptinit", f->C_EncryptInit(s, &mccm, base)) == CKR_OK &&
	    rv("ccm encrypt", f->C_Encrypt(s, (CK_BYTE_PTR) "plaintext", 9, out, &n)) == CKR_OK)
		hex("ccm encrypt", out, n);

	CK_BYTE data[16] = "derivation data!";
	CK_KEY_DERIVATION_STRING_DATA str = {data, sizeof data};
	CK_MECHANISM ecb = {CKM_AES_ECB_ENCRYPT_DATA, &str, sizeof str};
	derive("aes ecb encrypt data", s, &ecb, base);
	CK_AES_CBC_ENCRYPT_DATA_PARAMS cbcp = {{0x0f, 0x0e, 0x0d}, data, sizeof data};
	CK_MECHANISM cbc = {CKM_AES_CBC_ENCRYPT_DATA, &cbcp, sizeof cbcp};
	derive("aes cbc encrypt data", s, &cbc, base);
	CK_MECHANISM concat = {CKM_CONCATENATE_DATA_AND_BASE, &str, sizeof str};
	derive("concatenate data and base", s, &concat, base);
	CK_MECHANISM xor = {CKM_XOR_BASE_AND_DATA, &str, sizeof str};
	derive("xor base and data", s, &xor, base);
	/* Malformed: lengths that are not the structure's, a data length the
	 * token refuses, no parameter. */
	CK_MECHANISM shorter = {CKM_AES_ECB_ENCRYPT_DATA, &str, sizeof str - 1};
	derive("ecb encrypt data short parameter", s, &shorter, base);
	CK_BYTE longer[sizeof str + 8];
	memset(longer, 0, sizeof longer);
	memcpy(longer, &str, sizeof str);
	CK_MECHANISM lng = {CKM_AES_ECB_ENCRYPT_DATA, longer, sizeof longer};
	derive("ecb encrypt data long parameter", s, &lng, base);
	CK_KEY_DERIVATION_STRING_DATA odd = {data, 15};
	CK_MECHANISM modd = {CKM_AES_ECB_ENCRYPT_DATA, &odd, sizeof odd};
	derive("ecb encrypt data of 15 bytes", s, &modd, base);
	CK_MECHANISM none = {CKM_AES_ECB_ENCRYPT_DATA, NULL, 0};
	derive("ecb encrypt data without parameter", s, &none, base);

	CK_RSA_PKCS_OAEP_PARAMS oaep = {CKM_SHA_1, CKG_MGF1_SHA1, CKZ_DATA_SPECIFIED, NULL, 0};
	CK_RSA_AES_KEY_WRAP_PARAMS wrapp = {256, &oaep};
	CK_MECHANISM wrap = {CKM_RSA_AES_KEY_WRAP, &wrapp, sizeof wrapp};
	n = sizeof out;
	rv("rsa aes key wrap", f->C_WrapKey(s, &wrap, base, base, out, &n));
	CHECK(f->C_DestroyObject(s, base));
}

int main(int argc, char **argv)
{
	char pin[256];
	if (argc < 5) {
		fprintf(stderr, "usage: conform MODULE TOKEN_LABEL PIN_FILE PART...\n");
		return 2;
	}
	f = load_module(argv[1], NULL);
	CHECK(f->C_Initialize(NULL));
	CK_SLOT_ID slot = find_slot(argv[2]);
	CK_ULONG pinLen = read_pin(argv[3], pin, sizeof pin);
	CK_SESSION_HANDLE s = CK_INVALID_HANDLE;
	CK_OBJECT_HANDLE key = CK_INVALID_HANDLE;
	for (int i = 4; i < argc; i++) {
		const char *part = argv[i];
		if (strcmp(part, "info") == 0) {
			part_info(slot);
			continue;
		}
		if (strcmp(part, "mechs") == 0) {
			part_mechs(slot);
			continue;
		}
		if (s == CK_INVALID_HANDLE) {
			CHECK(f->C_OpenSession(slot, CKF_SERIAL_SESSION | CKF_RW_SESSION, NULL, NULL, &s));
			CHECK(f->C_Login(s, CKU_USER, (CK_UTF8CHAR_PTR)pin, pinLen));
			key = make_key(s);
		}
		if (strcmp(part, "cbc") == 0)
			part_cbc(s, key);
		else if (strcmp(part, "digestkey") == 0)
			part_digestkey(s, key);
		else if (strcmp(part, "initerr") == 0)
			part_initerr(s, key);
		else if (strcmp(part, "fold") == 0)
			part_fold(slot, s, &key, pin, pinLen);
		else if (strcmp(part, "params") == 0)
			part_params(s);
		else {
			fprintf(stderr, "FATAL unknown part %s\n", part);
			return 2;
		}
	}
	memset(pin, 0, sizeof pin);
	if (s != CK_INVALID_HANDLE) {
		CHECK(f->C_DestroyObject(s, key));
		CHECK(f->C_CloseSession(s));
	}
	CHECK(f->C_Finalize(NULL));
	return 0;
}
