package testhsm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// OCKModule is opencryptoki's PKCS#11 API library (Debian opencryptoki),
// whose soft token (IBM SoftTok) is a fourth make of token: RSA only,
// wrapping with AES ECB/CBC/CBC-PAD and no CKM_AES_KEY_WRAP*, PINs of 4 to
// 8 characters. It talks to pkcsslotd, which keeps its state at fixed
// paths (/var/lib/opencryptoki, /run, /etc/opencryptoki): so each token
// gets a mount and IPC namespace of its own, where those paths are bound
// to the test's directory, and is served from there by hsmserve.
const OCKModule = "/usr/lib/x86_64-linux-gnu/pkcs11/libopencryptoki.so"

// The PINs of an opencryptoki token: its soft token takes 4 to 8
// characters, fewer than the harness's other PINs.
const (
	OCKUserPIN = "ock-u-12"
	OCKSOPIN   = "87654321" // the soft token's factory SO PIN, kept
)

// ockSlot is the slot the rig's opencryptoki.conf gives the soft token.
const ockSlot = "3"

// ServeOCK makes a fresh opencryptoki soft token labelled name, in a
// store of its own, and serves it with hsmserve from a mount namespace
// where pkcsslotd runs for it alone (needs root, as CI runs). Its Token
// has the remote module path and OCKUserPIN. Kill and Restart act on the
// namespace's processes; the store survives a restart.
func ServeOCK(t testing.TB, name string) *Served {
	t.Helper()
	if name == "" || len(name) > 32 {
		t.Fatalf("testhsm.ServeOCK: name %q must be 1 to 32 bytes (it is the token label)", name)
	}
	bin, err := hsmserveBinary()
	if err != nil {
		t.Fatalf("testhsm.ServeOCK(%s): %v", name, err)
	}
	dir := ockStore(t, "testhsm.ServeOCK", name)
	s := &Served{
		t:      t,
		remote: true,
		bin:    bin,
		name:   name,
		label:  name,
		serial: "123",
		sock:   filepath.Join(dir, "sock", "p11.sock"),
		module: OCKModule,
	}
	s.command = func() *exec.Cmd {
		return ockCommand(context.Background(), dir, fmt.Sprintf("exec %s --module %s --socket %s --token-label %s",
			bin, OCKModule, s.sock, name))
	}
	if len(s.sock) >= 100 {
		t.Fatalf("testhsm.ServeOCK(%s): socket path %s too long for a Unix socket; set a shorter TMPDIR", name, s.sock)
	}
	t.Cleanup(s.shutdown)
	if err := s.start(); err != nil {
		t.Fatalf("testhsm.ServeOCK(%s): %v", name, err)
	}
	return s
}

// OCK is an opencryptoki soft token in a store of its own, reached by
// running a program in its namespace (Command): a bare token, for a test
// that must call the module itself rather than through hsmserve.
type OCK struct {
	dir string
}

// NewOCK makes a fresh opencryptoki soft token labelled label (PINs
// OCKUserPIN and OCKSOPIN) in a store removed when the test ends. Needs
// root, as CI runs.
func NewOCK(t testing.TB, label string) *OCK {
	t.Helper()
	return &OCK{dir: ockStore(t, "testhsm.NewOCK", label)}
}

// Command runs argv in the token's namespace, where pkcsslotd serves the
// store; OCKModule there offers the token. Killing the command ends
// pkcsslotd too.
func (o *OCK) Command(ctx context.Context, argv ...string) *exec.Cmd {
	return ockCommand(ctx, o.dir, "exec "+shellQuote(argv))
}

// ockStore makes the store directory of one soft token labelled label,
// removed when the test ends, and the token in it, by the token maker run
// in the namespace (PINs on its standard input, never its command line or
// environment). fn names the caller in failures.
func ockStore(t testing.TB, fn, label string) string {
	t.Helper()
	if label == "" || len(label) > 32 {
		t.Fatalf("%s: label %q must be 1 to 32 bytes", fn, label)
	}
	dir, err := os.MkdirTemp("", "ock-")
	if err != nil {
		t.Fatalf("%s(%s): %v", fn, label, err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := ockTree(dir); err != nil {
		t.Fatalf("%s(%s): %v", fn, label, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), initDeadline(1))
	defer cancel()
	init, err := makerCommand(ctx, OCKModule, []string{label}, OCKSOPIN, OCKUserPIN, func(argv []string) *exec.Cmd {
		return ockCommand(ctx, dir, "exec "+shellQuote(argv))
	})
	if err != nil {
		t.Fatalf("%s(%s): %v", fn, label, err)
	}
	if _, err := makeTokens(init, []string{label}); err != nil {
		t.Fatalf("%s(%s): make the token: %v", fn, label, err)
	}
	return dir
}

// ockTree lays out dir for one opencryptoki instance: its store, run,
// lock and log directories (group pkcs11, as pkcsslotd wants), a
// configuration with the soft token alone, and the socket directory.
func ockTree(dir string) error {
	for _, d := range []string{"lib/swtok/TOK_OBJ", "run/lock/opencryptoki", "run/opencryptoki", "log", "etc", "sock"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o770); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(dir, "sock"), 0o700); err != nil {
		return err
	}
	conf := "version opencryptoki-3.1\nslot " + ockSlot + "\n{\nstdll = libpkcs11_sw.so\n}\n"
	if err := os.WriteFile(filepath.Join(dir, "etc", "opencryptoki.conf"), []byte(conf), 0o644); err != nil {
		return err
	}
	out, err := exec.Command("chgrp", "-R", "pkcs11", filepath.Join(dir, "lib"), filepath.Join(dir, "run"), filepath.Join(dir, "log")).CombinedOutput()
	if err != nil {
		return fmt.Errorf("chgrp pkcs11 (is opencryptoki installed?): %v: %s", err, out)
	}
	return nil
}

// shellQuote joins argv into one shell command line.
func shellQuote(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// ockCommand runs script in new mount, IPC and PID namespaces where
// opencryptoki's fixed paths are dir's and pkcsslotd runs; the script's
// last process is the namespace's, so killing it ends pkcsslotd too.
func ockCommand(ctx context.Context, dir, script string) *exec.Cmd {
	setup := strings.Join([]string{
		"set -e",
		"mount --bind " + filepath.Join(dir, "run") + " /run",
		"mount --bind " + filepath.Join(dir, "lib") + " /var/lib/opencryptoki",
		"mount --bind " + filepath.Join(dir, "etc") + " /etc/opencryptoki",
		"mkdir -p /var/log/opencryptoki",
		"mount --bind " + filepath.Join(dir, "log") + " /var/log/opencryptoki",
		"mount -t tmpfs none /dev/shm",
		"pkcsslotd </dev/null",
		script,
	}, "\n")
	return exec.CommandContext(ctx, "unshare", "--mount", "--ipc", "--pid", "--fork", "--propagation", "private", "bash", "-c", setup)
}
