package testhsm

import (
	"syscall"
	"testing"
	"time"
)

// ProcessCPU is the CPU this process has used, user and system: a
// benchmark reports its difference per operation beside the throughput.
// A token served by another process (hsmserve) spends its CPU there, so
// against a served token it is the client's share alone.
func ProcessCPU(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
