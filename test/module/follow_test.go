package module

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Issue 15: a running application follows membership changes without a
// restart. signload signs through libhapkcs11.so on a group of hsm-0 and
// hsm-1 (every member served by hsmserve); the configuration is replaced
// (an atomic rename, as hactl writes it) by one of hsm-1 and hsm-2. Once
// the library says it followed, hsm-0 and hsm-1 are killed: the process
// goes on signing on hsm-2, a member it did not know when it started, and
// every signature verifies.
func TestLibraryFollowsMembershipChanges(t *testing.T) {
	r := newRig(t, rigOpts{remote: true, allRemote: true})
	r.keypair("load1", "0c") // on all three: made while the file named them all
	if len(r.remotes) != 3 {
		t.Fatalf("rig has %d hsmserve members, want 3", len(r.remotes))
	}
	replace := func(members ...int) {
		t.Helper()
		var ms = r.members[:0:0]
		for _, i := range members {
			ms = append(ms, r.members[i])
		}
		tmp := filepath.Join(r.dir, ".hagroup.toml.new")
		if err := os.WriteFile(tmp, []byte(r.config(false, ms)), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, r.conf); err != nil {
			t.Fatal(err)
		}
	}
	replace(0, 1)

	c := startSigner(t, r, "signload", cprog(t, "signload"), r.lib, virtualSlot, r.pinFile, "load1", "2")
	c.waitFor("signing", time.Minute, func() bool { return c.progress >= 200 })

	replace(1, 2)
	followed := func() bool {
		log := r.haLog()
		for _, l := range strings.Split(log, "\n") {
			if strings.Contains(l, `"event":"config_followed"`) && strings.Contains(l, `"program":"signload"`) &&
				strings.Contains(l, "hsm-2: member_added") && strings.Contains(l, "hsm-0: member_removed") {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(time.Minute)
	for !followed() {
		if time.Now().After(deadline) {
			t.Fatalf("signload did not follow the new configuration within a minute; HA log:\n%s", r.haLog())
		}
		at := c.progress
		c.waitFor("more signatures", time.Minute, func() bool { return c.progress > at }) // paces the poll
	}

	r.remotes[0].Kill()
	r.remotes[1].Kill()
	at := c.progress
	c.waitFor("signing on hsm-2 alone", 2*time.Minute, func() bool { return c.progress >= at+600 })
	total := c.finish()
	var signed, signFailed, verifyFailed int
	if _, err := fmt.Sscanf(total, "total signed=%d sign_failed=%d verify_failed=%d", &signed, &signFailed, &verifyFailed); err != nil {
		t.Fatalf("%q: %v", total, err)
	}
	if verifyFailed != 0 || signFailed != 0 {
		t.Errorf("%s: want every signature made and verified\nHA log:\n%s", total, r.haLog())
	}
	t.Logf("%s", total)
}
