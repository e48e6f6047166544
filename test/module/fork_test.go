package module

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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
// CKR_CRYPTOKI_NOT_INITIALIZED, its handle for the key is the parent's,
// its helper holds no PIN in argv or environment, and the parent keeps
// working; with the parent's engine in process, and with the parent
// served by a helper itself (library.process = "helper").
func TestForkAtEveryPoint(t *testing.T) {
	r := newRig(t, rigOpts{})
	r.keypair("fork-other", "0f12") // the key is not the token's only object
	r.keypair("forkkey", "0f02")
	conf, err := os.ReadFile(r.conf)
	if err != nil {
		t.Fatal(err)
	}
	helperConf := r.write("helper.toml", "[library]\nprocess = \"helper\"\n\n"+string(conf))
	// The parent runs the engine itself, or is served by a helper of its
	// own (whose connections its children must let go of).
	for _, parent := range []struct{ name, conf string }{{"in process", r.conf}, {"helper", helperConf}} {
		t.Run(parent.name, func(t *testing.T) {
			// The PIN only in the file: the helper inherits the environment.
			env := append(withoutPIN(r.env), "HAGROUP_CONF="+parent.conf)
			out, err := runEnv(t, 2*time.Minute, env, r.dir, cprog(t, "forkchild"), r.lib, virtualSlot, r.pinFile, "forkkey")
			if err != nil {
				t.Fatalf("forkchild: %v\n%s", err, out)
			}
			for _, stage := range []string{"after C_Initialize", "after C_Login", "a child whose 4 threads sign at once",
				"mid multi-part operation", "the parent after the forks"} {
				if !strings.Contains(out, "ok "+stage+"\n") {
					t.Errorf("no child or parent succeeded %s:\n%s", stage, out)
				}
			}
			if got := strings.Count(out, "ok while another thread signs\n"); got != 3 {
				t.Errorf("%d of 3 children forked while another thread signed succeeded:\n%s", got, out)
			}
		})
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

// TestHelperCannotStart: a forked child whose helper is missing, not
// executable, writable by others, another user's or in a directory others
// may write gets a CKR code from
// C_Initialize at once, and a message naming the helper and what is wrong
// with it; nothing is left half-started.
func TestHelperCannotStart(t *testing.T) {
	r := newRig(t, rigOpts{})
	prog := cprog(t, "helperfault")
	helper := filepath.Join(filepath.Dir(r.lib), "hapkcs11-helper")
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, helperCopy string)
		want  string
	}{
		{"missing", func(t *testing.T, h string) { os.Remove(h) }, "no such file or directory"},
		{"not executable", func(t *testing.T, h string) { os.Chmod(h, 0o644) }, "not executable"},
		{"writable by others", func(t *testing.T, h string) { os.Chmod(h, 0o757) }, "writable by group or others"},
		{"another user's", func(t *testing.T, h string) { os.Chown(h, 4242, 4242) }, "owned by another user"},
		{"in a directory others may write", func(t *testing.T, h string) { os.Chmod(filepath.Dir(h), 0o777) }, "its directory DIR is writable by group or others"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			lib := filepath.Join(dir, "libhapkcs11.so")
			copyFile(t, r.lib, lib, 0o755)
			h := filepath.Join(dir, "hapkcs11-helper")
			copyFile(t, helper, h, 0o755)
			tc.setup(t, h)
			out, err := runEnv(t, time.Minute, withoutPIN(r.env), r.dir, prog, "missing", lib)
			if err != nil {
				t.Fatalf("helperfault: %v\n%s", err, out)
			}
			if !strings.Contains(out, "rv=0x5 ") {
				t.Errorf("the child's C_Initialize did not fail with CKR_GENERAL_ERROR:\n%s", out)
			}
			want := "libhapkcs11: cannot start the helper " + h + ": " + strings.Replace(tc.want, "DIR", dir, 1)
			if !strings.Contains(strings.ToLower(out), strings.ToLower(want)) {
				t.Errorf("no message %q:\n%s", want, out)
			}
		})
	}
}

