package main

import "C"

import "runtime"

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
// back, two wake-ups, ~40 µs of CPU on the 2-vCPU VM of
// docs/BENCHMARKS.md; so it comes as seldom as the 10 ms allow with room
// for a call in progress when it falls due.
//
//export hapYield
func hapYield() { runtime.Gosched() }
