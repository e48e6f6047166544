/*
 * p11drive.c — a raw PKCS#11 binding over a pipe, for the differential
 * conformance harness (test/conformance). A Go program cannot load
 * libhapkcs11.so (it holds a Go runtime of its own), so the harness starts
 * this program on a module and sends it one call a line on stdin; it
 * answers one line on stdout. Nothing is interpreted: every pointer the
 * call takes is given (NULL, a buffer of a size, a value), so buffer
 * conventions and error cases reach the module as written.
 *
 *   p11drive MODULE PIN_FILE        (PIN_FILE: the user PIN, then the SO PIN)
 *
 * P11DRIVE_INIT_ARGS, when set, is given as C_Initialize's pReserved (a
 * bare NSS softokn needs its database's init arguments).
 *
 * Arguments: handles and numbers are C integers (0x.. or decimal). Data is
 * hex, "." for empty (a valid pointer, length 0), "-" for NULL. An output is
 * "-" (NULL: a length query) or a buffer size. A PIN is a name: user, so,
 * bad, new (never the PIN itself, so none appears in the harness's logs).
 * A mechanism is TYPE, TYPE/xHEX (raw parameter), TYPE/gcm/IV/AAD/TAGBITS,
 * TYPE/oaep/HASH/MGF[/LABEL], TYPE/pss/HASH/MGF/SALTLEN,
 * TYPE/ecdh/KDF/PUBLIC[/SHARED], TYPE/str/DATA (CK_KEY_DERIVATION_STRING_DATA),
 * TYPE/cbcdata/IV/DATA (CK_AES_CBC_ENCRYPT_DATA_PARAMS).
 * A template is "-" (NULL), "." (none) or ITEM,ITEM,... with ITEM
 * TYPE=t|f (CK_BBOOL), TYPE=uN (CK_ULONG), TYPE=xHEX, TYPE=sTEXT; in a
 * C_GetAttributeValue template TYPE (NULL value: a length query) or
 * TYPE#N (a buffer of N bytes).
 *
 * Answers: "rv=0x.." then key=value fields: len (an output length, -1 for
 * CK_UNAVAILABLE_INFORMATION), out (hex), h (a handle), and per call more.
 */
#include <ctype.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hapkcs11.h"

#define MAXARGS 16
#define MAXBUF (1 << 20)

static CK_FUNCTION_LIST_PTR f;
static char user_pin[256], so_pin[256];
static CK_SLOT_ID slot;

static void fatal(const char *what)
{
	fprintf(stderr, "p11drive: %s\n", what);
	exit(2);
}

static CK_ULONG num(const char *s)
{
	return (CK_ULONG)strtoull(s, NULL, 0);
}

/* unhex decodes s into a malloc'd buffer; "-" gives NULL, "." empty. */
static CK_BYTE_PTR unhex(const char *s, CK_ULONG *n)
{
	if (strcmp(s, "-") == 0) {
		*n = 0;
		return NULL;
	}
	if (strcmp(s, ".") == 0)
		s = "";
	size_t l = strlen(s) / 2;
	CK_BYTE_PTR b = malloc(l + 1);
	for (size_t i = 0; i < l; i++) {
		unsigned v;
		if (sscanf(s + 2 * i, "%2x", &v) != 1)
			fatal("bad hex");
		b[i] = (CK_BYTE)v;
	}
	*n = (CK_ULONG)l;
	return b;
}

static void hex(const char *key, const CK_BYTE *b, CK_ULONG n)
{
	printf(" %s=", key);
	if (n == 0)
		printf(".");
	for (CK_ULONG i = 0; i < n; i++)
		printf("%02x", b[i]);
}

static void padded(const char *key, const CK_UTF8CHAR *p, size_t n)
{
	while (n > 0 && p[n - 1] == ' ')
		n--;
	printf(" %s=", key);
	for (size_t i = 0; i < n; i++)
		putchar(p[i] == ' ' ? '_' : p[i]);
}

static const char *pin_of(const char *name, CK_ULONG *n)
{
	const char *p = NULL;
	if (strcmp(name, "user") == 0)
		p = user_pin;
	else if (strcmp(name, "so") == 0)
		p = so_pin;
	else if (strcmp(name, "bad") == 0)
		p = "wrong-pin-0000";
	else if (strcmp(name, "new") == 0)
		p = "changed-pin-4321";
	else if (strcmp(name, "-") == 0) {
		*n = 0;
		return NULL;
	} else
		fatal("unknown PIN name");
	*n = (CK_ULONG)strlen(p);
	return p;
}

/* ---- mechanisms ---- */

static CK_GCM_PARAMS gcm;
static CK_RSA_PKCS_OAEP_PARAMS oaep;
static CK_RSA_PKCS_PSS_PARAMS pss;
static CK_ECDH1_DERIVE_PARAMS ecdh;
static CK_KEY_DERIVATION_STRING_DATA str;
static CK_AES_CBC_ENCRYPT_DATA_PARAMS cbcdata;

