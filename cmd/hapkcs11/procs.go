package main

import "C"

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

// hapYield runs the Go scheduler on the calling application thread; the C
// entry points call it when the thread has not yielded for 5 ms
// (hap_yield_due in entry.c).
//
// An application thread calling into the library never passes through the
// scheduler by itself: it runs Go code on its own M and returns to C. So
// the P it holds keeps its scheduling tick, and once that tick is 10 ms
// old the runtime's sysmon takes the P away every time it finds the
// thread in C (as if a goroutine hogged it: preempt, and retake from the
// syscall), and then polls every 20 µs. Measured with one signing thread
// (perf probe on runtime.pidleput): 9k retakes in 2 s, about one signature
// in three, and 1.08 context switches per signature, most of them
// sysmon's; with the yield, 0.7k retakes and 0.15. A yield every few
// milliseconds costs a couple of context switches and keeps the tick
// fresh.
//
//export hapYield
func hapYield() { runtime.Gosched() }
