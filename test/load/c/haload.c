/*
 * haload — a load generator for a PKCS#11 module, used by the demo
 * (cmd/hademo) and the chaos soak (test/soak) to drive libhapkcs11.so the
 * way an application does: several threads, one session each, until its
 * standard input closes.
 *
 * usage: haload -m MODULE -s SLOT -p PIN_FILE -k EC_KEY_LABEL
 *               [-t THREADS] [-x sign|mixed] [-o SIGFILE] [-i TICK_MS]
 *               [-a AES_KEY_LABEL] [-c data|keypair] [-n PREFIX] [-r SEED]
 *               [-l LOCK_FILE] [-R OPS_PER_SECOND]
 *
 *   sign   every thread signs (CKM_ECDSA, 32 bytes) in a loop;
 *   mixed  every thread picks, with a seeded generator, one of: sign,
 *          verify (a good signature must verify, a corrupted one must be
 *          refused with CKR_SIGNATURE_INVALID), AES-ECB encrypt and
 *          decrypt round trip (with -a), find the key by label, random; and
 *          now and then creates a token object (-c data: a data object;
 *          -c keypair: an EC P-256 key pair) or destroys one it created.
 *
 * With -R, the threads together offer OPS_PER_SECOND operations a second
 * on a fixed schedule (each thread its share, staggered) instead of as
 * many as the module answers: an open load whose total does not depend on
 * how fast the members are, as long as they keep up. A thread a little
 * behind (a slow call) catches up; one more than 200 ms behind (the group
 * stalled) skips the slots it missed rather than bursting to make them up.
 *
 * With -l, every object creation and destruction holds an exclusive
 * flock(2) on LOCK_FILE, so that several load processes (and the soak's Go
 * side) never create objects on one token at once: SoftHSM 2.6 answers
 * concurrent creates on one token with CKR_GENERAL_ERROR or
 * CKR_TEMPLATE_INCONSISTENT, and a real HSM would not.
 *
 * Every successful C_Sign's input and signature is appended to SIGFILE
 * (32 data bytes, 64 signature bytes per record) so the driver can verify
 * each signature independently, without the HSM.
 *
 * Output (stdout, one line each):
 *   ready
 *   tick UNIX_MS OK FAILED MAXLAT_US        every TICK_MS (default 100)
 *   error OP rv=0xNN                        the first 50 failures
 *   created LABEL / destroyed LABEL         successful object life-cycle calls
 *   createfail LABEL rv=0xNN / destroyfail LABEL rv=0xNN
 *   pub HEX                                 the EC key's CKA_EC_POINT
 *   op NAME ok=N failed=N                   per operation, at the end
 *   total ops=N failed=N bad=N maxlat_us=N at_ms=UNIX_MS
 * A thread whose session or login is gone (after a full outage under
 * activeBasic every session is lost) opens a new session, logs in and finds
 * its keys again, as a well-behaved application does; "reopens N" counts it.
 * "bad" counts wrong answers: a good signature refused, a corrupted one
 * accepted, a decryption that does not give back the plaintext, a find
 * that does not find exactly one key. The PIN is read from a file, never
 * from argv, and never printed.
 */
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <unistd.h>

#include "common.h"

enum op { OP_SIGN, OP_VERIFY, OP_CRYPT, OP_FIND, OP_RANDOM, OP_CREATE, OP_DESTROY, N_OPS };
static const char *op_names[N_OPS] = {"sign", "verify", "crypt", "find", "random", "create", "destroy"};

static CK_FUNCTION_LIST_PTR f;
static CK_SLOT_ID slot;
static const char *key_label, *aes_label, *prefix = "haload";
static int mixed, keypairs;
static long tick_ms = 100;
static FILE *sigfile;
static int lockfd = -1;

/* lifecycle_lock serialises object creation and destruction with the
 * other load processes (-l). */
static void lifecycle_lock(void)
{
	if (lockfd >= 0)
		while (flock(lockfd, LOCK_EX) != 0 && errno == EINTR)
			;
}

static void lifecycle_unlock(void)
{
	if (lockfd >= 0)
		flock(lockfd, LOCK_UN);
}
static volatile int stopping;