// TestHelperDies: a child's helper SIGKILLed makes the next call answer
// CKR_DEVICE_ERROR, and the next C_Initialize starts another helper (with
// or without C_Finalize); a helper SIGSTOPped makes a call answer
// CKR_DEVICE_ERROR within the bound the helper announced (here 1 s of
// key generation and 1 s per member), and C_Finalize ends it.
func TestHelperDies(t *testing.T) {
	r := newRig(t, rigOpts{})
	r.keypair("diekey", "0f04")
	conf, err := os.ReadFile(r.conf)
	if err != nil {
		t.Fatal(err)
	}
	short := strings.Replace(string(conf), "command_timeout = \"10s\"\n", "command_timeout = \"1s\"\nkeygen_timeout = \"1s\"\n", 1)
	if short == string(conf) {
		t.Fatal("the rig's configuration has no command_timeout to shorten")
	}
	if err := os.WriteFile(r.conf, []byte(short), 0o600); err != nil {
		t.Fatal(err)
	}
	prog := cprog(t, "helperfault")
	out, err := runEnv(t, time.Minute, withoutPIN(r.env), r.dir, prog, "kill", r.lib, virtualSlot, r.pinFile, "diekey")
	if err != nil || !strings.Contains(out, "ok kill") {
		t.Errorf("helperfault kill: %v\n%s", err, out)
	}
	out, err = runEnv(t, time.Minute, withoutPIN(r.env), r.dir, prog, "stop", r.lib, virtualSlot, r.pinFile, "diekey")
	if err != nil {
		t.Fatalf("helperfault stop: %v\n%s", err, out)
	}
	var ms int
	i := strings.Index(out, "stopped_ms=")
	if i < 0 {
		t.Fatalf("helperfault stop printed no time:\n%s", out)
	}
	if _, err := fmt.Sscanf(out[i:], "stopped_ms=%d", &ms); err != nil || ms > 8000 {
		t.Errorf("a call to a stopped helper did not fail within its 4 s bound (1 s + 3 × 1 s):\n%s", out)
	}
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, mode); err != nil {
		t.Fatal(err)
	}
}

// TestHelperOptIn: with library.process = "helper" an unforked
// application's C_Initialize starts a helper, its signature verifies, and
// C_Finalize ends the helper.
func TestHelperOptIn(t *testing.T) {
	r := newRig(t, rigOpts{})
	r.keypair("optin", "0f05")
	conf, err := os.ReadFile(r.conf)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(r.conf, append([]byte("[library]\nprocess = \"helper\"\n\n"), conf...), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runEnv(t, time.Minute, withoutPIN(r.env), r.dir, cprog(t, "inhelper"), r.lib, virtualSlot, r.pinFile, "optin")
	if err != nil {
		t.Fatalf("inhelper: %v\n%s", err, out)
	}
	if out != "helpers=1\nok\nhelpers=0\n" {
		t.Errorf("want one helper while initialised and none after C_Finalize, and a verified signature; got:\n%s", out)
	}
}

// TestHelperBounds speaks to a helper as a broken or hostile client would:
// an unknown function, arguments cut short, an attribute count far over
// the bound, mechanism parameters that lie (a structure's bytes cut short,
// a structure with pointers sent as raw bytes, a parameter length of
// 1 TiB) and a frame header over the frame bound each get an answer (or,
// for the header, the end of that connection) and never make the helper
// allocate what they claim; the helper goes on serving. A structure whose
// own length field lies (1 TiB of data behind 16 bytes) crosses with the
// length that came: the engine answers the call (no session 0).
func TestHelperBounds(t *testing.T) {
	r := newRig(t, rigOpts{})
	ctl := startHelper(t, r)
	welcome := readFrame(t, ctl)
	if len(welcome) != 32 || le64(welcome[16:]) != 0 {
		t.Fatalf("welcome %x: want magic, version, CKR_OK, bound", welcome)
	}
	call := passConn(t, ctl)
	for _, tc := range []struct {
		name string
		body []byte
		want uint64
	}{
		{"an unknown function", words(9999), 0x54},       // CKR_FUNCTION_NOT_SUPPORTED
		{"C_Sign without its arguments", words(41), 0x7}, // CKR_ARGUMENTS_BAD
		{"C_FindObjectsInit with 2^40 attributes", words(24, 1, 1, 1<<40), 0x7},
		{"C_GetInfo", words(1, 1), 0x0},
		// C_DeriveKey(0, AES-ECB-ENCRYPT-DATA, 0, no template, &key):
		// CK_KEY_DERIVATION_STRING_DATA {pData, ulLen} as a structure
		// (form 1), its data (present, length, bytes), and so on.
		{"derive-by-data with its data cut short", words(60, 0, 1, 0x1104, 1, 0xdead, 16, 1, 16, 7), 0x7},
		{"derive-by-data with a structure cut short", words(60, 0, 1, 0x1104, 1, 0xdead), 0x7},
		{"CCM parameters as raw bytes (the client's pointers)", words(60, 0, 1, 0x1088, 0, 1, 48, 1, 2, 3, 4, 5, 6, 0, 0, 0, 1), 0x7},
		{"a parameter length of 1 TiB", words(60, 0, 1, 0x1104, 2, 1<<40, 0, 0, 0, 1), 0x7},
		{"derive-by-data whose length field says 1 TiB", words(60, 0, 1, 0x1104, 1, 0xdead, 1<<40, 1, 16, 1, 2, 0, 0, 0, 1), 0xb3}, // CKR_SESSION_HANDLE_INVALID
		// An Init folded with its call (fold.c): HAP_OP_FOLD, the Init's
		// length, the Init, the call.
		{"a fold whose Init runs past the frame", words(0x10000, 1<<40, 1, 1), 0x7},
		{"a fold inside a fold", words(0x10000, 16, 0x10000, 0, 1, 1), 0x54}, // the inner fold is no function: its code is the call's
		{"C_GetInfo folded after C_GetInfo", words(0x10000, 16, 1, 1, 1, 1), 0x0},
		{"the helper after them", words(1, 1), 0x0},
	} {
		writeFrame(t, call, tc.body)
		reply := readFrame(t, call)
		if len(reply) < 8 || le64(reply) != tc.want {
			t.Errorf("%s: reply %x, want CKR 0x%x first", tc.name, reply[:min(len(reply), 16)], tc.want)
		}
	}
	// A header over the bound ends that connection, and only that one.
	if _, err := call.Write([]byte{0xff, 0xff, 0xff, 0xff}); err != nil {
		t.Fatal(err)
	}
	call.SetReadDeadline(time.Now().Add(30 * time.Second))
	if n, err := call.Read(make([]byte, 1)); err == nil {
		t.Errorf("the helper answered %d bytes to a 4 GiB frame header, want the connection closed", n)
	}
	other := passConn(t, ctl)
	writeFrame(t, other, words(1, 1))
	if reply := readFrame(t, other); le64(reply) != 0 {
		t.Errorf("C_GetInfo on a new connection after the oversized frame: %x", reply)
	}
}

// TestHelperParamWire runs c/paramwire.c, built with AddressSanitizer
// around the helper's own marshalling (rpc.c and the generated
// rpc_params.c): every mechanism parameter with pointers that the client
// sends is rebuilt by the helper as it was, then sent again cut short at
// every byte and with each word replaced by lying lengths and counts;
// neither side reads or writes out of bounds (ASan stops the program), a
// rebuilt parameter's every pointer has its length's bytes behind it, and
// lengths over the frame bound are refused before anything is read.
func TestHelperParamWire(t *testing.T) {
	src := filepath.Join(repoDir, "cmd", "hapkcs11")
	prog := buildOnce(t, "paramwire", func(out string) error {
		return command(2*time.Minute, repoDir, "gcc", "-Wall", "-Werror", "-O1", "-g",
			"-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-I", src, "-o", out,
			filepath.Join(repoDir, "test", "module", "c", "paramwire.c"),
			filepath.Join(src, "rpc.c"), filepath.Join(src, "rpc_params.c"))
	})
	out, err := runEnv(t, 2*time.Minute, nil, t.TempDir(), prog)
	if err != nil || !strings.HasPrefix(out, "ok ") {
		t.Fatalf("paramwire: %v\n%s", err, out)
	}
	t.Log(strings.TrimSpace(out))
}

// startHelper runs hapkcs11-helper on the rig's library with a socketpair
// as its fd 3, and returns the other end.
func startHelper(t *testing.T, r *rig) *os.File {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	mine, theirs := os.NewFile(uintptr(fds[0]), "ctl"), os.NewFile(uintptr(fds[1]), "helper-ctl")
	cmd := exec.Command(filepath.Join(filepath.Dir(r.lib), "hapkcs11-helper"), r.lib)
	cmd.Env = withoutPIN(r.env)
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	theirs.Close()
	t.Cleanup(func() {
		mine.Close() // EOF: the helper finalizes and exits
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Error("the helper did not exit within 30 s of its control connection's EOF")
			<-done
		}
	})
	return mine
}

