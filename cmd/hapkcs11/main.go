// Command hapkcs11 is libhapkcs11.so, the hagroup PKCS#11 client library:
// a PKCS#11 v2.40 module in which every configured HA group is one virtual
// slot, run by the HA engine (pkg/group) inside the application's process.
//
// Build it with
//
//	go build -buildmode=c-shared -o bin/libhapkcs11.so ./cmd/hapkcs11
//
// and load bin/libhapkcs11.so in any PKCS#11 application. The configuration
// is $HAGROUP_CONF, else /etc/hagroup/hagroup.toml. Every group is a slot
// whose ID is derived from the group's serial (the serial itself when it is
// a number below 2^30), labelled with the group's label; each member's own
// token is listed too, with an ID derived from the group serial and member
// name, unless only = true.
//
// The library exports C_GetFunctionList and every C_* function and nothing
// else (see exports.map.tbd).
//
// Fork: the Go runtime does not survive fork() without exec, and no Go
// code runs in a forked child. Until the child's own C_Initialize every
// call returns CKR_CRYPTOKI_NOT_INITIALIZED at once; that C_Initialize
// starts a helper (hapkcs11-helper, beside the library: a fresh process
// that loads the library and runs the engine for this child alone), and
// every later call goes to it over a socketpair (conn.c and rpc.c; the
// per-function code is generated from pkcs11f.h by rpcgen).
//
// Locking: C_Initialize accepts CKF_OS_LOCKING_OK, and mutex callbacks; when
// it gets callbacks without CKF_OS_LOCKING_OK, every call holds the
// application's mutex. CKF_LIBRARY_CANT_CREATE_OS_THREADS is ignored: the
// Go runtime creates threads regardless.
//
// Threads: besides the Go runtime's own, a member with dispatch "handoff"
// (the default) has a worker goroutine per session that makes its calls
// off the application's thread; with "inline" the calls run on the
// application's thread (hagroup.toml(5)). The library pins no thread,
// leaves the environment as the application has it, gives the runtime one
// P more than it chose unless the application set GOMAXPROCS (spareP), and
// an application thread yields to the Go scheduler once every 8 ms of
// calls (procs.go says why).
//
// Recovery: each group is opened with pkg/ha, so failed members are
// recovered in the application's process (every interval, retries times)
// and destroys are journalled in state_dir when the process may write it.
// When every member of a group fails, recovery_mode decides what the
// application's sessions become: activeBasic (the default) loses them and
// the login — an old session answers CKR_SESSION_HANDLE_INVALID once a
// member is back, and the application opens a new one and logs in again;
// activeEnhanced keeps both, and the same session works again.
//
// Logging: HA events go to the configuration's log_file when the process
// may append to it, else to stderr only when HAGROUP_DEBUG is set.
package main

/*
#cgo LDFLAGS: ${SRCDIR}/exports.map.tbd
#include "hapkcs11.h"
*/
import "C"

//go:generate go run ./rpcgen

// Library identity, reported by C_GetInfo and C_GetSlotInfo; the virtual
// token reports its members' manufacturer and model (group.TokenInfo).
const (
	manufacturer = "hagroup"
	libraryMajor = 1
	libraryMinor = 0
)

func main() {}
