package module

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
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

// TestForkAtEveryPoint runs forkchild: a child forked after C_Initialize,
// after C_Login, mid multi-part operation and while another thread signs
// is a new application that works, its inherited handles answer
// CKR_CRYPTOKI_NOT_INITIALIZED, its helper holds no PIN in argv or
// environment, and the parent keeps working.
func TestForkAtEveryPoint(t *testing.T) {
	r := newRig(t, rigOpts{})
	r.keypair("forkkey", "0f02")
	// The PIN only in the file: the helper inherits the environment.
	env := withoutPIN(r.env)
	out, err := runEnv(t, 2*time.Minute, env, r.dir, cprog(t, "forkchild"), r.lib, virtualSlot, r.pinFile, "forkkey")
	if err != nil {
		t.Fatalf("forkchild: %v\n%s", err, out)
	}
	for _, stage := range []string{"after C_Initialize", "after C_Login", "mid multi-part operation", "the parent after the forks"} {
		if !strings.Contains(out, "ok "+stage+"\n") {
			t.Errorf("no child or parent succeeded %s:\n%s", stage, out)
		}
	}
	if got := strings.Count(out, "ok while another thread signs\n"); got != 3 {
		t.Errorf("%d of 3 children forked while another thread signed succeeded:\n%s", got, out)
	}
}

// withoutPIN drops the rig's PIN variables from env.
func withoutPIN(env []string) []string {
	var out []string
	for _, e := range env {
		if !strings.HasPrefix(e, "HA_PIN=") && !strings.HasPrefix(e, "GNUTLS_PIN=") {
			out = append(out, e)
		}
	}
	return out
}

// runEnv runs a program with exactly env, in dir, with a deadline.
func runEnv(t *testing.T, timeout time.Duration, env []string, dir, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = env
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("%s: no answer within %v: %w", name, timeout, ctx.Err())
	}
	return string(out), err
}

// TestForkPythonPool: a Python multiprocessing pool of 8 processes forked
// from a parent that initialised the module signs 400 times through
// python3-pykcs11; the parent verifies every signature.
func TestForkPythonPool(t *testing.T) {
	// Members behind hsmserve: eight helpers starting at once over the
	// same local SoftHSM token directory trip SoftHSM's own assertion
	// (SlotManager::insertToken), as eight applications would.
	r := newRig(t, rigOpts{remote: true, allRemote: true})
	r.keypair("pykey", "0f03")
	out, err := runEnv(t, 3*time.Minute, withoutPIN(r.env), r.dir, "/usr/bin/python3",
		filepath.Join(repoDir, "test", "module", "py", "pool_sign.py"), r.lib, groupLabel, "pykey", r.pinFile, "400")
	if err != nil {
		t.Fatalf("pool_sign.py: %v\n%s", err, out)
	}
	t.Log(strings.TrimSpace(out))
	if !strings.Contains(out, "signed 400 verified 400 by ") || strings.Contains(out, "by 1 processes") {
		t.Errorf("not every signature of the pool verified, or one process made them all:\n%s", out)
	}
	// A worker that failed is replaced by the pool: its traceback is the
	// only trace.
	if strings.Contains(out, "Traceback") {
		t.Errorf("a pool worker failed:\n%s", out)
	}
}
