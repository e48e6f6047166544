package module

import (
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"
)

var (
	initCostN    = flag.Int("initcost", 0, "run TestInitCost with this many rounds of each figure (make bench: 30)")
	initCostBase = flag.String("initcost.base", "", "another libhapkcs11.so (an older build) to measure in turn with this one")
)

// TestInitCost measures what the group costs a tool that initialises the
// module per task (test/module/c/initcost.c): C_Initialize + C_Finalize,
// the same with a login, and a replicated create-copy-destroy, with one
// in-process member, three, and three served by hsmserve. It prints the
// figures for docs/BENCHMARKS.md and fails only when a call fails.
func TestInitCost(t *testing.T) {
	if *initCostN <= 0 {
		t.Skip("a benchmark: go test -run TestInitCost -initcost 30 ./test/module")
	}
	prog := cprog(t, "initcost")
	local := newRig(t, rigOpts{})
	one := local.write("one.toml", local.config(false, local.members[:1]))
	served := newRig(t, rigOpts{remote: true, allRemote: true})
	libs := []struct{ name, path string }{{"this", ""}}
	if *initCostBase != "" {
		// Three turns each, alternating, so that a loaded machine's
		// drift falls on both.
		libs = []struct{ name, path string }{{"base", *initCostBase}, {"this", ""}, {"base", *initCostBase}, {"this", ""}, {"base", *initCostBase}, {"this", ""}}
	}
	type config struct {
		name string
		r    *rig
		env  []string
	}
	for _, c := range []config{
		{"1-inprocess", local, []string{"HAGROUP_CONF=" + one}},
		{"3-inprocess", local, nil},
		{"3-served", served, nil},
	} {
		for _, lib := range libs {
			path := c.r.lib
			if lib.path != "" {
				path = lib.path
			}
			out, err := c.r.run(5*time.Minute, c.env, prog, path, virtualSlot, c.r.pinFile, fmt.Sprint(*initCostN))
			if err != nil {
				t.Fatalf("%s, %s library: initcost: %v\n%s", c.name, lib.name, err, out)
			}
			for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
				fmt.Printf("initcost members=%s lib=%s %s\n", c.name, lib.name, l)
			}
		}
	}
}