static CK_MECHANISM mech(char *s)
{
	CK_MECHANISM m = {0, NULL, 0};
	char *parts[8];
	int n = 0;
	for (char *p = strtok(s, "/"); p && n < 8; p = strtok(NULL, "/"))
		parts[n++] = p;
	if (n == 0)
		fatal("empty mechanism");
	m.mechanism = num(parts[0]);
	if (n == 1)
		return m;
	if (strcmp(parts[1], "x") == 0 && n == 3) {
		m.pParameter = unhex(parts[2], &m.ulParameterLen);
	} else if (strcmp(parts[1], "gcm") == 0 && n == 5) {
		memset(&gcm, 0, sizeof gcm);
		gcm.pIv = unhex(parts[2], &gcm.ulIvLen);
		gcm.ulIvBits = gcm.ulIvLen * 8;
		gcm.pAAD = unhex(parts[3], &gcm.ulAADLen);
		gcm.ulTagBits = num(parts[4]);
		m.pParameter = &gcm;
		m.ulParameterLen = sizeof gcm;
	} else if (strcmp(parts[1], "oaep") == 0 && (n == 4 || n == 5)) {
		memset(&oaep, 0, sizeof oaep);
		oaep.hashAlg = num(parts[2]);
		oaep.mgf = num(parts[3]);
		oaep.source = CKZ_DATA_SPECIFIED;
		if (n == 5)
			oaep.pSourceData = unhex(parts[4], &oaep.ulSourceDataLen);
		m.pParameter = &oaep;
		m.ulParameterLen = sizeof oaep;
	} else if (strcmp(parts[1], "pss") == 0 && n == 5) {
		pss.hashAlg = num(parts[2]);
		pss.mgf = num(parts[3]);
		pss.sLen = num(parts[4]);
		m.pParameter = &pss;
		m.ulParameterLen = sizeof pss;
	} else if (strcmp(parts[1], "ecdh") == 0 && (n == 4 || n == 5)) {
		memset(&ecdh, 0, sizeof ecdh);
		ecdh.kdf = num(parts[2]);
		ecdh.pPublicData = unhex(parts[3], &ecdh.ulPublicDataLen);
		if (n == 5)
			ecdh.pSharedData = unhex(parts[4], &ecdh.ulSharedDataLen);
		m.pParameter = &ecdh;
		m.ulParameterLen = sizeof ecdh;
	} else if (strcmp(parts[1], "str") == 0 && n == 3) {
		memset(&str, 0, sizeof str);
		str.pData = unhex(parts[2], &str.ulLen);
		m.pParameter = &str;
		m.ulParameterLen = sizeof str;
	} else if (strcmp(parts[1], "cbcdata") == 0 && n == 4) {
		CK_ULONG ivLen = 0;
		CK_BYTE_PTR iv = unhex(parts[2], &ivLen);
		memset(&cbcdata, 0, sizeof cbcdata);
		memcpy(cbcdata.iv, iv, ivLen < sizeof cbcdata.iv ? ivLen : sizeof cbcdata.iv);
		free(iv);
		cbcdata.pData = unhex(parts[3], &cbcdata.length);
		m.pParameter = &cbcdata;
		m.ulParameterLen = sizeof cbcdata;
	} else {
		fatal("bad mechanism");
	}
	return m;
}

/* ---- templates ---- */

#define MAXATTR 32
static CK_ATTRIBUTE tmpl[MAXATTR];
static CK_BBOOL bools[MAXATTR];
static CK_ULONG ulongs[MAXATTR];

/* GUARD bytes follow every attribute buffer C_GetAttributeValue is given,
 * so that a module writing past the length it was given (NSS softokn does)
 * is seen (an "over" field) rather than corrupting the driver's heap. */
#define GUARD 64

static CK_BYTE_PTR guarded(CK_ULONG n)
{
	CK_BYTE_PTR b = calloc(1, n + GUARD);
	memset(b + n, 0xa5, GUARD);
	return b;
}

static int overrun(const CK_BYTE *b, CK_ULONG n)
{
	for (CK_ULONG i = 0; i < GUARD; i++)
		if (b[n + i] != 0xa5)
			return 1;
	return 0;
}

/* templ parses a template; get selects C_GetAttributeValue's form. */
static CK_ATTRIBUTE_PTR templ(char *s, CK_ULONG *count, int get)
{
	*count = 0;
	if (strcmp(s, "-") == 0)
		return NULL;
	if (strcmp(s, ".") == 0)
		return tmpl;
	char *save = NULL;
	for (char *it = strtok_r(s, ",", &save); it; it = strtok_r(NULL, ",", &save)) {
		if (*count == MAXATTR)
			fatal("template too long");
		CK_ATTRIBUTE *a = &tmpl[*count];
		char *eq = strchr(it, get ? '#' : '=');
		if (eq)
			*eq++ = 0;
		a->type = num(it);
		a->pValue = NULL;
		a->ulValueLen = 0;
		if (get) {
			if (eq) {
				a->ulValueLen = num(eq);
				a->pValue = guarded(a->ulValueLen);
			}
		} else {
			if (!eq)
				fatal("template item without a value");
			switch (*eq) {
			case 't':
			case 'f':
				bools[*count] = *eq == 't';
				a->pValue = &bools[*count];
				a->ulValueLen = sizeof(CK_BBOOL);
				break;
			case 'u':
				ulongs[*count] = num(eq + 1);
				a->pValue = &ulongs[*count];
				a->ulValueLen = sizeof(CK_ULONG);
				break;
			case 'x':
				a->pValue = unhex(eq + 1, &a->ulValueLen);
				break;
			case 's':
				a->pValue = strdup(eq + 1);
				a->ulValueLen = strlen(eq + 1);
				break;
			default:
				fatal("bad template value");
			}
		}
		(*count)++;
	}
	return tmpl;
}

