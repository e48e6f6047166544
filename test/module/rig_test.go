// Package module tests libhapkcs11.so the way applications use it: real
// PKCS#11 clients (pkcs11-tool, p11tool, OpenSSL's pkcs11 engine,
// ssh-keygen, Java's SunPKCS11, nginx and Apache httpd with forked
// workers, a Python multiprocessing pool, and C programs) load the built
// library and work on a virtual slot whose members are real SoftHSM
// tokens, one of them served by hagroup's hsmserve or by a real `p11-kit
// server`, which the failover and outage tests kill and restart. Every test has its own token
// directory (SOFTHSM2_CONF) and configuration.
package module

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
)

// Built once per test binary, into workDir.
var (
	workDir string
	repoDir string
	builds  sync.Map // name -> *built
)

type built struct {
	once sync.Once
	path string
	err  error
}

func TestMain(m *testing.M) {
	testhsm.MakerMain() // a child re-executed to make tokens ends here
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "hapkcs11-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	workDir = dir
	_, file, _, _ := runtime.Caller(0)
	repoDir = filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	return m.Run()
}

// buildOnce runs make once per name and returns the artifact's path.
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

// command runs a build step with a deadline, returning its output on error.
func command(timeout time.Duration, dir string, name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// library builds bin/libhapkcs11.so and, beside it, the helper that
// serves its forked children (bin/hapkcs11-helper), as the Makefile does.
func library(t testing.TB) string {
	buildOnce(t, "hapkcs11-helper", func(out string) error {
		return command(2*time.Minute, repoDir, "gcc", "-O2", "-Wall", "-Werror",
			"-o", out, filepath.Join(repoDir, "cmd", "hapkcs11", "helper", "hapkcs11-helper.c"), "-ldl")
	})
	return buildOnce(t, "libhapkcs11.so", func(out string) error {
		return command(5*time.Minute, repoDir, "go", "build", "-trimpath", "-buildmode=c-shared",
			"-ldflags=-s -w", "-o", out, "./cmd/hapkcs11")
	})
}

// cprog compiles one of the C programs in c/.
func cprog(t testing.TB, name string) string {
	return buildOnce(t, name, func(out string) error {
		return command(2*time.Minute, repoDir, "gcc", "-Wall", "-Werror", "-O2",
			"-I", filepath.Join(repoDir, "cmd", "hapkcs11"),
			"-o", out, filepath.Join(repoDir, "test", "module", "c", name+".c"), "-ldl", "-lpthread")
	})
}

func hsmprep(t testing.TB) string {
	return buildOnce(t, "hsmprep", func(out string) error {
		return command(5*time.Minute, repoDir, "go", "build", "-o", out, "./test/module/hsmprep")
	})
}

// Group identity every rig uses.
const (
	groupLabel  = "signing"
	groupSerial = "1000001"
	virtualSlot = "0xf4241" // the serial as a slot ID
)

// rig is one test's world: member tokens, PIN files, a configuration and
// the environment that points clients at them.
type rig struct {
	t    testing.TB
	dir  string
	lib  string
	conf string
	// softConf is the SoftHSM configuration of the rig's local tokens.
	softConf string
	pinFile  string
	soFile   string
	logFile  string
	env      []string
	members  []testhsm.Token
	served   *testhsm.Served
	// remotes are every member served by hsmserve, in member order.
	remotes []*testhsm.Served
	mode    string // recovery_mode written to the configuration
}

type rigOpts struct {
	only   bool   // HAOnly: no member slots listed
	served bool   // the last member is served by p11-kit server
	remote bool   // the last member is served by hagroup's hsmserve (hagroup-remote: module path)
	ecKey  string // "LABEL,IDHEX": an EC key pair made through the engine with every member reached directly
	solo   bool   // with served or remote: the served member is the only one
	// allRemote: every one of the three members is served by hsmserve
	// (r.served is the last).
	allRemote bool
	mode      string // recovery_mode; "": the default (activeBasic)
}

// newRig makes three members (two in-process SoftHSM tokens and, with
// served, one behind p11-kit server, with remote one behind hsmserve;
// otherwise three SoftHSM tokens), a configuration naming them as group
// "signing", and installs the group's domain key on every member.
func newRig(t testing.TB, o rigOpts) *rig {
	t.Helper()
	r := &rig{t: t, dir: t.TempDir(), lib: library(t)}
	r.pinFile = r.write("user.pin", testhsm.UserPIN+"\n")
	r.soFile = r.write("so.pin", testhsm.SOPIN+"\n")
	r.logFile = r.write("ha.log", "")
	// The member served by p11-kit server lives in the token directory
	// testhsm.Serve made for it; the other members are put in the same
	// directory, so that one SoftHSM (hsmprep's) sees all three to install
	// the domain key. Otherwise the rig has its own directory.
	var softConf string
	if o.served && o.remote {
		t.Fatal("rigOpts: served and remote are exclusive")
	}
	if o.served {
		r.served = testhsm.Serve(t, "ha-2")
		softConf = filepath.Join(filepath.Dir(strings.TrimPrefix(r.served.Address(), "unix:path=")), "softhsm2.conf")
		if _, err := os.Stat(softConf); err != nil {
			t.Fatalf("the served token's SoftHSM configuration is not beside its socket: %v", err)
		}
	} else {
		tokens := filepath.Join(r.dir, "tokens")
		if err := os.Mkdir(tokens, 0o700); err != nil {
			t.Fatal(err)
		}
		softConf = r.write("softhsm2.conf", "directories.tokendir = "+tokens+"\nobjectstore.backend = file\nlog.level = ERROR\nslots.removable = false\n")
	}
	r.softConf = softConf
	r.env = append(os.Environ(),
		"SOFTHSM2_CONF="+softConf,
		"HAGROUP_CONF="+filepath.Join(r.dir, "hagroup.toml"),
		"HA_PIN="+testhsm.UserPIN,     // for pkcs11-tool --pin env:HA_PIN (never on a command line)
		"GNUTLS_PIN="+testhsm.UserPIN, // p11tool's PIN source
	)
	local := 3
	if o.served || o.remote {
		local = 2
	}
	if o.solo || o.allRemote {
		local = 0
	}
	for i := 0; i < local; i++ {
		label := fmt.Sprintf("ha-%d", i)
		r.initToken(label)
		r.members = append(r.members, testhsm.Token{Name: fmt.Sprintf("hsm-%d", i), Label: label,
			Module: testhsm.SoftHSMModule, UserPIN: testhsm.UserPIN, SOPIN: testhsm.SOPIN})
	}
	if o.served {
		tok := r.served.Token()
		tok.Name = "hsm-2"
		r.members = append(r.members, tok)
		// libhapkcs11.so never writes the application's environment: the
		// operator sets the p11-kit member's address for the application.
		for k, v := range tok.ModuleEnv {
			r.env = append(r.env, k+"="+v)
		}
	}
	if o.remote {
		// hsmserve carries CKM_AES_KEY_WRAP_PAD and nested templates, so
		// the domain key and private keys reach this member through its
		// server like any other.
		for i := local; i < 3; i++ {
			if o.solo && i < 2 {
				continue
			}
			r.served = testhsm.ServeRemote(t, fmt.Sprintf("ha-%d", i))
			r.remotes = append(r.remotes, r.served)
			tok := r.served.Token()
			tok.Name = fmt.Sprintf("hsm-%d", i)
			r.members = append(r.members, tok)
		}
	}
	r.mode = o.mode
	r.conf = r.write("hagroup.toml", r.config(o.only, r.members))
	// The domain key goes in as an operator would put it, through each
	// member's own module: p11-kit's RPC (0.24) cannot carry the nested
	// CKA_UNWRAP_TEMPLATE the install needs, so hsmprep reaches the served
	// token directly.
	direct := append([]testhsm.Token{}, r.members...)
	for i := range direct {
		if o.served {
			direct[i].Module, direct[i].ModuleEnv = testhsm.SoftHSMModule, nil
		}
	}
	prepConf := r.write("prep.toml", r.config(o.only, direct))
	prep := []string{"-config", prepConf, "-group", groupLabel, "-user-pin-file", r.pinFile, "-so-pin-file", r.soFile}
	if o.ecKey != "" {
		prep = append(prep, "-ec-key", o.ecKey)
	}
	r.mustRun(2*time.Minute, hsmprep(t), prep...)
	return r
}

// config renders a configuration of group "signing" with members ms.
func (r *rig) config(only bool, ms []testhsm.Token) string {
	var b strings.Builder
	// A socket of the rig's own: the library reports to no agent on the
	// default path (test/install runs one there) and logs to log_file.
	fmt.Fprintf(&b, "[agent]\nsocket = %q\nstate_dir = %q\nlog_file = %q\n\n", filepath.Join(r.dir, "no-agent.sock"), filepath.Join(r.dir, "state"), r.logFile)
	fmt.Fprintf(&b, "[ha]\nonly = %v\ninterval = \"1s\"\ncommand_timeout = \"10s\"\n", only)
	if r.mode != "" {
		fmt.Fprintf(&b, "recovery_mode = %q\n", r.mode)
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "[[group]]\nlabel = %q\nserial = %q\n", groupLabel, groupSerial)
	for _, m := range ms {
		fmt.Fprintf(&b, "\n  [[group.member]]\n  name = %q\n  module = %q\n  token_label = %q\n", m.Name, m.Module, m.Label)
		for k, v := range m.ModuleEnv {
			fmt.Fprintf(&b, "  module_env = { %s = %q }\n", k, v)
		}
	}
	return b.String()
}

func (r *rig) write(name, body string) string {
	r.t.Helper()
	p := filepath.Join(r.dir, name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		r.t.Fatal(err)
	}
	return p
}

// run runs a client with the rig's environment and a deadline and returns
// its combined output and error.
func (r *rig) run(timeout time.Duration, env []string, name string, args ...string) (string, error) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(r.t.Context(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(append([]string{}, r.env...), env...)
	cmd.Dir = r.dir
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("%s: no answer within %v: %w", name, timeout, ctx.Err())
	}
	return string(out), err
}

// mustRun is run that fails the test on error, showing the output.
// initToken makes a token labelled label in the rig's SoftHSM token
// directory, with the harness's PINs.
func (r *rig) initToken(label string) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(r.t.Context(), 2*time.Minute)
	defer cancel()
	if _, err := testhsm.InitTokens(ctx, r.softConf, []string{label}, testhsm.UserPIN, testhsm.SOPIN); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rig) mustRun(timeout time.Duration, name string, args ...string) string {
	r.t.Helper()
	out, err := r.run(timeout, nil, name, args...)
	if err != nil {
		r.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// tool runs pkcs11-tool on libhapkcs11.so.
func (r *rig) tool(args ...string) string {
	r.t.Helper()
	return r.mustRun(2*time.Minute, "pkcs11-tool", append([]string{"--module", r.lib}, args...)...)
}

// direct runs pkcs11-tool on a member's own module and token.
func (r *rig) direct(m testhsm.Token, args ...string) string {
	r.t.Helper()
	var env []string
	for k, v := range m.ModuleEnv {
		env = append(env, k+"="+v)
	}
	all := append([]string{"--module", m.Module, "--token-label", m.Label}, args...)
	out, err := r.run(2*time.Minute, env, "pkcs11-tool", all...)
	if err != nil {
		r.t.Fatalf("pkcs11-tool on member %s: %s: %v\n%s", m.Name, strings.Join(all, " "), err, out)
	}
	return out
}

// keypair makes an EC P-256 key pair on the virtual slot.
func (r *rig) keypair(label, id string) {
	r.t.Helper()
	r.tool("--slot", virtualSlot, "--login", "--pin", "env:HA_PIN", "--keypairgen",
		"--key-type", "EC:prime256v1", "--label", label, "--id", id)
}

// slots parses `pkcs11-tool -L` into slot ID → description and token label.
type listedSlot struct{ ID, Desc, Label, Serial, Manufacturer, Model string }

var slotLine = regexp.MustCompile(`^Slot \d+ \((0x[0-9a-f]+)\): (.*)$`)

func parseSlots(out string) []listedSlot {
	var list []listedSlot
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if m := slotLine.FindStringSubmatch(line); m != nil {
			list = append(list, listedSlot{ID: m[1], Desc: strings.TrimSpace(m[2])})
			continue
		}
		if len(list) == 0 {
			continue
		}
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		cur := &list[len(list)-1]
		switch strings.TrimSpace(k) {
		case "token label":
			cur.Label = strings.TrimSpace(v)
		case "serial num":
			cur.Serial = strings.TrimSpace(v)
		case "token manufacturer":
			cur.Manufacturer = strings.TrimSpace(v)
		case "token model":
			cur.Model = strings.TrimSpace(v)
		}
	}
	return list
}

// memberSlot returns the slot ID libhapkcs11.so gives a member's own token.
func (r *rig) memberSlot(name string) string {
	r.t.Helper()
	for _, s := range parseSlots(r.tool("-L")) {
		if s.Desc == "hagroup member "+name+" of "+groupLabel {
			return s.ID
		}
	}
	r.t.Fatalf("no slot for member %s", name)
	return ""
}

// readPub returns the DER public key with the given ID, via pkcs11-tool.
func (r *rig) readPub(args []string, id string) []byte {
	r.t.Helper()
	out := filepath.Join(r.dir, fmt.Sprintf("pub-%d.der", time.Now().UnixNano()))
	all := append(append([]string{}, args...), "--read-object", "--type", "pubkey", "--id", id, "-o", out)
	r.mustRun(2*time.Minute, "pkcs11-tool", all...)
	b, err := os.ReadFile(out)
	if err != nil {
		r.t.Fatal(err)
	}
	return b
}

// memberArgs are pkcs11-tool's arguments for a member's own token.
func memberArgs(m testhsm.Token) []string {
	return []string{"--module", m.Module, "--token-label", m.Label}
}

// haLog returns the HA event log.
func (r *rig) haLog() string {
	b, _ := os.ReadFile(r.logFile)
	return string(b)
}

func containsAll(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}

var _ = bytes.Equal
