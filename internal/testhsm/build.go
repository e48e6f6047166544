package testhsm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"
)

// hsmservePackage is the import path of the token server ServeRemote runs.
const hsmservePackage = "github.com/hagroup/hagroup/cmd/hsmserve"

// buildDeadline bounds building hsmserve (cgo; cached by the go build
// cache after the first time).
const buildDeadline = 5 * time.Minute

// built is hsmserve, built once per test binary. Package state because the
// binary is shared by every test of the process; Main removes it.
var built struct {
	once sync.Once
	mu   sync.Mutex
	dir  string
	bin  string
	err  error
}

// hsmserveBinary builds cmd/hsmserve into a temporary directory the first
// time it is called and returns its path.
func hsmserveBinary() (string, error) {
	built.once.Do(func() {
		dir, err := os.MkdirTemp("", "testhsm-bin-")
		if err != nil {
			built.err = err
			return
		}
		bin := filepath.Join(dir, "hsmserve")
		goTool, err := exec.LookPath("go")
		if err != nil {
			goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		ctx, cancel := context.WithTimeout(context.Background(), buildDeadline)
		defer cancel()
		cmd := exec.CommandContext(ctx, goTool, "build", "-o", bin, hsmservePackage)
		if out, err := cmd.CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			built.err = fmt.Errorf("go build %s: %v: %s", hsmservePackage, err, out)
			return
		}
		built.mu.Lock()
		built.dir, built.bin = dir, bin
		built.mu.Unlock()
	})
	return built.bin, built.err
}

// removeBuilt removes the hsmserve binary, if one was built (a later
// ServeRemote in the same process would fail).
func removeBuilt() {
	built.mu.Lock()
	defer built.mu.Unlock()
	if built.dir != "" {
		os.RemoveAll(built.dir)
		built.dir = ""
	}
}

// HSMServe returns the path of cmd/hsmserve built for this test binary
// (once; removed by Main), for tests that run the server themselves.
func HSMServe(t testing.TB) string {
	t.Helper()
	bin, err := hsmserveBinary()
	if err != nil {
		t.Fatalf("testhsm.HSMServe: %v", err)
	}
	return bin
}
