package module

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// childrenOf returns how many processes pid has now.
func childrenOf(t *testing.T, pid int) int {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the process ended meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces, so cut at the
		// last ')'.
		i := strings.LastIndexByte(string(b), ')')
		fields := strings.Fields(string(b)[i+1:])
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			n++
		}
	}
	return n
}

// waitChildren waits until hsmserve pid serves want connections (each in
// a process of its own, plus the one it starts ahead for the next
// connection), failing after a deadline.
func waitChildren(t *testing.T, pid, want int, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := childrenOf(t, pid) - 1
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: hsmserve (pid %d) has %d connection processes besides the one started ahead, want %d", what, pid, got, want)
		}
		time.Sleep(20 * time.Millisecond) // poll: processes are the kernel's to list
	}
}

// TestMemberSlotOpensOnFirstUse: an application working on the virtual
// slot costs a served member's hsmserve one connection (the group's), not
// a second one for the member's own slot, which the module lists but opens
// only when it is used — and then it works.
func TestMemberSlotOpensOnFirstUse(t *testing.T) {
	r := newRig(t, rigOpts{remote: true, ecKey: "lazy,0e"})
	pid := r.served.PID()
	waitChildren(t, pid, 0, "before any application")

	o := startOutage(t, r, "lazy") // C_Initialize, C_Login and a signature on the virtual slot
	waitChildren(t, pid, 1, "an application signing on the virtual slot")
	// 0x100: CKR_USER_ALREADY_LOGGED_IN, the application is logged in.
	if got := o.ask("fresh"); got != "fresh open=0x0 login=0x100 sign=0x0" {
		t.Fatalf("a second session on the virtual slot: %q", got)
	}
	waitChildren(t, pid, 1, "after a second session on the virtual slot")
	o.close()
	waitChildren(t, pid, 0, "after C_Finalize")

	// The member's own slot is listed with its token and opens when used.
	slotID := r.memberSlot("hsm-2")
	out := r.tool("--slot", slotID, "--login", "--pin", "env:HA_PIN", "--list-objects", "--type", "privkey")
	if !strings.Contains(out, "label:      lazy") {
		t.Fatalf("the key made through the group is not listed on member hsm-2's own slot:\n%s", out)
	}
}

// TestMemberSlotOfADownMember: a member whose server is down at
// C_Initialize is listed as a slot without a token (as before its slot was
// opened lazily), and the HA log says why.
func TestMemberSlotOfADownMember(t *testing.T) {
	r := newRig(t, rigOpts{remote: true})
	r.served.Kill()
	var desc []string
	for _, s := range parseSlots(r.tool("-L")) {
		desc = append(desc, s.Desc+" token="+s.Label)
		if s.Desc == "hagroup member hsm-2 of "+groupLabel && s.Label != "" {
			t.Fatalf("member hsm-2 is down, yet its slot lists token %q", s.Label)
		}
		if s.Desc == "hagroup member hsm-0 of "+groupLabel && s.Label != "ha-0" {
			t.Fatalf("member hsm-0's slot lists token %q, want ha-0", s.Label)
		}
	}
	if !containsAll(r.haLog(), "member_slot_absent", "hsm-2") {
		t.Fatalf("the HA log does not say member hsm-2's slot is absent:\n%s\nslots: %v", r.haLog(), desc)
	}
}