static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t sig_lock = PTHREAD_MUTEX_INITIALIZER;

/* Counters: per operation, and per tick (reset by the ticker). */
static unsigned long ok_by_op[N_OPS], failed_by_op[N_OPS], bad;
static unsigned long tick_ok, tick_failed, tick_maxlat;
static unsigned long max_lat_us, max_lat_at_ms, errors_shown[N_OPS], reopens;
static char pin[256];
static CK_ULONG pinlen;
static __thread CK_RV last_rv; /* the last call's result, on this thread */

struct worker {
	pthread_t thread;
	int index;
	CK_SESSION_HANDLE s;
	CK_OBJECT_HANDLE priv, pub, aes;
	unsigned long long rng;
	CK_BYTE last_data[32], last_sig[64];
	int have_sig;
	char **created; /* labels of objects this thread made and not destroyed */
	int ncreated, cap;
	int retrying;   /* an earlier destroy of created[0] failed */
	unsigned long made;
	long long next_ns; /* -R: when this thread's next operation is due */
};

static double offered_rate; /* -R: operations per second, all threads; 0: unpaced */
static int nthreads = 4;

static long long mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* pace waits for this thread's next slot in the -R schedule. */
static void pace(struct worker *w)
{
	if (offered_rate <= 0)
		return;
	long long period = (long long)(nthreads * 1e9 / offered_rate), now = mono_ns();
	if (w->next_ns == 0)
		w->next_ns = now + period * w->index / nthreads;
	if (now > w->next_ns + 200000000LL)
		w->next_ns = now; /* a stall's slots are not made up */
	while (now < w->next_ns && !stopping) {
		struct timespec ts = {w->next_ns / 1000000000LL, w->next_ns % 1000000000LL};
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
		now = mono_ns();
	}
	w->next_ns += period;
}

static double wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static unsigned long long next_rand(struct worker *w)
{
	/* xorshift64*: seeded per thread, so a run can be replayed. */
	w->rng ^= w->rng >> 12;
	w->rng ^= w->rng << 25;
	w->rng ^= w->rng >> 27;
	return w->rng * 2685821657736338717ULL;
}

/* history writes one object life-cycle call's invoke and return (wall
 * clock, ms) and its outcome, for the soak's history checker
 * (test/soak/history); the caller holds out_lock. */
static void history(const char *kind, const char *label, int thread, double invoked, double returned, CK_RV rv,
		    CK_ULONG found)
{
	printf("hist %s %s %d %.3f %.3f 0x%lx %lu\n", kind, label, thread, invoked, returned, (unsigned long)rv,
	       (unsigned long)found);
}

/* done records one finished call: its outcome and how long it took. */
static void done(enum op op, CK_RV rv, double start_ms)
{
	double end = wall_ms();
	unsigned long lat = (unsigned long)((end - start_ms) * 1000.0);
	last_rv = rv;
	pthread_mutex_lock(&out_lock);
	if (rv == CKR_OK) {
		ok_by_op[op]++;
		tick_ok++;
	} else {
		failed_by_op[op]++;
		tick_failed++;
		if (errors_shown[op]++ < 5) {
			printf("error %s rv=0x%lx\n", op_names[op], (unsigned long)rv);
			fflush(stdout);
		}
	}
	if (lat > tick_maxlat)
		tick_maxlat = lat;
	if (lat > max_lat_us) {
		max_lat_us = lat;
		max_lat_at_ms = (unsigned long)start_ms;
	}
	pthread_mutex_unlock(&out_lock);
}

static void wrong(const char *what)
{
	pthread_mutex_lock(&out_lock);
	bad++;
	printf("bad %s\n", what);
	fflush(stdout);
	pthread_mutex_unlock(&out_lock);
}