/* ---- outputs ---- */

/* out prepares an output buffer from spec ("-" or a size). */
static CK_BYTE_PTR outbuf(const char *spec, CK_ULONG *n)
{
	if (strcmp(spec, "-") == 0) {
		*n = 0;
		return NULL;
	}
	*n = num(spec);
	if (*n > MAXBUF)
		fatal("output too large");
	return calloc(1, *n + 1);
}

/* answer prints rv and, where a length came back, the output. */
static void answer(CK_RV rv, CK_BYTE_PTR b, CK_ULONG n)
{
	printf("rv=0x%lx", (unsigned long)rv);
	if (rv == CKR_OK || rv == CKR_BUFFER_TOO_SMALL)
		printf(" len=%lu", (unsigned long)n);
	if (rv == CKR_OK && b != NULL)
		hex("out", b, n);
}

/* ---- the calls ---- */

typedef void (*handler)(int argc, char **argv);

static void need(int argc, int n)
{
	if (argc != n)
		fatal("wrong number of arguments");
}

static void do_init(int argc, char **argv)
{
	need(argc, 1);
	CK_C_INITIALIZE_ARGS a;
	memset(&a, 0, sizeof a);
	a.flags = CKF_OS_LOCKING_OK;
	a.pReserved = getenv("P11DRIVE_INIT_ARGS");
	printf("rv=0x%lx", (unsigned long)f->C_Initialize(&a));
}

static void do_fin(int argc, char **argv)
{
	need(argc, 1);
	printf("rv=0x%lx", (unsigned long)f->C_Finalize(NULL));
}

static void do_info(int argc, char **argv)
{
	need(argc, 1);
	CK_INFO i;
	memset(&i, 0, sizeof i);
	CK_RV rv = f->C_GetInfo(&i);
	printf("rv=0x%lx", (unsigned long)rv);
	if (rv != CKR_OK)
		return;
	printf(" cryptoki=%u.%u flags=0x%lx", i.cryptokiVersion.major, i.cryptokiVersion.minor, (unsigned long)i.flags);
	padded("manufacturer", i.manufacturerID, sizeof i.manufacturerID);
	padded("description", i.libraryDescription, sizeof i.libraryDescription);
}

/* slots TOKEN_PRESENT OUT: C_GetSlotList. */
static void do_slots(int argc, char **argv)
{
	need(argc, 3);
	CK_SLOT_ID ids[64];
	CK_ULONG n = strcmp(argv[2], "-") == 0 ? 0 : num(argv[2]);
	CK_RV rv = f->C_GetSlotList((CK_BBOOL)num(argv[1]), strcmp(argv[2], "-") == 0 ? NULL : ids, &n);
	printf("rv=0x%lx n=%lu", (unsigned long)rv, (unsigned long)n);
}

/* slot LABEL: selects the slot whose token is labelled LABEL. */
static void do_slot(int argc, char **argv)
{
	need(argc, 2);
	CK_SLOT_ID ids[64];
	CK_ULONG n = 64;
	CK_RV rv = f->C_GetSlotList(CK_TRUE, ids, &n);
	if (rv != CKR_OK) {
		printf("rv=0x%lx", (unsigned long)rv);
		return;
	}
	size_t l = strlen(argv[1]);
	for (CK_ULONG i = 0; i < n; i++) {
		CK_TOKEN_INFO ti;
		if (f->C_GetTokenInfo(ids[i], &ti) != CKR_OK || l > sizeof ti.label || memcmp(ti.label, argv[1], l) != 0)
			continue;
		size_t j = l;
		while (j < sizeof ti.label && ti.label[j] == ' ')
			j++;
		if (j == sizeof ti.label) {
			slot = ids[i];
			printf("rv=0x0");
			return;
		}
	}
	printf("rv=0x%lx", (unsigned long)CKR_TOKEN_NOT_PRESENT);
}

static void do_slotinfo(int argc, char **argv)
{
	need(argc, 1);
	CK_SLOT_INFO i;
	memset(&i, 0, sizeof i);
	CK_RV rv = f->C_GetSlotInfo(slot, &i);
	printf("rv=0x%lx", (unsigned long)rv);
	if (rv == CKR_OK)
		printf(" flags=0x%lx", (unsigned long)i.flags);
}

