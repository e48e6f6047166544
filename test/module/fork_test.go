package module

import (
	"testing"
	"time"
)

func TestForkPkcs11ToolTestFork(t *testing.T) {
	r := newRig(t, rigOpts{})
	r.keypair("forkkey", "0f01")
	out, err := r.run(2*time.Minute, nil, "pkcs11-tool", "--module", r.lib, "--slot", virtualSlot,
		"--login", "--pin", "env:HA_PIN", "--test-fork")
	t.Logf("%s", out)
	if err != nil {
		t.Fatal(err)
	}
}