static void do_sign(struct worker *w, unsigned long i)
{
	CK_MECHANISM m = {CKM_ECDSA, NULL, 0};
	CK_BYTE data[32], sig[64];
	CK_ULONG n = sizeof sig;
	for (int k = 0; k < 4; k++) {
		unsigned long long r = next_rand(w);
		memcpy(data + 8 * k, &r, 8);
	}
	memcpy(data, &i, sizeof i);
	data[8] = (CK_BYTE)w->index;
	double t = wall_ms();
	CK_RV rv = f->C_SignInit(w->s, &m, w->priv);
	if (rv == CKR_OK)
		rv = f->C_Sign(w->s, data, sizeof data, sig, &n);
	done(OP_SIGN, rv, t);
	if (rv != CKR_OK)
		return;
	memcpy(w->last_data, data, sizeof data);
	memcpy(w->last_sig, sig, sizeof sig);
	w->have_sig = 1;
	if (sigfile) {
		pthread_mutex_lock(&sig_lock);
		fwrite(data, 1, sizeof data, sigfile);
		fwrite(sig, 1, sizeof sig, sigfile);
		pthread_mutex_unlock(&sig_lock);
	}
}

static void do_verify(struct worker *w)
{
	CK_MECHANISM m = {CKM_ECDSA, NULL, 0};
	CK_BYTE sig[64];
	if (!w->have_sig) {
		do_sign(w, 0);
		return;
	}
	int corrupt = (next_rand(w) % 4) == 0;
	memcpy(sig, w->last_sig, sizeof sig);
	if (corrupt)
		sig[10] ^= 0x40;
	double t = wall_ms();
	CK_RV rv = f->C_VerifyInit(w->s, &m, w->pub);
	if (rv == CKR_OK)
		rv = f->C_Verify(w->s, w->last_data, sizeof w->last_data, sig, sizeof sig);
	if (corrupt) {
		/* The right answer is CKR_SIGNATURE_INVALID: the call worked. */
		if (rv == CKR_SIGNATURE_INVALID) {
			done(OP_VERIFY, CKR_OK, t);
		} else if (rv == CKR_OK) {
			done(OP_VERIFY, CKR_OK, t);
			wrong("verify accepted a corrupted signature");
		} else {
			done(OP_VERIFY, rv, t);
		}
		return;
	}
	if (rv == CKR_SIGNATURE_INVALID) {
		done(OP_VERIFY, CKR_OK, t);
		wrong("verify refused a good signature");
		return;
	}
	done(OP_VERIFY, rv, t);
}

static void do_crypt(struct worker *w)
{
	/* CKM_AES_ECB on two blocks: p11-kit 0.24's RPC carries no IV, so
	 * CBC modes give CKR_MECHANISM_INVALID on a p11-kit-served member. */
	CK_BYTE plain[32], ct[48], back[48];
	CK_ULONG nct = sizeof ct, nback = sizeof back;
	for (int k = 0; k < 4; k++) {
		unsigned long long r = next_rand(w);
		memcpy(plain + 8 * k, &r, 8);
	}
	CK_MECHANISM m = {CKM_AES_ECB, NULL, 0};
	double t = wall_ms();
	CK_RV rv = f->C_EncryptInit(w->s, &m, w->aes);
	if (rv == CKR_OK)
		rv = f->C_Encrypt(w->s, plain, sizeof plain, ct, &nct);
	done(OP_CRYPT, rv, t);
	if (rv != CKR_OK)
		return;
	t = wall_ms();
	rv = f->C_DecryptInit(w->s, &m, w->aes);
	if (rv == CKR_OK)
		rv = f->C_Decrypt(w->s, ct, nct, back, &nback);
	done(OP_CRYPT, rv, t);
	if (rv == CKR_OK && (nback != sizeof plain || memcmp(back, plain, sizeof plain) != 0))
		wrong("decrypt did not give back the plaintext");
}

/* find_label counts the objects of class cls labelled l (at most 4). */
static CK_RV find_label(CK_SESSION_HANDLE s, CK_OBJECT_CLASS cls, const char *l, CK_OBJECT_HANDLE *h, CK_ULONG *n)
{
	CK_ATTRIBUTE t[] = {
		{CKA_CLASS, &cls, sizeof cls},
		{CKA_LABEL, (void *)l, strlen(l)},
	};
	CK_RV rv = f->C_FindObjectsInit(s, t, 2);
	if (rv != CKR_OK)
		return rv;
	rv = f->C_FindObjects(s, h, 4, n);
	CK_RV rv2 = f->C_FindObjectsFinal(s);
	return rv != CKR_OK ? rv : rv2;
}

