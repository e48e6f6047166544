/*
 * entry.c — C_GetFunctionList, C_Initialize, C_Finalize, the static
 * function list, fork detection and the application's locking.
 */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "hapkcs11.h"
#include "entry.h"
#include "rpc.h"
#include "_cgo_export.h"

/* Set in the child of a fork() by the handler pthread_atfork registers
 * when the library is loaded: a flag rather than a getpid() per call, which
 * is a system call, and a signature is two calls (docs/BENCHMARKS.md).
 * The child has no Go runtime: its C_Initialize starts a helper (conn.c). */
static volatile int in_child_flag;

/* Serialises C_Initialize and C_Finalize with each other. */
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;

static void hap_in_child(void)
{
	in_child_flag = 1;
	/* The child is one thread: whatever another thread of the parent
	 * held is held by no one here. */
	init_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
	hap_remote_forget();
}

/* Set in a helper (hap_helper_serve): its C_Initialize runs the engine
 * here, whatever the configuration says. */
int hap_serving;

/* Runs when the library is loaded, in the loading process. */
__attribute__((constructor)) static void hap_watch_fork(void)
{
	pthread_atfork(NULL, NULL, hap_in_child);
}

/* Set by an atexit handler registered at the end of every successful
 * C_Initialize, so that it runs before the exit handlers of the member
 * modules C_Initialize loaded (SoftHSM's C++ destructors) and before the
 * application's own cleanup (OpenSSL's, registered earlier), which may
 * still call C_CloseAllSessions or C_Finalize: those calls must not reach
 * a member module that has already torn itself down. */
static volatile int exiting;

static void hap_at_exit(void)
{
	exiting = 1;
}

int hap_is_child(void)
{
	return in_child_flag;
}

int hap_forked(void)
{
	return exiting || in_child_flag;
}

/* The next time the calling thread is due to yield to the Go scheduler
 * (see procs.go), on CLOCK_MONOTONIC in ns. */
static __thread long long yield_at;

#define YIELD_EVERY_NS 8000000LL

int hap_yield_due(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	long long now = (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
	if (now < yield_at)
		return 0;
	yield_at = now + YIELD_EVERY_NS;
	return 1;
}

/* The application's mutex, when it asked for its own locking. Written only
 * under init_lock while no other call may run (the spec forbids calls
 * concurrent with C_Initialize/C_Finalize). */
static CK_C_INITIALIZE_ARGS app_fns;
static CK_VOID_PTR app_mutex;

CK_RV hap_app_lock(void)
{
	if (app_mutex == NULL)
		return CKR_OK;
	if (app_fns.LockMutex(app_mutex) != CKR_OK)
		return CKR_CANT_LOCK;
	return CKR_OK;
}

void hap_app_unlock(void)
{
	if (app_mutex != NULL)
		app_fns.UnlockMutex(app_mutex);
}

/* start runs the engine: in this process, or in a helper when this is a
 * forked child (no Go runtime) or the configuration asks for one. */
static CK_RV start(CK_FLAGS flags)
{
	CK_RV rv;

	if (hap_remote() || in_child_flag)
		return hap_remote_initialize();
	rv = hapInitialize(flags, hap_serving);
	if (rv == HAP_RV_USE_HELPER)
		return hap_remote_initialize();
	if (rv == CKR_OK) {
		atexit(hap_at_exit);
		hap_save_env();
	}
	return rv;
}

CK_RV C_Initialize(CK_VOID_PTR pInitArgs)
{
	CK_C_INITIALIZE_ARGS *args = pInitArgs;
	CK_FLAGS flags = 0;
	int use_app_mutex = 0;
	CK_VOID_PTR mutex = NULL;
	CK_RV rv;

	if (exiting)
		return CKR_CRYPTOKI_NOT_INITIALIZED;
	if (args != NULL) {
		int n = (args->CreateMutex != NULL) + (args->DestroyMutex != NULL) +
			(args->LockMutex != NULL) + (args->UnlockMutex != NULL);
		if (args->pReserved != NULL || (n != 0 && n != 4))
			return CKR_ARGUMENTS_BAD;
		flags = args->flags;
		/* CKF_LIBRARY_CANT_CREATE_OS_THREADS is ignored: the Go runtime
		 * makes its own threads whatever the application says. */
		use_app_mutex = n == 4 && !(flags & CKF_OS_LOCKING_OK);
	}

	pthread_mutex_lock(&init_lock);
	if (use_app_mutex) {
		rv = args->CreateMutex(&mutex);
		if (rv != CKR_OK) {
			pthread_mutex_unlock(&init_lock);
			return rv;
		}
	}
	rv = start(flags);
	if (rv == CKR_OK && use_app_mutex) {
		app_fns = *args;
		app_mutex = mutex;
	} else if (use_app_mutex) {
		args->DestroyMutex(mutex);
	}
	pthread_mutex_unlock(&init_lock);
	return rv;
}

CK_RV C_Finalize(CK_VOID_PTR pReserved)
{
	CK_RV rv;

	if (pReserved != NULL)
		return CKR_ARGUMENTS_BAD;
	if (!hap_remote() && hap_forked())
		return CKR_CRYPTOKI_NOT_INITIALIZED;
	pthread_mutex_lock(&init_lock);
	rv = hap_app_lock();
	if (rv != CKR_OK) {
		pthread_mutex_unlock(&init_lock);
		return rv;
	}
	rv = hap_remote() ? hap_remote_finalize() : hapFinalize();
	if (app_mutex != NULL) {
		CK_VOID_PTR m = app_mutex;
		app_fns.UnlockMutex(m);
		if (rv == CKR_OK) {
			app_mutex = NULL;
			app_fns.DestroyMutex(m);
		}
	}
	pthread_mutex_unlock(&init_lock);
	return rv;
}

CK_RV C_GetFunctionList(CK_FUNCTION_LIST_PTR_PTR ppFunctionList)
{
	if (ppFunctionList == NULL)
		return CKR_ARGUMENTS_BAD;
	*ppFunctionList = &hap_function_list;
	return CKR_OK;
}

CK_FUNCTION_LIST hap_function_list = {
	{2, 40},
#define CK_PKCS11_FUNCTION_INFO(name) name,
#include "pkcs11f.h"
#undef CK_PKCS11_FUNCTION_INFO
};
