package main

import "C"

import "runtime"

// hapYield runs the Go scheduler on the calling application thread; the C
// entry points call it when the thread has not yielded for 5 ms
// (hap_yield_due in entry.c).
//
// An application thread calling into the library never passes through the
// scheduler by itself: it runs Go code on its own M and returns to C. So
// the P it holds keeps its scheduling tick, and once that tick is 10 ms
// old the runtime's sysmon takes the P away every time it finds the
// thread in C (as if a goroutine hogged it) and then polls every 20 µs. A
// yield every few milliseconds costs a couple of context switches and
// keeps the tick fresh (docs/BENCHMARKS.md).
//
//export hapYield
func hapYield() { runtime.Gosched() }
