package main

import "C"

import (
	"os"
	"runtime"
	"sync"
)

// hapYield runs the Go scheduler on the calling application thread; the C
// entry points call it when the thread has not yielded for 8 ms
// (hap_yield_due in entry.c).
//
// An application thread calling into the library never passes through the
// scheduler by itself: it runs Go code on its own M and returns to C. So
// the P it holds keeps its scheduling tick, and once that tick is 10 ms
// old the runtime's sysmon takes the P away every time it finds the
// thread in C (as if a goroutine hogged it) and then polls every 20 µs. A
// yield keeps the tick fresh. It is dear: the goroutine is locked to the
// application's thread, so the scheduler hands the P to another thread and
// back, two wake-ups (their cost: docs/BENCHMARKS.md, "Call dispatch");
// so it comes as seldom as the 10 ms allow with room for a call in
// progress when it falls due.
//
//export hapYield
func hapYield() { runtime.Gosched() }

// spareP gives the runtime one P more than it chose (once per process),
// unless the application set GOMAXPROCS itself.
//
// An application thread inside a member's module (a cgo call) keeps its P
// in the runtime's syscall state. sysmon leaves such a P alone while
// another P is idle, but when every P is held by a thread inside the
// module (2 signing threads on 2 CPUs) it takes the P back after 20 µs,
// wakes a spinning M to find work for it (there is none) and keeps
// polling every 20 µs (runtime.retake, handoffp); the thread returning
// from the module then takes the slow path to get a P back. A spare P
// keeps one idle and spares all of that (docs/BENCHMARKS.md, "Call
// dispatch"). The price: the runtime no longer follows a changed CPU
// limit by itself (runtime.GOMAXPROCS turns that off).
func spareP() {
	spareOnce.Do(func() {
		if os.Getenv("GOMAXPROCS") == "" {
			runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + 1)
		}
	})
}

var spareOnce sync.Once