static void do_find(struct worker *w)
{
	CK_OBJECT_HANDLE h[4];
	CK_ULONG n = 0;
	double t = wall_ms();
	CK_RV rv = find_label(w->s, CKO_PRIVATE_KEY, key_label, h, &n);
	done(OP_FIND, rv, t);
	if (rv == CKR_OK && (n != 1 || h[0] != w->priv))
		wrong("find did not return exactly the signing key");
}

static void do_random(struct worker *w)
{
	CK_BYTE buf[32];
	double t = wall_ms();
	CK_RV rv = f->C_GenerateRandom(w->s, buf, sizeof buf);
	done(OP_RANDOM, rv, t);
}

static void do_create(struct worker *w)
{
	char label[96];
	CK_BBOOL yes = CK_TRUE, no = CK_FALSE;
	CK_BYTE id[8];
	unsigned long long r = next_rand(w);
	memcpy(id, &r, sizeof id);
	snprintf(label, sizeof label, "%s-%d-%lu", prefix, w->index, w->made++);
	CK_RV rv;
	double invoked = wall_ms();
	if (keypairs) {
		static CK_BYTE p256[] = {0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07};
		CK_MECHANISM m = {CKM_EC_KEY_PAIR_GEN, NULL, 0};
		CK_ATTRIBUTE pub[] = {
		    {CKA_TOKEN, &yes, sizeof yes},         {CKA_PRIVATE, &no, sizeof no},
		    {CKA_LABEL, label, strlen(label)},     {CKA_ID, id, sizeof id},
		    {CKA_EC_PARAMS, p256, sizeof p256},    {CKA_VERIFY, &yes, sizeof yes},
		};
		CK_ATTRIBUTE priv[] = {
		    {CKA_TOKEN, &yes, sizeof yes},     {CKA_PRIVATE, &yes, sizeof yes},
		    {CKA_LABEL, label, strlen(label)}, {CKA_ID, id, sizeof id},
		    {CKA_SIGN, &yes, sizeof yes},      {CKA_SENSITIVE, &yes, sizeof yes},
		};
		CK_OBJECT_HANDLE hpub, hpriv;
		rv = f->C_GenerateKeyPair(w->s, &m, pub, 6, priv, 6, &hpub, &hpriv);
	} else {
		CK_OBJECT_CLASS cls = CKO_DATA;
		CK_BYTE value[64];
		for (int k = 0; k < 8; k++) {
			unsigned long long v = next_rand(w);
			memcpy(value + 8 * k, &v, 8);
		}
		CK_ATTRIBUTE tmpl[] = {
		    {CKA_CLASS, &cls, sizeof cls},     {CKA_TOKEN, &yes, sizeof yes},
		    {CKA_PRIVATE, &no, sizeof no},     {CKA_LABEL, label, strlen(label)},
		    {CKA_VALUE, value, sizeof value},  {CKA_APPLICATION, "haload", 6},
		};
		CK_OBJECT_HANDLE h;
		rv = f->C_CreateObject(w->s, tmpl, 6, &h);
	}
	double returned = wall_ms();
	/* Object life-cycle calls are not single-part operations: a failure
	 * (the engine makes an object everywhere or nowhere) is counted apart
	 * and reported with its label. */
	pthread_mutex_lock(&out_lock);
	history("create", label, w->index, invoked, returned, rv, 0);
	if (rv == CKR_OK) {
		ok_by_op[OP_CREATE]++;
		printf("created %s\n", label);
	} else {
		failed_by_op[OP_CREATE]++;
		printf("createfail %s rv=0x%lx\n", label, (unsigned long)rv);
	}
	fflush(stdout);
	pthread_mutex_unlock(&out_lock);
	if (rv != CKR_OK)
		return;
	if (w->ncreated == w->cap) {
		w->cap = w->cap ? 2 * w->cap : 16;
		w->created = realloc(w->created, w->cap * sizeof *w->created);
	}
	w->created[w->ncreated++] = strdup(label);
}

