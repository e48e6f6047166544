package main

/*
#include "hapkcs11.h"
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/slot/dispatch"
)

// The Go side of the helper (conn.c): what a helper tells its client at
// start.

// callBound is how long the client in a forked child waits for the helper
// to answer one call before it counts the helper as hung: the longest a
// call may take in the engine, a key generation on one member and a
// command on each of the others as it fails over.
func callBound(cfg *config.Config) time.Duration {
	var bound time.Duration
	for i := range cfg.Groups {
		g := &cfg.Groups[i]
		set := cfg.Settings(g)
		b := set.KeygenTimeout + time.Duration(len(g.Members))*set.CommandTimeout
		bound = max(bound, b)
	}
	if bound == 0 { // no group: no call waits on a member
		return dispatch.DefaultCommandTimeout
	}
	return bound
}

// helperGCPercent is a helper's garbage collection target (GOGC), unless
// its environment sets one: a helper serves one child, its live heap is a
// few MiB, and the default (100) lets the heap grow to twice that before a
// collection; a child's helper is a per-process cost (docs/BENCHMARKS.md,
// "Forked children").
const helperGCPercent = 50

// helperGC applies helperGCPercent in a helper.
func helperGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(helperGCPercent)
	}
}

// programName is how this process is named in events and in the fleet
// view: its program, or in a helper the program it serves (its parent,
// which started it), so that `hactl hagroup clients` shows the nginx
// worker, not an anonymous helper. The pid stays the helper's own: the
// agent checks it against the socket's peer.
func programName() string {
	if C.hap_serving == 0 {
		return filepath.Base(os.Args[0])
	}
	ppid := os.Getppid()
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", ppid))
	if err != nil {
		return filepath.Base(os.Args[0])
	}
	return fmt.Sprintf("%s (pid %d, through %s)", strings.TrimSpace(string(comm)), ppid, filepath.Base(os.Args[0]))
}

//export hapCallBoundMillis
func hapCallBoundMillis() C.ulong {
	module.RLock()
	defer module.RUnlock()
	if module.lib == nil {
		return 0
	}
	return C.ulong(module.lib.callBound.Milliseconds())
}
