package module

import (
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
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
		lib  string // "": the library under test
		slot string // "": the virtual slot
	}
	// The same figures on SoftHSM alone, on the first member's token.
	bare := config{"softhsm-alone", local, nil, local.members[0].Module, softSlot(t, local, local.members[0].Label)}
	for _, c := range []config{
		bare,
		{name: "1-inprocess", r: local, env: []string{"HAGROUP_CONF=" + one}},
		{name: "3-inprocess", r: local},
		{name: "3-served", r: served},
	} {
		turns := libs
		if c.lib != "" {
			turns = libs[:1]
		}
		for _, lib := range turns {
			path, slot := c.r.lib, virtualSlot
			switch {
			case c.lib != "":
				path, slot, lib.name = c.lib, c.slot, "softhsm"
			case lib.path != "":
				path = lib.path
			}
			out, err := c.r.run(5*time.Minute, c.env, prog, path, slot, c.r.pinFile, fmt.Sprint(*initCostN))
			if err != nil {
				t.Fatalf("%s, %s library: initcost: %v\n%s", c.name, lib.name, err, out)
			}
			for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
				fmt.Printf("initcost members=%s lib=%s %s\n", c.name, lib.name, l)
			}
		}
	}
}

// softSlot returns SoftHSM's slot ID of the token labelled label.
func softSlot(t *testing.T, r *rig, label string) string {
	t.Helper()
	for _, s := range parseSlots(r.mustRun(time.Minute, "pkcs11-tool", "--module", testhsm.SoftHSMModule, "-L")) {
		if s.Label == label {
			return s.ID
		}
	}
	t.Fatalf("SoftHSM lists no token %s", label)
	return ""
}