static void do_tokeninfo(int argc, char **argv)
{
	need(argc, 1);
	CK_TOKEN_INFO i;
	memset(&i, 0, sizeof i);
	CK_RV rv = f->C_GetTokenInfo(slot, &i);
	printf("rv=0x%lx", (unsigned long)rv);
	if (rv != CKR_OK)
		return;
	padded("manufacturer", i.manufacturerID, sizeof i.manufacturerID);
	padded("model", i.model, sizeof i.model);
	printf(" flags=0x%lx maxsess=0x%lx maxrw=0x%lx pinmin=%lu pinmax=%lu", (unsigned long)i.flags,
	       (unsigned long)i.ulMaxSessionCount, (unsigned long)i.ulMaxRwSessionCount,
	       (unsigned long)i.ulMinPinLen, (unsigned long)i.ulMaxPinLen);
	printf(" sess=0x%lx rwsess=0x%lx", (unsigned long)i.ulSessionCount, (unsigned long)i.ulRwSessionCount);
}

/* mechs OUT: C_GetMechanismList, OUT a count or "-". */
static void do_mechs(int argc, char **argv)
{
	need(argc, 2);
	static CK_MECHANISM_TYPE m[1024];
	int query = strcmp(argv[1], "-") == 0;
	CK_ULONG n = query ? 0 : num(argv[1]);
	if (n > 1024)
		fatal("too many mechanisms asked");
	CK_RV rv = f->C_GetMechanismList(slot, query ? NULL : m, &n);
	printf("rv=0x%lx n=%lu", (unsigned long)rv, (unsigned long)n);
	if (rv == CKR_OK && !query) {
		printf(" list=");
		for (CK_ULONG i = 0; i < n; i++)
			printf("%s%lx", i ? "," : "", (unsigned long)m[i]);
	}
}

static void do_mechinfo(int argc, char **argv)
{
	need(argc, 2);
	CK_MECHANISM_INFO i;
	memset(&i, 0, sizeof i);
	CK_RV rv = f->C_GetMechanismInfo(slot, num(argv[1]), &i);
	printf("rv=0x%lx", (unsigned long)rv);
	if (rv == CKR_OK)
		printf(" min=%lu max=%lu flags=0x%lx", (unsigned long)i.ulMinKeySize, (unsigned long)i.ulMaxKeySize, (unsigned long)i.flags);
}

/* inittoken PIN LABEL */
static void do_inittoken(int argc, char **argv)
{
	need(argc, 3);
	CK_ULONG n;
	const char *p = pin_of(argv[1], &n);
	CK_UTF8CHAR label[32];
	memset(label, ' ', sizeof label);
	memcpy(label, argv[2], strlen(argv[2]) < 32 ? strlen(argv[2]) : 32);
	printf("rv=0x%lx", (unsigned long)f->C_InitToken(slot, (CK_UTF8CHAR_PTR)p, n, label));
}

static void do_initpin(int argc, char **argv)
{
	need(argc, 3);
	CK_ULONG n;
	const char *p = pin_of(argv[2], &n);
	printf("rv=0x%lx", (unsigned long)f->C_InitPIN(num(argv[1]), (CK_UTF8CHAR_PTR)p, n));
}

static void do_setpin(int argc, char **argv)
{
	need(argc, 4);
	CK_ULONG on, nn;
	const char *o = pin_of(argv[2], &on);
	const char *p = pin_of(argv[3], &nn);
	printf("rv=0x%lx", (unsigned long)f->C_SetPIN(num(argv[1]), (CK_UTF8CHAR_PTR)o, on, (CK_UTF8CHAR_PTR)p, nn));
}

/* open FLAGS */
static void do_open(int argc, char **argv)
{
	need(argc, 2);
	CK_SESSION_HANDLE h = 0;
	CK_RV rv = f->C_OpenSession(slot, num(argv[1]), NULL, NULL, &h);
	printf("rv=0x%lx", (unsigned long)rv);
	if (rv == CKR_OK)
		printf(" h=%lu", (unsigned long)h);
}

static void do_close(int argc, char **argv)
{
	need(argc, 2);
	printf("rv=0x%lx", (unsigned long)f->C_CloseSession(num(argv[1])));
}

static void do_closeall(int argc, char **argv)
{
	need(argc, 1);
	printf("rv=0x%lx", (unsigned long)f->C_CloseAllSessions(slot));
}

static void do_sessinfo(int argc, char **argv)
{
	need(argc, 2);
	CK_SESSION_INFO i;
	memset(&i, 0, sizeof i);
	CK_RV rv = f->C_GetSessionInfo(num(argv[1]), &i);
	printf("rv=0x%lx", (unsigned long)rv);
	if (rv == CKR_OK)
		printf(" state=%lu flags=0x%lx", (unsigned long)i.state, (unsigned long)i.flags);
}

static void do_getopstate(int argc, char **argv)
{
	need(argc, 3);
	CK_ULONG n;
	CK_BYTE_PTR b = outbuf(argv[2], &n);
	CK_RV rv_ = f->C_GetOperationState(num(argv[1]), b, &n);
	answer(rv_, b, n);
	free(b);
}

