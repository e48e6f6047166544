package module

import (
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"
)

var forkBenchSeconds = flag.Int("forkbench", 0, "run TestForkBench, each figure for this many seconds (make bench: 5)")

// TestForkBench measures signing in processes forked from one that
// initialised the module (through their helpers) against processes that
// run the engine themselves, ECDSA P-256 and RSA-2048, 1 and 4 processes,
// on three in-process SoftHSM members; it prints the figures for
// docs/BENCHMARKS.md and fails only when a signature fails.
func TestForkBench(t *testing.T) {
	if *forkBenchSeconds <= 0 {
		t.Skip("a benchmark: go test -run TestForkBench -forkbench 5 ./test/module")
	}
	r := newRig(t, rigOpts{})
	r.keypair("bench-ec", "0b01")
	r.tool("--slot", virtualSlot, "--login", "--pin", "env:HA_PIN", "--keypairgen",
		"--key-type", "rsa:2048", "--label", "bench-rsa", "--id", "0b02")
	prog := cprog(t, "forkbench")
	for _, mech := range []string{"ecdsa", "rsa"} {
		for _, procs := range []int{1, 4} {
			for _, mode := range []string{"inprocess", "helper"} {
				label := map[string]string{"ecdsa": "bench-ec", "rsa": "bench-rsa"}[mech]
				out, err := runEnv(t, 2*time.Minute, withoutPIN(r.env), r.dir, prog, mode, r.lib, virtualSlot, r.pinFile,
					label, mech, fmt.Sprint(procs), fmt.Sprint(*forkBenchSeconds))
				if err != nil {
					t.Fatalf("forkbench %s %s %d: %v\n%s", mode, mech, procs, err, out)
				}
				fmt.Print("forkbench ", strings.TrimSpace(out), "\n")
			}
		}
	}
}
