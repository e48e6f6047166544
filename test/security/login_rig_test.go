package security

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
)

// The login tests' world outside the test process: the real haagent, hactl
// and libhapkcs11.so, built for each test, on SoftHSM tokens of a
// token directory of the test's own (each process reads SOFTHSM2_CONF at
// its own C_Initialize). Every member is reached through loginShim, a
// PKCS#11 module that hands out SoftHSM's own function list with C_Login
// wrapped: each call appends "token-label rv" to the file named by
// LOGIN_SHIM_LOG before it returns, so a test counts the C_Login calls
// every member saw, in any process, without trusting our own code's word.
const loginShimSource = `
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "hapkcs11.h"

static CK_FUNCTION_LIST shim;
static CK_FUNCTION_LIST_PTR real;

static CK_RV shim_login(CK_SESSION_HANDLE h, CK_USER_TYPE u, CK_UTF8CHAR_PTR pin, CK_ULONG n)
{
	CK_RV rv = real->C_Login(h, u, pin, n);
	const char *path = getenv("LOGIN_SHIM_LOG");
	if (path == NULL || *path == 0)
		return rv;
	char label[33] = "?";
	CK_SESSION_INFO si;
	CK_TOKEN_INFO ti;
	if (real->C_GetSessionInfo(h, &si) == CKR_OK && real->C_GetTokenInfo(si.slotID, &ti) == CKR_OK) {
		memcpy(label, ti.label, 32);
		label[32] = 0;
		for (int i = 31; i >= 0 && label[i] == ' '; i--)
			label[i] = 0;
	}
	char line[80];
	int len = snprintf(line, sizeof line, "%s 0x%lx\n", label, (unsigned long)rv);
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0600);
	if (fd >= 0) {
		if (write(fd, line, len) != len) { /* the test sees a short count */ }
		close(fd);
	}
	return rv;
}

CK_RV C_GetFunctionList(CK_FUNCTION_LIST_PTR_PTR pp)
{
	if (pp == NULL)
		return CKR_ARGUMENTS_BAD;
	if (real == NULL) {
		void *h = dlopen("` + testhsm.SoftHSMModule + `", RTLD_NOW | RTLD_LOCAL);
		if (h == NULL)
			return CKR_GENERAL_ERROR;
		CK_RV (*get)(CK_FUNCTION_LIST_PTR_PTR) = (CK_RV (*)(CK_FUNCTION_LIST_PTR_PTR))dlsym(h, "C_GetFunctionList");
		if (get == NULL || get(&real) != CKR_OK)
			return CKR_GENERAL_ERROR;
		shim = *real;
		shim.C_Login = shim_login;
	}
	*pp = &shim;
	return CKR_OK;
}
`

// loginRepo is the repository root.
func loginRepo() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// loginBuild builds haagent, hactl, hsmprep, libhapkcs11.so and the shim
// into a directory of the test's own (removed with it; the Go build cache
// makes the builds after the first one cheap).
func loginBuild(t *testing.T) string {
	t.Helper()
	for _, tool := range []string{"softhsm2-util", "pkcs11-tool", "gcc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (scripts/deps.sh installs it)", tool)
		}
	}
	dir := t.TempDir()
	repo := loginRepo()
	shim := filepath.Join(dir, "shim.c")
	if err := os.WriteFile(shim, []byte(loginShimSource), 0o600); err != nil {
		t.Fatal(err)
	}
	steps := [][]string{
		{"gcc", "-Wall", "-Werror", "-O2", "-shared", "-fPIC", "-I", filepath.Join(repo, "cmd", "hapkcs11"),
			"-o", filepath.Join(dir, "loginshim.so"), shim, "-ldl"},
		{"go", "build", "-o", filepath.Join(dir, "haagent"), "./cmd/haagent"},
		{"go", "build", "-o", filepath.Join(dir, "hactl"), "./cmd/hactl"},
		{"go", "build", "-o", filepath.Join(dir, "hsmprep"), "./test/module/hsmprep"},
		{"go", "build", "-trimpath", "-buildmode=c-shared", "-ldflags=-s -w", "-o", filepath.Join(dir, "libhapkcs11.so"), "./cmd/hapkcs11"},
	}
	for _, s := range steps {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
		cmd := exec.CommandContext(ctx, s[0], s[1:]...)
		cmd.Dir = repo
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(s, " "), err, out)
		}
	}
	return dir
}

// Group identity of every login rig.
const (
	loginGroup   = "signing"
	loginSerial  = "1000001"
	loginVirtual = "0xf4241" // the serial as a slot ID
)