static void do_destroy(struct worker *w)
{
	if (w->ncreated == 0) {
		do_create(w);
		return;
	}
	char *label = w->created[0];
	CK_OBJECT_CLASS classes[2] = {CKO_DATA, 0};
	int nclasses = 1;
	if (keypairs) {
		classes[0] = CKO_PRIVATE_KEY;
		classes[1] = CKO_PUBLIC_KEY;
		nclasses = 2;
	}
	CK_RV rv = CKR_OK;
	CK_ULONG found = 0;
	int halves = 0; /* classes found */
	double invoked = wall_ms();
	for (int c = 0; c < nclasses && rv == CKR_OK; c++) {
		CK_OBJECT_HANDLE h[4];
		CK_ULONG n = 0;
		rv = find_label(w->s, classes[c], label, h, &n);
		found += n;
		halves += n > 0;
		for (CK_ULONG k = 0; rv == CKR_OK && k < n; k++)
			rv = f->C_DestroyObject(w->s, h[k]);
	}
	double returned = wall_ms();
	pthread_mutex_lock(&out_lock);
	history("destroy", label, w->index, invoked, returned, rv, found);
	pthread_mutex_unlock(&out_lock);
	/* A pair this thread made and never touched since has both halves:
	 * one missing is a wrong answer (a destroy without its tombstone, or a
	 * search that missed an object), never a destroy to count. */
	if (rv == CKR_OK && found > 0 && halves != nclasses && !w->retrying) {
		pthread_mutex_lock(&out_lock);
		bad++;
		printf("bad find saw one half of the key pair %s, created by this thread\n", label);
		fflush(stdout);
		pthread_mutex_unlock(&out_lock);
	}
	/* An object this thread made and never destroyed must be found; after
	 * a failed destroy it may be gone already. */
	if (rv == CKR_OK && found == 0 && !w->retrying) {
		/* Not destroyed: it stays among the created objects the driver
		 * expects on every member. */
		pthread_mutex_lock(&out_lock);
		bad++;
		printf("bad find did not see %s, created by this thread\n", label);
		fflush(stdout);
		pthread_mutex_unlock(&out_lock);
		free(label);
		memmove(w->created, w->created + 1, (w->ncreated - 1) * sizeof *w->created);
		w->ncreated--;
		return;
	}
	pthread_mutex_lock(&out_lock);
	if (rv == CKR_OK) {
		ok_by_op[OP_DESTROY]++;
		printf("destroyed %s\n", label);
	} else {
		failed_by_op[OP_DESTROY]++;
		printf("destroyfail %s rv=0x%lx\n", label, (unsigned long)rv);
	}
	fflush(stdout);
	pthread_mutex_unlock(&out_lock);
	if (rv != CKR_OK) {
		w->retrying = 1;
		return; /* tried again later */
	}
	w->retrying = 0;
	free(label);
	memmove(w->created, w->created + 1, (w->ncreated - 1) * sizeof *w->created);
	w->ncreated--;
}

/* lost reports whether rv says the session, the login or a handle is gone. */
static int lost(CK_RV rv)
{
	return rv == CKR_SESSION_HANDLE_INVALID || rv == CKR_SESSION_CLOSED || rv == CKR_USER_NOT_LOGGED_IN ||
	       rv == CKR_OBJECT_HANDLE_INVALID || rv == CKR_KEY_HANDLE_INVALID;
}

/* find1 finds the one object of class cls labelled l, 0 if not exactly one. */
static CK_OBJECT_HANDLE find1(CK_SESSION_HANDLE s, CK_OBJECT_CLASS cls, const char *l)
{
	CK_OBJECT_HANDLE h[4];
	CK_ULONG n = 0;
	if (find_label(s, cls, l, h, &n) != CKR_OK || n != 1)
		return 0;
	return h[0];
}

/* reopen gives the thread a new session, logged in, with its keys found
 * again; it returns 0 when that worked. */
