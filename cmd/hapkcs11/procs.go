package main

import (
	"os"
	"runtime"
)

// minProcs is the fewest Ps (GOMAXPROCS) the library runs with.
//
// An application thread waiting in the library for a member's answer (a
// lane call, see pkg/slot) holds its P in the syscall state for the whole
// signature. When every P is so held, the runtime's sysmon takes each back
// after 20 µs and starts a thread to look for other work, which finds none:
// measured on the 2-vCPU development VM with 2 signing threads, 4.3
// context switches per ECDSA signature with GOMAXPROCS=2 against 2.6 with
// 8, and +20–40 % signatures per second. Idle Ps cost next to nothing, so
// the library keeps a few more than a small machine's CPUs.
const minProcs = 8

// raiseProcs lifts GOMAXPROCS to minProcs, unless the application's
// environment sets GOMAXPROCS itself.
func raiseProcs() {
	if _, set := os.LookupEnv("GOMAXPROCS"); set {
		return
	}
	if runtime.GOMAXPROCS(0) < minProcs {
		runtime.GOMAXPROCS(minProcs)
	}
}