// loginRig is one test's world: three member tokens behind the shim, PIN
// files, a configuration and the environment of every process it runs.
type loginRig struct {
	t        *testing.T
	bin      string
	dir      string
	conf     string
	shimLog  string
	labels   []string // member i is "hsm-i" on token labels[i]
	pinFiles []string // member i's pin_file ("" for none)
	metrics  string   // haagent's metrics address
	env      []string
}

// loginRigOpts says which members have a pin_file, and what it holds.
type loginRigOpts struct {
	// pins[i] is what member i's pin_file holds; "" gives member i no PIN
	// source (it logs in with the application's PIN).
	pins [3]string
}

// newLoginRig makes, for the programs in bin (loginBuild), the tokens, the PIN files and the configuration, and
// installs the group's domain key (with hsmprep, whose C_Login calls are
// not counted).
func newLoginRig(t *testing.T, bin string, o loginRigOpts) *loginRig {
	t.Helper()
	r := &loginRig{t: t, bin: bin, dir: t.TempDir()}
	tokens := filepath.Join(r.dir, "tokens")
	if err := os.Mkdir(tokens, 0o700); err != nil {
		t.Fatal(err)
	}
	soft := r.write("softhsm2.conf", "directories.tokendir = "+tokens+"\nobjectstore.backend = file\nlog.level = ERROR\nslots.removable = false\n")
	r.shimLog = filepath.Join(r.dir, "logins")
	r.conf = filepath.Join(r.dir, "hagroup.toml")
	r.labels = []string{"ha-0", "ha-1", "ha-2"}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if _, err := testhsm.InitTokens(ctx, soft, r.labels, testhsm.UserPIN, testhsm.SOPIN); err != nil {
		t.Fatal(err)
	}
	for i, pin := range o.pins {
		f := ""
		if pin != "" {
			f = r.write(fmt.Sprintf("pin-%d", i), pin+"\n")
		}
		r.pinFiles = append(r.pinFiles, f)
	}
	r.env = append(os.Environ(), "SOFTHSM2_CONF="+soft, "HAGROUP_CONF="+r.conf)
	r.metrics = loginFreeAddr(t)
	r.write("hagroup.toml", r.config(r.pinFiles))
	// The domain key and nothing else, through the members' own module,
	// with every member's PIN known to the operator.
	user := r.write("prep-user.pin", testhsm.UserPIN+"\n")
	so := r.write("prep-so.pin", testhsm.SOPIN+"\n")
	prep := r.write("prep.toml", r.config([]string{"", "", ""}))
	r.mustRun(nil, filepath.Join(r.bin, "hsmprep"), "-config", prep, "-group", loginGroup, "-user-pin-file", user, "-so-pin-file", so)
	if err := os.Remove(r.shimLog); err != nil {
		t.Fatalf("hsmprep's logins were not counted: %v", err)
	}
	return r
}

// config renders group "signing" with members hsm-0..2 behind the shim,
// member i with pin_file pinFiles[i] when not empty.
func (r *loginRig) config(pinFiles []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[agent]\nsocket = %q\nstate_dir = %q\nlog_file = %q\n",
		filepath.Join(r.dir, "haagent.sock"), filepath.Join(r.dir, "state"), filepath.Join(r.dir, "ha.log"))
	if r.metrics != "" {
		fmt.Fprintf(&b, "metrics = %q\n", r.metrics)
	}
	b.WriteString("\n")
	b.WriteString("[ha]\ninterval = \"1s\"\nretries = -1\ncommand_timeout = \"10s\"\nprobe_interval = \"1s\"\n\n")
	fmt.Fprintf(&b, "[[group]]\nlabel = %q\nserial = %q\n", loginGroup, loginSerial)
	for i, label := range r.labels {
		fmt.Fprintf(&b, "\n  [[group.member]]\n  name = \"hsm-%d\"\n  module = %q\n  token_label = %q\n", i, filepath.Join(r.bin, "loginshim.so"), label)
		if pinFiles[i] != "" {
			fmt.Fprintf(&b, "  pin_file = %q\n", pinFiles[i])
		}
	}
	return b.String()
}

func (r *loginRig) write(name, body string) string {
	r.t.Helper()
	p := filepath.Join(r.dir, name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		r.t.Fatal(err)
	}
	return p
}