static void do_setopstate(int argc, char **argv)
{
	need(argc, 3);
	CK_ULONG n;
	CK_BYTE_PTR b = unhex(argv[2], &n);
	printf("rv=0x%lx", (unsigned long)f->C_SetOperationState(num(argv[1]), b, n, 0, 0));
	free(b);
}

/* login S TYPE PIN */
static void do_login(int argc, char **argv)
{
	need(argc, 4);
	CK_ULONG n;
	const char *p = pin_of(argv[3], &n);
	printf("rv=0x%lx", (unsigned long)f->C_Login(num(argv[1]), num(argv[2]), (CK_UTF8CHAR_PTR)p, n));
}

static void do_logout(int argc, char **argv)
{
	need(argc, 2);
	printf("rv=0x%lx", (unsigned long)f->C_Logout(num(argv[1])));
}

static void handle(CK_RV rv, CK_OBJECT_HANDLE h)
{
	printf("rv=0x%lx", (unsigned long)rv);
	if (rv == CKR_OK)
		printf(" h=%lu", (unsigned long)h);
}

static void do_create(int argc, char **argv)
{
	need(argc, 3);
	CK_ULONG n;
	CK_ATTRIBUTE_PTR t = templ(argv[2], &n, 0);
	CK_OBJECT_HANDLE h = 0;
	CK_RV rv_ = f->C_CreateObject(num(argv[1]), t, n, &h);
	handle(rv_, h);
}

static void do_copy(int argc, char **argv)
{
	need(argc, 4);
	CK_ULONG n;
	CK_ATTRIBUTE_PTR t = templ(argv[3], &n, 0);
	CK_OBJECT_HANDLE h = 0;
	CK_RV rv_ = f->C_CopyObject(num(argv[1]), num(argv[2]), t, n, &h);
	handle(rv_, h);
}

static void do_destroy(int argc, char **argv)
{
	need(argc, 3);
	printf("rv=0x%lx", (unsigned long)f->C_DestroyObject(num(argv[1]), num(argv[2])));
}

static void do_objsize(int argc, char **argv)
{
	need(argc, 3);
	CK_ULONG n = 0;
	CK_RV rv = f->C_GetObjectSize(num(argv[1]), num(argv[2]), &n);
	printf("rv=0x%lx", (unsigned long)rv);
	if (rv == CKR_OK)
		printf(" size=%ld", (long)n);
}

/* getattr S O TEMPLATE: each attribute's length (signed: -1 is
 * CK_UNAVAILABLE_INFORMATION) and, where a buffer was given, its value. */
static void do_getattr(int argc, char **argv)
{
	need(argc, 4);
	CK_ULONG n;
	CK_ATTRIBUTE_PTR t = templ(argv[3], &n, 1);
	CK_ULONG given[MAXATTR];
	for (CK_ULONG i = 0; i < n; i++)
		given[i] = t[i].ulValueLen;
	CK_RV rv = f->C_GetAttributeValue(num(argv[1]), num(argv[2]), t, n);
	printf("rv=0x%lx", (unsigned long)rv);
	for (CK_ULONG i = 0; i < n; i++) {
		if (t[i].pValue != NULL && overrun(t[i].pValue, given[i]))
			printf(" over%lx=1", (unsigned long)t[i].type);
		printf(" a%lx=%ld", (unsigned long)t[i].type, (long)t[i].ulValueLen);
		if (t[i].pValue != NULL && t[i].ulValueLen != CK_UNAVAILABLE_INFORMATION) {
			printf(":");
			for (CK_ULONG j = 0; j < t[i].ulValueLen; j++)
				printf("%02x", ((CK_BYTE *)t[i].pValue)[j]);
		}
		free(t[i].pValue);
	}
}

static void do_setattr(int argc, char **argv)
{
	need(argc, 4);
	CK_ULONG n;
	CK_ATTRIBUTE_PTR t = templ(argv[3], &n, 0);
	printf("rv=0x%lx", (unsigned long)f->C_SetAttributeValue(num(argv[1]), num(argv[2]), t, n));
}

static void do_findinit(int argc, char **argv)
{
	need(argc, 3);
	CK_ULONG n;
	CK_ATTRIBUTE_PTR t = templ(argv[2], &n, 0);
	printf("rv=0x%lx", (unsigned long)f->C_FindObjectsInit(num(argv[1]), t, n));
}

/* find S MAX: the count found, and the handles (h=first). */
static void do_find(int argc, char **argv)
{
	need(argc, 3);
	CK_OBJECT_HANDLE hs[256];
	CK_ULONG max = num(argv[2]), n = 0;
	if (max > 256)
		max = 256;
	CK_RV rv = f->C_FindObjects(num(argv[1]), hs, max, &n);
	printf("rv=0x%lx n=%lu", (unsigned long)rv, (unsigned long)n);
	if (rv == CKR_OK && n > 0)
		printf(" h=%lu", (unsigned long)hs[0]);
}

/* destroyall S: destroys every object the session sees (the harness's
 * cleanup between runs, never compared); answers how many went. */
