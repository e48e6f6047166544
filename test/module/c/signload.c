/*
 * signload — signs in N threads through a PKCS#11 module until its standard
 * input closes, for the failover test: every C_Sign must succeed and every
 * signature must verify while a member of the group dies and comes back.
 *
 * usage: signload MODULE SLOT_ID PIN_FILE KEY_LABEL THREADS
 *
 * Prints "ready" once every thread has its session, then "progress N" (N =
 * signatures so far) after every 200 signatures, and at the end
 * "pub HEX" (the key's CKA_EC_POINT), one "sample DATAHEX SIGHEX" per
 * thread (its last signature, for an independent check), and
 * "total signed=N sign_failed=N verify_failed=N". The first failures are
 * reported as "error ..." lines with their CKR code.
 */
#include <pthread.h>
#include <unistd.h>

#include "common.h"

static CK_FUNCTION_LIST_PTR f;
static CK_SLOT_ID slot;
static const char *label;

static unsigned long signed_ok, sign_failed, verify_failed, errors_shown;
static volatile int stopping;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

struct worker {
	pthread_t thread;
	CK_SESSION_HANDLE s;
	CK_OBJECT_HANDLE priv, pub;
	CK_BYTE data[32], sig[64];
	CK_ULONG siglen;
	int have;
};

static void report(const char *what, CK_RV rv)
{
	pthread_mutex_lock(&out_lock);
	if (errors_shown++ < 20)
		printf("error %s rv=0x%lx\n", what, (unsigned long)rv);
	fflush(stdout);
	pthread_mutex_unlock(&out_lock);
}

static void *run(void *arg)
{
	struct worker *w = arg;
	CK_MECHANISM m = {CKM_ECDSA, NULL, 0};
	unsigned long i = 0;
	while (!stopping) {
		CK_BYTE data[32], sig[64];
		CK_ULONG n = sizeof sig;
		CK_RV rv;
		memset(data, 0, sizeof data);
		memcpy(data, &w, sizeof w);
		memcpy(data + 16, &i, sizeof i);
		i++;
		rv = f->C_SignInit(w->s, &m, w->priv);
		if (rv == CKR_OK)
			rv = f->C_Sign(w->s, data, sizeof data, sig, &n);
		if (rv != CKR_OK) {
			__sync_fetch_and_add(&sign_failed, 1);
			report("C_Sign", rv);
			continue;
		}
		rv = f->C_VerifyInit(w->s, &m, w->pub);
		if (rv == CKR_OK)
			rv = f->C_Verify(w->s, data, sizeof data, sig, n);
		if (rv != CKR_OK) {
			__sync_fetch_and_add(&verify_failed, 1);
			report("C_Verify", rv);
			continue;
		}
		memcpy(w->data, data, sizeof data);
		memcpy(w->sig, sig, n);
		w->siglen = n;
		w->have = 1;
		unsigned long total = __sync_add_and_fetch(&signed_ok, 1);
		if (total % 200 == 0) {
			pthread_mutex_lock(&out_lock);
			printf("progress %lu\n", total);
			fflush(stdout);
			pthread_mutex_unlock(&out_lock);
		}
	}
	return NULL;
}

static void hex(const CK_BYTE *b, CK_ULONG n)
{
	for (CK_ULONG i = 0; i < n; i++)
		printf("%02x", b[i]);
}

int main(int argc, char **argv)
{
	char pin[256];
	CK_ULONG pinlen;
	int nthreads;
	struct worker *ws;

	if (argc != 6) {
		fprintf(stderr, "usage: signload MODULE SLOT_ID PIN_FILE KEY_LABEL THREADS\n");
		return 2;
	}
	f = load_module(argv[1], NULL);
	slot = strtoul(argv[2], NULL, 0);
	pinlen = read_pin(argv[3], pin, sizeof pin);
	label = argv[4];
	nthreads = atoi(argv[5]);
	if (nthreads < 1 || nthreads > 64)
		nthreads = 8;
	ws = calloc(nthreads, sizeof *ws);

	CK_C_INITIALIZE_ARGS a;
	memset(&a, 0, sizeof a);
	a.flags = CKF_OS_LOCKING_OK;
	CHECK(f->C_Initialize(&a));
	for (int i = 0; i < nthreads; i++) {
		CHECK(f->C_OpenSession(slot, CKF_SERIAL_SESSION, NULL, NULL, &ws[i].s));
		if (i == 0)
			CHECK(f->C_Login(ws[0].s, CKU_USER, (CK_UTF8CHAR_PTR)pin, pinlen));
		ws[i].priv = find_one(f, ws[i].s, CKO_PRIVATE_KEY, label);
		ws[i].pub = find_one(f, ws[i].s, CKO_PUBLIC_KEY, label);
	}
	printf("ready\n");
	fflush(stdout);
	for (int i = 0; i < nthreads; i++)
		pthread_create(&ws[i].thread, NULL, run, &ws[i]);

	/* Run until the driver closes our standard input. */
	char buf[64];
	while (fgets(buf, sizeof buf, stdin) != NULL)
		;
	stopping = 1;
	for (int i = 0; i < nthreads; i++)
		pthread_join(ws[i].thread, NULL);

	CK_BYTE point[256];
	CK_ATTRIBUTE t = {CKA_EC_POINT, point, sizeof point};
	CHECK(f->C_GetAttributeValue(ws[0].s, ws[0].pub, &t, 1));
	printf("pub ");
	hex(point, t.ulValueLen);
	printf("\n");
	for (int i = 0; i < nthreads; i++) {
		if (!ws[i].have)
			continue;
		printf("sample ");
		hex(ws[i].data, sizeof ws[i].data);
		printf(" ");
		hex(ws[i].sig, ws[i].siglen);
		printf("\n");
	}
	printf("total signed=%lu sign_failed=%lu verify_failed=%lu\n", signed_ok, sign_failed, verify_failed);
	fflush(stdout);
	CHECK(f->C_Finalize(NULL));
	return 0;
}