// run runs a program with the rig's environment plus env (the shim counts
// its logins) and a deadline, and returns its combined output.
func (r *loginRig) run(env []string, name string, args ...string) (string, error) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(r.t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(append(append([]string{}, r.env...), "LOGIN_SHIM_LOG="+r.shimLog), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// hactlStdout runs hactl like run, and returns its standard output alone.
func (r *loginRig) hactlStdout(args ...string) (string, error) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(r.t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(r.bin, "hactl"), append([]string{"--config", r.conf}, args...)...)
	cmd.Env = r.env
	out, err := cmd.Output()
	return string(out), err
}

func (r *loginRig) mustRun(env []string, name string, args ...string) string {
	r.t.Helper()
	out, err := r.run(env, name, args...)
	if err != nil {
		r.t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return out
}

// loginCall is one C_Login a member's token answered.
type loginCall struct{ label, rv string }

// logins returns every C_Login the shim saw, in order.
func (r *loginRig) logins() []loginCall {
	r.t.Helper()
	f, err := os.Open(r.shimLog)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		r.t.Fatal(err)
	}
	defer f.Close()
	var out []loginCall
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		label, rv, _ := strings.Cut(sc.Text(), " ")
		out = append(out, loginCall{label, rv})
	}
	return out
}

// loginsOn counts the C_Login calls token label answered with rv ("":
// any).
func (r *loginRig) loginsOn(label, rv string) int {
	n := 0
	for _, c := range r.logins() {
		if c.label == label && (rv == "" || c.rv == rv) {
			n++
		}
	}
	return n
}

// Return values in the shim's log.
const (
	loginRVOK        = "0x0"
	loginRVIncorrect = "0xa0"
)

// agent runs haagent on the rig until the test ends, and waits for its
// socket to answer.
func (r *loginRig) agent() {
	r.t.Helper()
	cmd := exec.Command(filepath.Join(r.bin, "haagent"), "--config", r.conf)
	cmd.Env = append(append([]string{}, r.env...), "LOGIN_SHIM_LOG="+r.shimLog)
	out := &strings.Builder{}
	var mu sync.Mutex
	cmd.Stdout = lockedWriter{&mu, out}
	cmd.Stderr = lockedWriter{&mu, out}
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	r.t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		mu.Lock()
		defer mu.Unlock()
		if r.t.Failed() {
			r.t.Logf("haagent output:\n%s", out.String())
		}
	})
	sock := filepath.Join(r.dir, "haagent.sock")
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-done:
			r.t.Fatalf("haagent exited before its socket answered:\n%s", out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("haagent's socket %s does not answer after 30s", sock)
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *strings.Builder
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// loginMemberJSON is what the login tests read of a member in
// `hactl hagroup listgroups --json`.
type loginMemberJSON struct {
	Name             string `json:"name"`
	State            string `json:"state"`
	PINBlocked       bool   `json:"pinBlocked"`
	PINBlockedReason string `json:"pinBlockedReason"`
	Attempts         int    `json:"attempts"`
}

// members returns the members as haagent reports them.
func (r *loginRig) members() map[string]loginMemberJSON {
	r.t.Helper()
	out, err := r.hactlStdout("hagroup", "listgroups", "--json")
	var exit *exec.ExitError
	if err != nil && (!errors.As(err, &exit) || exit.ExitCode() != 3) { // 3: degraded, as it is while a member is out
		r.t.Fatalf("hactl hagroup listgroups --json: %v\n%s", err, out)
	}
	var doc struct {
		Groups []struct {
			Label   string            `json:"label"`
			Members []loginMemberJSON `json:"members"`
		} `json:"groups"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		r.t.Fatalf("listgroups --json: %v\n%s", err, out)
	}
	ms := map[string]loginMemberJSON{}
	for _, g := range doc.Groups {
		for _, m := range g.Members {
			ms[m.Name] = m
		}
	}
	return ms
}

// waitMember polls haagent (every 100 ms, 30 s at most) until member
// name's state satisfies cond.
func (r *loginRig) waitMember(name, what string, cond func(loginMemberJSON) bool) loginMemberJSON {
	r.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		m := r.members()[name]
		if cond(m) {
			return m
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("member %s: not %s within 30s (last seen %+v)", name, what, m)
		}
		time.Sleep(100 * time.Millisecond) // polling a process's state, bounded by the deadline
	}
}

// loginFreeAddr returns a loopback address no one listens on now.
func loginFreeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// metric returns the line of haagent's /metrics that starts with name.
func (r *loginRig) metric(name string) string {
	r.t.Helper()
	resp, err := http.Get("http://" + r.metrics + "/metrics")
	if err != nil {
		r.t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), name) {
			return sc.Text()
		}
	}
	return ""
}
