package module

import (
	"context"
	"fmt"
	"os/exec"
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