// passConn opens a call connection and passes its end over ctl.
func passConn(t *testing.T, ctl *os.File) *os.File {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Sendmsg(int(ctl.Fd()), []byte{0}, syscall.UnixRights(fds[1]), nil, 0); err != nil {
		t.Fatal(err)
	}
	syscall.Close(fds[1])
	f := os.NewFile(uintptr(fds[0]), "call")
	t.Cleanup(func() { f.Close() })
	return f
}

func words(vs ...uint64) []byte {
	b := make([]byte, 0, 8*len(vs))
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return b
}

func le64(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }

func writeFrame(t *testing.T, f *os.File, body []byte) {
	t.Helper()
	if _, err := f.Write(append(binary.LittleEndian.AppendUint32(nil, uint32(len(body))), body...)); err != nil {
		t.Fatal(err)
	}
}

func readFrame(t *testing.T, f *os.File) []byte {
	t.Helper()
	f.SetReadDeadline(time.Now().Add(time.Minute))
	var h [4]byte
	if _, err := io.ReadFull(f, h[:]); err != nil {
		t.Fatalf("read a frame header: %v", err)
	}
	b := make([]byte, binary.LittleEndian.Uint32(h[:]))
	if _, err := io.ReadFull(f, b); err != nil {
		t.Fatalf("read a frame: %v", err)
	}
	return b
}