static void do_destroyall(int argc, char **argv)
{
	need(argc, 2);
	CK_SESSION_HANDLE s = num(argv[1]);
	CK_OBJECT_HANDLE hs[256];
	CK_ULONG n = 0, gone = 0;
	CK_RV rv = f->C_FindObjectsInit(s, NULL, 0);
	if (rv == CKR_OK)
		rv = f->C_FindObjects(s, hs, 256, &n);
	if (rv == CKR_OK)
		rv = f->C_FindObjectsFinal(s);
	for (CK_ULONG i = 0; rv == CKR_OK && i < n; i++) {
		rv = f->C_DestroyObject(s, hs[i]);
		gone += rv == CKR_OK;
	}
	printf("rv=0x%lx n=%lu", (unsigned long)rv, (unsigned long)gone);
}

static void do_findfin(int argc, char **argv)
{
	need(argc, 2);
	printf("rv=0x%lx", (unsigned long)f->C_FindObjectsFinal(num(argv[1])));
}

/* XINIT S MECH KEY for the *Init calls taking a key. */
typedef CK_RV (*initfn)(CK_SESSION_HANDLE, CK_MECHANISM_PTR, CK_OBJECT_HANDLE);
static void keyinit(initfn fn, int argc, char **argv)
{
	need(argc, 4);
	CK_MECHANISM m = mech(argv[2]);
	printf("rv=0x%lx", (unsigned long)fn(num(argv[1]), &m, num(argv[3])));
}

/* X S DATA OUT for the single-part calls and the Updates with an output. */
typedef CK_RV (*datafn)(CK_SESSION_HANDLE, CK_BYTE_PTR, CK_ULONG, CK_BYTE_PTR, CK_ULONG_PTR);
static void dataout(datafn fn, int argc, char **argv)
{
	need(argc, 4);
	CK_ULONG in, n;
	CK_BYTE_PTR d = unhex(argv[2], &in);
	CK_BYTE_PTR b = outbuf(argv[3], &n);
	CK_RV rv_ = fn(num(argv[1]), d, in, b, &n);
	answer(rv_, b, n);
	free(d);
	free(b);
}

/* X S OUT for the Finals. */
typedef CK_RV (*finfn)(CK_SESSION_HANDLE, CK_BYTE_PTR, CK_ULONG_PTR);
static void finout(finfn fn, int argc, char **argv)
{
	need(argc, 3);
	CK_ULONG n;
	CK_BYTE_PTR b = outbuf(argv[2], &n);
	CK_RV rv_ = fn(num(argv[1]), b, &n);
	answer(rv_, b, n);
	free(b);
}

/* X S DATA for the calls that take data and give no output. */
typedef CK_RV (*infn)(CK_SESSION_HANDLE, CK_BYTE_PTR, CK_ULONG);
static void datain(infn fn, int argc, char **argv)
{
	need(argc, 3);
	CK_ULONG in;
	CK_BYTE_PTR d = unhex(argv[2], &in);
	printf("rv=0x%lx", (unsigned long)fn(num(argv[1]), d, in));
	free(d);
}

static void do_encinit(int c, char **v) { keyinit(f->C_EncryptInit, c, v); }
static void do_enc(int c, char **v) { dataout(f->C_Encrypt, c, v); }
static void do_encupd(int c, char **v) { dataout(f->C_EncryptUpdate, c, v); }
static void do_encfin(int c, char **v) { finout(f->C_EncryptFinal, c, v); }
static void do_decinit(int c, char **v) { keyinit(f->C_DecryptInit, c, v); }
static void do_dec(int c, char **v) { dataout(f->C_Decrypt, c, v); }
static void do_decupd(int c, char **v) { dataout(f->C_DecryptUpdate, c, v); }
static void do_decfin(int c, char **v) { finout(f->C_DecryptFinal, c, v); }
static void do_dig(int c, char **v) { dataout(f->C_Digest, c, v); }
static void do_digupd(int c, char **v) { datain(f->C_DigestUpdate, c, v); }
static void do_digfin(int c, char **v) { finout(f->C_DigestFinal, c, v); }
static void do_signinit(int c, char **v) { keyinit(f->C_SignInit, c, v); }
static void do_sign(int c, char **v) { dataout(f->C_Sign, c, v); }
static void do_signupd(int c, char **v) { datain(f->C_SignUpdate, c, v); }
static void do_signfin(int c, char **v) { finout(f->C_SignFinal, c, v); }
static void do_srinit(int c, char **v) { keyinit(f->C_SignRecoverInit, c, v); }
static void do_sr(int c, char **v) { dataout(f->C_SignRecover, c, v); }
static void do_verinit(int c, char **v) { keyinit(f->C_VerifyInit, c, v); }
static void do_verupd(int c, char **v) { datain(f->C_VerifyUpdate, c, v); }
static void do_verfin(int c, char **v) { datain(f->C_VerifyFinal, c, v); }
static void do_vrinit(int c, char **v) { keyinit(f->C_VerifyRecoverInit, c, v); }
static void do_vr(int c, char **v) { dataout(f->C_VerifyRecover, c, v); }
static void do_dencupd(int c, char **v) { dataout(f->C_DigestEncryptUpdate, c, v); }
static void do_ddecupd(int c, char **v) { dataout(f->C_DecryptDigestUpdate, c, v); }
static void do_sencupd(int c, char **v) { dataout(f->C_SignEncryptUpdate, c, v); }
static void do_dverupd(int c, char **v) { dataout(f->C_DecryptVerifyUpdate, c, v); }