static int reopen(struct worker *w)
{
	f->C_CloseSession(w->s);
	CK_RV rv = f->C_OpenSession(slot, CKF_SERIAL_SESSION | CKF_RW_SESSION, NULL, NULL, &w->s);
	if (rv != CKR_OK)
		return -1;
	rv = f->C_Login(w->s, CKU_USER, (CK_UTF8CHAR_PTR)pin, pinlen);
	if (rv != CKR_OK && rv != CKR_USER_ALREADY_LOGGED_IN)
		return -1;
	w->priv = find1(w->s, CKO_PRIVATE_KEY, key_label);
	w->pub = find1(w->s, CKO_PUBLIC_KEY, key_label);
	if (aes_label)
		w->aes = find1(w->s, CKO_SECRET_KEY, aes_label);
	if (!w->priv || !w->pub || (aes_label && !w->aes))
		return -1;
	__sync_fetch_and_add(&reopens, 1);
	return 0;
}

static void *run(void *arg)
{
	struct worker *w = arg;
	unsigned long i = 0;
	while (!stopping) {
		i++;
		if (lost(last_rv)) {
			if (reopen(w) != 0) {
				struct timespec ts = {0, 50 * 1000000L};
				nanosleep(&ts, NULL); /* the group is still down: try again soon */
				continue;
			}
			last_rv = CKR_OK;
		}
		pace(w);
		if (stopping)
			break;
		if (!mixed) {
			do_sign(w, i);
			continue;
		}
		unsigned pick = (unsigned)(next_rand(w) % 1000);
		if (pick < 400)
			do_sign(w, i);
		else if (pick < 600)
			do_verify(w);
		else if (pick < 800 && aes_label)
			do_crypt(w);
		else if (pick < 900)
			do_find(w);
		else if (pick < 988)
			do_random(w);
		else if (pick < 994) {
			lifecycle_lock();
			do_create(w);
			lifecycle_unlock();
		} else {
			lifecycle_lock();
			do_destroy(w);
			lifecycle_unlock();
		}
	}
	return NULL;
}

/* ticker prints the counts of each tick, so the driver can plot them. */
static void *ticker(void *arg)
{
	(void)arg;
	while (!stopping) {
		struct timespec ts = {tick_ms / 1000, (tick_ms % 1000) * 1000000L};
		nanosleep(&ts, NULL);
		pthread_mutex_lock(&out_lock);
		printf("tick %.0f %lu %lu %lu\n", wall_ms(), tick_ok, tick_failed, tick_maxlat);
		fflush(stdout);
		tick_ok = tick_failed = tick_maxlat = 0;
		pthread_mutex_unlock(&out_lock);
	}
	return NULL;
}

