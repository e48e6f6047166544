package testhsm_test

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
)

// hsmserve checks a module's init arguments when it starts: NSS softokn
// without them exits 1 saying they may be missing, a PIN parameter in
// them exits 2 without repeating it, and neither leaves a socket.
func TestHSMServeInitArgs(t *testing.T) {
	bin := testhsm.HSMServe(t)
	sock := filepath.Join(t.TempDir(), "s.sock")
	for _, tc := range []struct {
		name, args string
		code       int
		says       string
	}{
		{"missing", "", 1, "init arguments may be missing"},
		{"a password", "configdir='sql:/nonexistent' password='hunter22'", 2, "PIN or password"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, bin, "--module", testhsm.NSSModule, "--socket", sock, "--init-args", tc.args).CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != tc.code {
				t.Fatalf("hsmserve: %v, want exit status %d: %s", err, tc.code, out)
			}
			if !strings.Contains(string(out), tc.says) || strings.Contains(string(out), "hunter22") {
				t.Fatalf("hsmserve said %q, want %q and no password", out, tc.says)
			}
		})
	}
}