static void do_diginit(int argc, char **argv)
{
	need(argc, 3);
	CK_MECHANISM m = mech(argv[2]);
	printf("rv=0x%lx", (unsigned long)f->C_DigestInit(num(argv[1]), &m));
}

static void do_digkey(int argc, char **argv)
{
	need(argc, 3);
	printf("rv=0x%lx", (unsigned long)f->C_DigestKey(num(argv[1]), num(argv[2])));
}

/* ver S DATA SIG */
static void do_ver(int argc, char **argv)
{
	need(argc, 4);
	CK_ULONG in, sn;
	CK_BYTE_PTR d = unhex(argv[2], &in);
	CK_BYTE_PTR s = unhex(argv[3], &sn);
	printf("rv=0x%lx", (unsigned long)f->C_Verify(num(argv[1]), d, in, s, sn));
	free(d);
	free(s);
}

/* genkey S MECH TEMPLATE */
static void do_genkey(int argc, char **argv)
{
	need(argc, 4);
	CK_MECHANISM m = mech(argv[2]);
	CK_ULONG n;
	CK_ATTRIBUTE_PTR t = templ(argv[3], &n, 0);
	CK_OBJECT_HANDLE h = 0;
	CK_RV rv_ = f->C_GenerateKey(num(argv[1]), &m, t, n, &h);
	handle(rv_, h);
}

/* genkp S MECH PUBLIC PRIVATE: h (public) and h2 (private). */
static void do_genkp(int argc, char **argv)
{
	need(argc, 5);
	CK_MECHANISM m = mech(argv[2]);
	CK_ULONG pn, qn;
	CK_ATTRIBUTE pub[MAXATTR];
	CK_ATTRIBUTE_PTR t = templ(argv[3], &pn, 0);
	if (t)
		memcpy(pub, t, pn * sizeof *t);
	static CK_BBOOL pbools[MAXATTR];
	static CK_ULONG pulongs[MAXATTR];
	/* The public template's scalar values live in the shared arrays the
	 * private template's parse overwrites: keep copies. */
	for (CK_ULONG i = 0; i < pn; i++) {
		if (pub[i].pValue == &bools[i]) {
			pbools[i] = bools[i];
			pub[i].pValue = &pbools[i];
		} else if (pub[i].pValue == &ulongs[i]) {
			pulongs[i] = ulongs[i];
			pub[i].pValue = &pulongs[i];
		}
	}
	CK_ATTRIBUTE_PTR q = templ(argv[4], &qn, 0);
	CK_OBJECT_HANDLE h = 0, h2 = 0;
	CK_RV rv = f->C_GenerateKeyPair(num(argv[1]), &m, t ? pub : NULL, pn, q, qn, &h, &h2);
	handle(rv, h);
	if (rv == CKR_OK)
		printf(" h2=%lu", (unsigned long)h2);
}

/* wrap S MECH WRAPPING KEY OUT */
static void do_wrap(int argc, char **argv)
{
	need(argc, 6);
	CK_MECHANISM m = mech(argv[2]);
	CK_ULONG n;
	CK_BYTE_PTR b = outbuf(argv[5], &n);
	CK_RV rv_ = f->C_WrapKey(num(argv[1]), &m, num(argv[3]), num(argv[4]), b, &n);
	answer(rv_, b, n);
	free(b);
}

/* unwrap S MECH UNWRAPPING WRAPPED TEMPLATE */
static void do_unwrap(int argc, char **argv)
{
	need(argc, 6);
	CK_MECHANISM m = mech(argv[2]);
	CK_ULONG wn, n;
	CK_BYTE_PTR w = unhex(argv[4], &wn);
	CK_ATTRIBUTE_PTR t = templ(argv[5], &n, 0);
	CK_OBJECT_HANDLE h = 0;
	CK_RV rv_ = f->C_UnwrapKey(num(argv[1]), &m, num(argv[3]), w, wn, t, n, &h);
	handle(rv_, h);
	free(w);
}

/* derive S MECH BASE TEMPLATE */
static void do_derive(int argc, char **argv)
{
	need(argc, 5);
	CK_MECHANISM m = mech(argv[2]);
	CK_ULONG n;
	CK_ATTRIBUTE_PTR t = templ(argv[4], &n, 0);
	CK_OBJECT_HANDLE h = 0;
	CK_RV rv_ = f->C_DeriveKey(num(argv[1]), &m, num(argv[3]), t, n, &h);
	handle(rv_, h);
}

static void do_seed(int c, char **v) { datain(f->C_SeedRandom, c, v); }

