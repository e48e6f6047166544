package main

import (
	"os"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
)

// BenchmarkModuleSign takes a token per run: room for make bench's
// -count (6 by default).
func TestMain(m *testing.M) { os.Exit(testhsm.Main(m, 8)) }