static void usage(void)
{
	fprintf(stderr, "usage: haload -m MODULE -s SLOT -p PIN_FILE -k EC_KEY_LABEL [-t THREADS] [-x sign|mixed]\n"
			"              [-o SIGFILE] [-i TICK_MS] [-a AES_KEY_LABEL] [-c data|keypair] [-n PREFIX] [-r SEED]\n"
			"              [-l LOCK_FILE] [-R OPS_PER_SECOND]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *module = NULL, *pinfile = NULL, *sigpath = NULL;
	int c;
	unsigned long long seed = 1;

	slot = (CK_SLOT_ID)-1;
	while ((c = getopt(argc, argv, "m:s:p:k:t:x:o:i:a:c:n:r:l:R:")) != -1) {
		switch (c) {
		case 'm': module = optarg; break;
		case 's': slot = strtoul(optarg, NULL, 0); break;
		case 'p': pinfile = optarg; break;
		case 'k': key_label = optarg; break;
		case 't': nthreads = atoi(optarg); break;
		case 'x':
			if (strcmp(optarg, "mixed") == 0)
				mixed = 1;
			else if (strcmp(optarg, "sign") != 0)
				usage();
			break;
		case 'o': sigpath = optarg; break;
		case 'i': tick_ms = atol(optarg); break;
		case 'a': aes_label = optarg; break;
		case 'c':
			if (strcmp(optarg, "keypair") == 0)
				keypairs = 1;
			else if (strcmp(optarg, "data") != 0)
				usage();
			break;
		case 'n': prefix = optarg; break;
		case 'r': seed = strtoull(optarg, NULL, 0); break;
		case 'R': offered_rate = atof(optarg); break;
		case 'l':
			lockfd = open(optarg, O_RDWR | O_CREAT, 0600);
			if (lockfd < 0) {
				fprintf(stderr, "FATAL open lock file %s: %s\n", optarg, strerror(errno));
				return 2;
			}
			break;
		default: usage();
		}
	}
	if (!module || slot == (CK_SLOT_ID)-1 || !pinfile || !key_label || nthreads < 1 || nthreads > 64 || tick_ms < 10 || offered_rate < 0)
		usage();
	if (sigpath) {
		sigfile = fopen(sigpath, "wb");
		if (!sigfile) {
			fprintf(stderr, "FATAL open %s: %s\n", sigpath, strerror(errno));
			return 2;
		}
	}
	f = load_module(module, NULL);
	pinlen = read_pin(pinfile, pin, sizeof pin);

	CK_C_INITIALIZE_ARGS a;
	memset(&a, 0, sizeof a);
	a.flags = CKF_OS_LOCKING_OK;
	CHECK(f->C_Initialize(&a));
	struct worker *ws = calloc(nthreads, sizeof *ws);
	for (int i = 0; i < nthreads; i++) {
		struct worker *w = &ws[i];
		w->index = i;
		w->rng = seed * 0x9E3779B97F4A7C15ULL + (unsigned long long)(i + 1) * 0xBF58476D1CE4E5B9ULL;
		if (w->rng == 0)
			w->rng = 1;
		CHECK(f->C_OpenSession(slot, CKF_SERIAL_SESSION | CKF_RW_SESSION, NULL, NULL, &w->s));
		if (i == 0)
			CHECK(f->C_Login(w->s, CKU_USER, (CK_UTF8CHAR_PTR)pin, pinlen));
		w->priv = find_one(f, w->s, CKO_PRIVATE_KEY, key_label);
		w->pub = find_one(f, w->s, CKO_PUBLIC_KEY, key_label);
		if (aes_label)
			w->aes = find_one(f, w->s, CKO_SECRET_KEY, aes_label);
	}
	printf("ready\n");
	fflush(stdout);
	pthread_t tick;
	pthread_create(&tick, NULL, ticker, NULL);
	for (int i = 0; i < nthreads; i++)
		pthread_create(&ws[i].thread, NULL, run, &ws[i]);

	/* Run until the driver closes our standard input. */
	char buf[64];
	while (fgets(buf, sizeof buf, stdin) != NULL)
		;
	stopping = 1;
	for (int i = 0; i < nthreads; i++)
		pthread_join(ws[i].thread, NULL);
	pthread_join(tick, NULL);
	if (sigfile)
		fclose(sigfile);

	/* The report comes out even when the session is gone (a full outage
	 * under activeBasic invalidates the application's sessions). */
	CK_BYTE point[256];
	CK_ATTRIBUTE t = {CKA_EC_POINT, point, sizeof point};
	CK_RV prv = f->C_GetAttributeValue(ws[0].s, ws[0].pub, &t, 1);
	if (prv == CKR_OK) {
		printf("pub ");
		for (CK_ULONG i = 0; i < t.ulValueLen; i++)
			printf("%02x", point[i]);
		printf("\n");
	} else {
		printf("error pub rv=0x%lx\n", (unsigned long)prv);
	}
	unsigned long ops = 0, failed = 0;
	for (int o = 0; o < N_OPS; o++) {
		printf("op %s ok=%lu failed=%lu\n", op_names[o], ok_by_op[o], failed_by_op[o]);
		if (o != OP_CREATE && o != OP_DESTROY) {
			ops += ok_by_op[o] + failed_by_op[o];
			failed += failed_by_op[o];
		}
	}
	printf("reopens %lu\n", reopens);
	printf("total ops=%lu failed=%lu bad=%lu maxlat_us=%lu at_ms=%lu\n", ops, failed, bad, max_lat_us, max_lat_at_ms);
	memset(pin, 0, sizeof pin);
	fflush(stdout);
	CHECK(f->C_Finalize(NULL));
	return 0;
}