/* random S N */
static void do_random(int argc, char **argv)
{
	need(argc, 3);
	CK_ULONG n = num(argv[2]);
	CK_BYTE_PTR b = calloc(1, n + 1);
	CK_RV rv = f->C_GenerateRandom(num(argv[1]), b, n);
	answer(rv, b, n);
	free(b);
}

static void do_funcstatus(int argc, char **argv)
{
	need(argc, 2);
	printf("rv=0x%lx", (unsigned long)f->C_GetFunctionStatus(num(argv[1])));
}

static void do_cancel(int argc, char **argv)
{
	need(argc, 2);
	printf("rv=0x%lx", (unsigned long)f->C_CancelFunction(num(argv[1])));
}

/* waitevent FLAGS (only CKF_DONT_BLOCK makes sense here). */
static void do_waitevent(int argc, char **argv)
{
	need(argc, 2);
	CK_SLOT_ID s;
	printf("rv=0x%lx", (unsigned long)f->C_WaitForSlotEvent(num(argv[1]), &s, NULL));
}

static const struct {
	const char *name;
	handler fn;
} calls[] = {
    {"init", do_init},		{"fin", do_fin},	      {"info", do_info},
    {"slots", do_slots},	{"slot", do_slot},	      {"slotinfo", do_slotinfo},
    {"tokeninfo", do_tokeninfo}, {"mechs", do_mechs},	      {"mechinfo", do_mechinfo},
    {"inittoken", do_inittoken}, {"initpin", do_initpin},     {"setpin", do_setpin},
    {"open", do_open},		{"close", do_close},	      {"closeall", do_closeall},
    {"sessinfo", do_sessinfo},	{"getopstate", do_getopstate}, {"setopstate", do_setopstate},
    {"login", do_login},	{"logout", do_logout},	      {"create", do_create},
    {"copy", do_copy},		{"destroy", do_destroy},      {"objsize", do_objsize},
    {"getattr", do_getattr},	{"setattr", do_setattr},      {"findinit", do_findinit},
    {"find", do_find},		{"findfin", do_findfin},      {"destroyall", do_destroyall},      {"encinit", do_encinit},
    {"enc", do_enc},		{"encupd", do_encupd},	      {"encfin", do_encfin},
    {"decinit", do_decinit},	{"dec", do_dec},	      {"decupd", do_decupd},
    {"decfin", do_decfin},	{"diginit", do_diginit},      {"dig", do_dig},
    {"digupd", do_digupd},	{"digkey", do_digkey},	      {"digfin", do_digfin},
    {"signinit", do_signinit},	{"sign", do_sign},	      {"signupd", do_signupd},
    {"signfin", do_signfin},	{"srinit", do_srinit},	      {"sr", do_sr},
    {"verinit", do_verinit},	{"ver", do_ver},	      {"verupd", do_verupd},
    {"verfin", do_verfin},	{"vrinit", do_vrinit},	      {"vr", do_vr},
    {"dencupd", do_dencupd},	{"ddecupd", do_ddecupd},      {"sencupd", do_sencupd},
    {"dverupd", do_dverupd},	{"genkey", do_genkey},	      {"genkp", do_genkp},
    {"wrap", do_wrap},		{"unwrap", do_unwrap},	      {"derive", do_derive},
    {"seed", do_seed},		{"random", do_random},	      {"funcstatus", do_funcstatus},
    {"cancel", do_cancel},	{"waitevent", do_waitevent},
};

static void read_pins(const char *file)
{
	FILE *fp = fopen(file, "r");
	if (fp == NULL || fgets(user_pin, sizeof user_pin, fp) == NULL || fgets(so_pin, sizeof so_pin, fp) == NULL)
		fatal("cannot read the PIN file (user PIN, then SO PIN)");
	fclose(fp);
	user_pin[strcspn(user_pin, "\r\n")] = 0;
	so_pin[strcspn(so_pin, "\r\n")] = 0;
}

int main(int argc, char **argv)
{
	if (argc != 3)
		fatal("usage: p11drive MODULE PIN_FILE");
	read_pins(argv[2]);
	void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (h == NULL)
		fatal(dlerror());
	CK_RV (*get)(CK_FUNCTION_LIST_PTR_PTR) = (CK_RV(*)(CK_FUNCTION_LIST_PTR_PTR))dlsym(h, "C_GetFunctionList");
	if (get == NULL || get(&f) != CKR_OK)
		fatal("no function list");
	static char line[4 * MAXBUF];
	while (fgets(line, sizeof line, stdin) != NULL) {
		char *argv2[MAXARGS];
		int n = 0;
		for (char *p = strtok(line, " \t\r\n"); p && n < MAXARGS; p = strtok(NULL, " \t\r\n"))
			argv2[n++] = p;
		if (n == 0)
			continue;
		size_t i;
		for (i = 0; i < sizeof calls / sizeof calls[0]; i++)
			if (strcmp(calls[i].name, argv2[0]) == 0)
				break;
		if (i == sizeof calls / sizeof calls[0])
			fatal("unknown call");
		calls[i].fn(n, argv2);
		printf("\n");
		fflush(stdout);
	}
	return 0;
}
