// Package conformance is the differential PKCS#11 conformance harness: one
// table of call sequences (steps_test.go) runs against a bare SoftHSM token
// and against libhapkcs11.so's virtual slot over one in-process member,
// three in-process members and three hsmserve-served members, each on a
// fresh set of tokens; every CKR code and output must be the bare token's,
// except where docs/DESIGN.md ("Differences from the member token") lists
// a deliberate difference (allowed_test.go). Then again while served
// members are killed with SIGKILL and restarted between steps.
//
// A Go program cannot load libhapkcs11.so (it holds a Go runtime of its
// own), so the calls go through driver/p11drive.c, a raw binding that reads
// one call a line and answers one line.
package conformance

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

	"github.com/hagroup/hagroup/internal/testhsm"
)

var (
	repoDir string
	workDir string
	builds  sync.Map // name -> *built
)

type built struct {
	once sync.Once
	path string
	err  error
}

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "conform-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	workDir = dir
	_, file, _, _ := runtime.Caller(0)
	repoDir = filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	// No token pool: every configuration makes its own token directory,
	// read by its own driver process. Main still removes hsmserve.
	return testhsm.Main(m, 0)
}

// buildOnce runs make once per test binary and returns the artifact.
func buildOnce(t testing.TB, name string, make func(out string) error) string {
	t.Helper()
	v, _ := builds.LoadOrStore(name, &built{})
	b := v.(*built)
	b.once.Do(func() {
		b.path = filepath.Join(workDir, name)
		b.err = make(b.path)
	})
	if b.err != nil {
		t.Fatalf("building %s: %v", name, b.err)
	}
	return b.path
}

func command(dir, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %v: %v\n%s", name, args, err, out)
	}
	return nil
}

// library builds libhapkcs11.so as the Makefile does.
func library(t testing.TB) string {
	return buildOnce(t, "libhapkcs11.so", func(out string) error {
		return command(repoDir, "go", "build", "-trimpath", "-buildmode=c-shared", "-ldflags=-s -w", "-o", out, "./cmd/hapkcs11")
	})
}

func driverBinary(t testing.TB) string {
	return buildOnce(t, "p11drive", func(out string) error {
		return command(repoDir, "gcc", "-Wall", "-Werror", "-O2", "-I", filepath.Join(repoDir, "cmd", "hapkcs11"),
			"-o", out, filepath.Join(repoDir, "test", "conformance", "driver", "p11drive.c"), "-ldl")
	})
}

// hsmprep installs a group's domain key on its members (test/module's).
func hsmprep(t testing.TB) string {
	return buildOnce(t, "hsmprep", func(out string) error {
		return command(repoDir, "go", "build", "-o", out, "./test/module/hsmprep")
	})
}
