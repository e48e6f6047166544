/*
 * entry.h — the guard every C entry point runs before calling into Go.
 *
 * Fork: the Go runtime does not survive fork() without exec (its threads
 * are gone in the child), so any call into Go from a forked child would
 * hang. hap_forked() is set by a pthread_atfork child handler; until the
 * child's own C_Initialize every entry point fails fast, in C, before Go
 * runs, and after it every call goes to the child's helper (conn.c).
 *
 * Exit: once the process is exiting every entry point answers
 * CKR_CRYPTOKI_NOT_INITIALIZED the same way (see entry.c).
 *
 * Application locking: when C_Initialize got mutex callbacks without
 * CKF_OS_LOCKING_OK, the application asked the library to use its
 * primitives; the library then holds the application's mutex around every
 * call (hap_app_lock/hap_app_unlock).
 *
 * Scheduler tick: every few milliseconds a thread's call first yields to
 * the Go scheduler (hap_yield_due, hapYield in procs.go).
 */
#ifndef HAPKCS11_ENTRY_H
#define HAPKCS11_ENTRY_H

int hap_forked(void);
/* in_child reports whether this process forked from the one that loaded
 * the library. */
int hap_is_child(void);
int hap_yield_due(void);
CK_RV hap_app_lock(void);
void hap_app_unlock(void);

int hap_remote(void);

#define HAP_ENTER()                                   \
	do {                                          \
		if (!hap_remote()) {                  \
			if (hap_forked())             \
				return CKR_CRYPTOKI_NOT_INITIALIZED; \
			if (hap_yield_due())          \
				hapYield();           \
		}                                     \
		CK_RV lrv_ = hap_app_lock();          \
		if (lrv_ != CKR_OK)                   \
			return lrv_;                  \
	} while (0)

#define HAP_LEAVE() hap_app_unlock()

#endif
