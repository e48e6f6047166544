package agent

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestClientStandsAlone: a Go program drives haagent with this package
// (the typed client and every wire type) built without cgo and without
// the engine, as tailscale's client/local needs nothing of ipn.
func TestClientStandsAlone(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), gobin, args...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("CGO_ENABLED=0 go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("build", ".")
	const module = "github.com/hagroup/hagroup/"
	allowed := map[string]bool{module + "pkg/agent": true, module + "internal/filelock": true}
	for _, dep := range strings.Fields(run("list", "-deps", ".")) {
		if strings.HasPrefix(dep, module) && !allowed[dep] {
			t.Errorf("pkg/agent imports %s: the client and its wire types must need nothing of the engine", dep)
		}
	}
}
