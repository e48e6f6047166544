package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestGeneratedCodeIsCurrent: forward.c, rpc_gen.c, rpc_gen.h,
// rpc_params.c, hsmserve's parameter layouts (internal/mechparam), op
// numbers and served functions (pkg/remote/ops_gen.go) and remote.Client's
// methods (pkg/remote/client_gen.go) are
// what rpcgen makes of pkcs11f.h and pkcs11t.h now (run
// `go generate ./cmd/hapkcs11` after changing either).
func TestGeneratedCodeIsCurrent(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.CommandContext(t.Context(), "go", "run", "./rpcgen", "-o", dir, "-go", filepath.Join(dir, "layouts_gen.go"),
		"-ops", filepath.Join(dir, "ops_gen.go"), "-client", filepath.Join(dir, "client_gen.go"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run ./rpcgen: %v\n%s", err, out)
	}
	for name, committed := range map[string]string{"forward.c": "forward.c", "rpc_gen.c": "rpc_gen.c", "rpc_gen.h": "rpc_gen.h",
		"rpc_params.c": "rpc_params.c", "layouts_gen.go": "../../internal/mechparam/layouts_gen.go", "ops_gen.go": "../../pkg/remote/ops_gen.go",
		"client_gen.go": "../../pkg/remote/client_gen.go"} {
		want, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(committed)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("%s is not what rpcgen makes of the headers: run go generate ./cmd/hapkcs11", committed)
		}
	}
}
