package testhsm

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
)

// TPMModule is tpm2-pkcs11 (Debian libtpm2-pkcs11-1), a third make of
// token: keys live in a TPM (here swtpm, a software TPM per test) and a
// store directory. It has no C_WrapKey, C_UnwrapKey or C_CopyObject: it can
// only be a sign-only member, holding keys made or imported on it.
const TPMModule = "/usr/lib/x86_64-linux-gnu/pkcs11/libtpm2_pkcs11.so"

// tpmFreeSerial is the serial number tpm2-pkcs11 gives its free slot's
// token before C_InitToken.
const tpmFreeSerial = "0000000000000000"

// tpmInitDeadline bounds making a TPM token: tpm2_ptool init has swtpm
// make a primary key (seconds), then C_InitToken another.
const tpmInitDeadline = 2 * time.Minute

// TPM starts a software TPM (swtpm, on loopback TCP ports of its own) for
// the test, makes a tpm2-pkcs11 store for it with one token labelled
// label and the harness's PINs, and returns it as a Token whose ModuleEnv
// points tpm2-pkcs11 at the store and the TPM. swtpm is killed and the
// store removed when the test ends. The module reads its environment as
// it loads: a process holds one TPM token at a time in process (serve
// more with hsmserve).
func TPM(t testing.TB, label string) Token {
	t.Helper()
	dir, err := os.MkdirTemp("", "tpm-")
	if err != nil {
		t.Fatalf("testhsm.TPM: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	state, store := filepath.Join(dir, "state"), filepath.Join(dir, "store")
	for _, d := range []string{state, store} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatalf("testhsm.TPM: %v", err)
		}
	}
	port := startSWTPM(t, state)
	env := map[string]string{
		"TPM2_PKCS11_STORE":     store,
		"TPM2_PKCS11_TCTI":      fmt.Sprintf("swtpm:host=127.0.0.1,port=%d", port),
		"TPM2_PKCS11_LOG_LEVEL": "0",
	}
	ctx, cancel := context.WithTimeout(context.Background(), tpmInitDeadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, "tpm2_ptool", "init", "--path", store)
	cmd.Env = withEnv(os.Environ(), "TPM2_PKCS11_TCTI", env["TPM2_PKCS11_TCTI"])
	cmd.Env = withEnv(cmd.Env, "TPM2TOOLS_TCTI", env["TPM2_PKCS11_TCTI"]) // the tpm2 tools tpm2_ptool runs
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("testhsm.TPM: tpm2_ptool init: %v: %s", err, out)
	}
	// Without a resource manager, what the tools loaded stays in the
	// TPM's few object slots: flush it, or C_InitToken finds none free.
	FlushTPM(t, Token{ModuleEnv: env})
	// The token is made through PKCS#11 (C_InitToken, C_InitPIN): no PIN
	// on a command line.
	serial, err := slot.InitModuleToken(ctx, slot.ModuleRef{Path: TPMModule, Env: env}, tpmFreeSerial, label,
		secret.PINFromString(SOPIN), secret.PINFromString(UserPIN))
	if err != nil {
		t.Fatalf("testhsm.TPM: make token %s: %v", label, err)
	}
	return Token{Name: label, Label: label, Serial: serial, Module: TPMModule, ModuleEnv: env, UserPIN: UserPIN, SOPIN: SOPIN}
}

// FlushTPM empties the object and session slots of tok's TPM. With no
// resource manager, what a process loaded there stays after it exits, and
// the next process finds no slot free (C_Login answers
// CKR_GENERAL_ERROR): call it between processes that use the token.
func FlushTPM(t testing.TB, tok Token) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), tpmInitDeadline)
	defer cancel()
	for _, what := range []string{"--transient-object", "--loaded-session", "--saved-session"} {
		flush := exec.CommandContext(ctx, "tpm2_flushcontext", what)
		flush.Env = withEnv(os.Environ(), "TPM2TOOLS_TCTI", tok.ModuleEnv["TPM2_PKCS11_TCTI"])
		if out, err := flush.CombinedOutput(); err != nil {
			t.Fatalf("testhsm: tpm2_flushcontext %s: %v: %s", what, err, out)
		}
	}
}

// startSWTPM runs swtpm on two free loopback ports (commands, control;
// the swtpm TCTI finds the control port one above the command port)
// with its state in dir until the test ends, and returns the command port
// once it accepts connections.
func startSWTPM(t testing.TB, dir string) int {
	t.Helper()
	ports, err := portPair()
	if err != nil {
		t.Fatalf("testhsm: free ports for swtpm: %v", err)
	}
	cmd := exec.Command("swtpm", "socket", "--tpm2", "--tpmstate", "dir="+dir,
		"--server", "type=tcp,bindaddr=127.0.0.1,port="+strconv.Itoa(ports[0]),
		"--ctrl", "type=tcp,bindaddr=127.0.0.1,port="+strconv.Itoa(ports[1]),
		"--flags", "not-need-init,startup-clear")
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("testhsm: start swtpm: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		select {
		case <-done:
		case <-time.After(exitDeadline):
			t.Errorf("testhsm: swtpm pid %d not reaped within %v", cmd.Process.Pid, exitDeadline)
		}
	})
	deadline := time.Now().Add(readyDeadline)
	for {
		select {
		case <-done:
			t.Fatalf("testhsm: swtpm exited before it answered: %s", out.Bytes())
		default:
		}
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", ports[0]), time.Second)
		if err == nil {
			c.Close()
			return ports[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("testhsm: swtpm did not answer on port %d within %v: %v", ports[0], readyDeadline, err)
		}
		time.Sleep(10 * time.Millisecond) // poll interval of a wait with a deadline
	}
}

// portPair finds two consecutive free loopback TCP ports.
func portPair() ([2]int, error) {
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return [2]int{}, err
		}
		p := l.Addr().(*net.TCPAddr).Port
		l2, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+1))
		l.Close()
		if err == nil {
			l2.Close()
			return [2]int{p, p + 1}, nil
		}
	}
	return [2]int{}, fmt.Errorf("no two consecutive free ports in 20 tries")
}
