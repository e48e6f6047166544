package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/fleet"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/tombstone"
	"github.com/miekg/pkcs11"
	"github.com/rogpeppe/go-internal/testscript"
)

// The testscript suites in testdata/script build the real hactl and
// haagent and drive them as an operator would, on a private SoftHSM token
// directory with three tokens (ha-a, ha-b, ha-c) per script.

const (
	softhsmModule = "/usr/lib/softhsm/libsofthsm2.so"
	p11kitClient  = "/usr/lib/x86_64-linux-gnu/pkcs11/p11-kit-client.so"
	scriptUserPIN = "script-user-1234"
	scriptSOPIN   = "script-so-5678"
	// waitDeadline bounds every wait of the custom commands.
	waitDeadline = 20 * time.Second
)

// scriptVersion is the version the scripts' binaries report.
const scriptVersion = "script-test"

// binDir holds the freshly built binaries; set up once by buildBinaries.
var buildOnce struct {
	sync.Once
	dir string
	err error
}

func buildBinaries(t *testing.T) string {
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "hactl-bin-")
		if err != nil {
			buildOnce.err = err
			return
		}
		os.Chmod(dir, 0o755) // a second uid runs hactl from here
		for _, c := range []string{"hactl", "haagent", "hsmserve"} {
			// A fixed version, so scripts can compare what the binaries report.
			cmd := exec.Command("go", "build", "-ldflags=-X github.com/hagroup/hagroup/internal/version.stamped="+scriptVersion,
				"-o", filepath.Join(dir, c), "github.com/hagroup/hagroup/cmd/"+c)
			if out, err := cmd.CombinedOutput(); err != nil {
				buildOnce.err = fmt.Errorf("go build %s: %v\n%s", c, err, out)
				return
			}
		}
		buildOnce.dir = dir
	})
	if buildOnce.err != nil {
		t.Fatal(buildOnce.err)
	}
	return buildOnce.dir
}

func TestScripts(t *testing.T) {
	for _, tool := range []string{"softhsm2-util", "p11-kit"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (scripts/deps.sh installs it)", tool)
		}
	}
	bin := buildBinaries(t)
	testscript.Run(t, testscript.Params{
		Dir:                 "testdata/script",
		RequireExplicitExec: true,
		Setup:               func(env *testscript.Env) error { return setupScript(env, bin) },
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"waitsock":  cmdWaitSock,
			"waitstate": cmdWaitState,
			"agentsig":  cmdAgentSig,
			"p11serve":  cmdP11Serve,
			"p11kill":   cmdP11Kill,
			"hsmserve":  cmdHSMServe,
			"scrub":     cmdScrub,
			"envsubst":  cmdEnvsubst,
			"jsondoc":   cmdJSONDoc,
			"stalled":   cmdStalled,
		},
	})
}

// scriptState is what the custom commands keep per script.
type scriptState struct {
	mu      sync.Mutex
	servers map[string]*exec.Cmd // p11-kit servers by token label
}

type stateKey struct{}

func stateOf(ts *testscript.TestScript) *scriptState {
	return ts.Value(stateKey{}).(*scriptState)
}

// setupScript gives each script its own SoftHSM token directory with three
// tokens, a PIN file, a short directory for sockets, and the binaries on
// PATH. Variables: SOFTHSM2_CONF, HAGROUP_CONF, SOCK, SHORT, PINFILE,
// SOFTHSM, P11CLIENT, SO_PIN_ENV (the name of a variable holding the SO PIN).
func setupScript(env *testscript.Env, bin string) error {
	short, err := os.MkdirTemp("", "hs-")
	if err != nil {
		return err
	}
	os.Chmod(short, 0o755)
	env.Defer(func() { os.RemoveAll(short) })
	conf := filepath.Join(env.WorkDir, "softhsm2.conf")
	tokens := filepath.Join(env.WorkDir, "tokens")
	if err := os.MkdirAll(tokens, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(conf, []byte("directories.tokendir = "+tokens+"\nobjectstore.backend = file\nlog.level = ERROR\n"), 0o600); err != nil {
		return err
	}
	for _, l := range []string{"ha-a", "ha-b", "ha-c"} {
		if err := initToken(conf, l); err != nil {
			return err
		}
	}
	pin := filepath.Join(env.WorkDir, "pin")
	if err := os.WriteFile(pin, []byte(scriptUserPIN+"\n"), 0o600); err != nil {
		return err
	}
	env.Setenv("PATH", bin+string(os.PathListSeparator)+env.Getenv("PATH"))
	env.Setenv("SOFTHSM2_CONF", conf)
	env.Setenv("HAGROUP_CONF", filepath.Join(env.WorkDir, "hagroup.toml"))
	env.Setenv("SHORT", short)
	env.Setenv("SOCK", filepath.Join(short, "agent.sock"))
	env.Setenv("PINFILE", pin)
	env.Setenv("SOFTHSM", softhsmModule)
	env.Setenv("P11CLIENT", p11kitClient)
	env.Setenv("HSM_SO_PIN", scriptSOPIN)
	env.Setenv("HACTL_BIN", filepath.Join(bin, "hactl"))
	docs, err := filepath.Abs(filepath.Join("..", "..", "docs", "json"))
	if err != nil {
		return err
	}
	env.Setenv("DOCS_JSON", docs)
	st := &scriptState{servers: map[string]*exec.Cmd{}}
	env.Values[stateKey{}] = st
	env.Defer(func() {
		st.mu.Lock()
		defer st.mu.Unlock()
		for _, c := range st.servers {
			killGroup(c)
		}
	})
	return nil
}

// initToken makes one token. A token served by p11-kit gets its own token
// directory (tokens-LABEL), so its server can be killed alone.
func initToken(conf, label string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := testhsm.InitTokens(ctx, conf, []string{label}, scriptUserPIN, scriptSOPIN)
	return err
}

// waitsock PATH: wait (up to the deadline) until a Unix socket accepts.
func cmdWaitSock(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 1 {
		ts.Fatalf("usage: waitsock PATH")
	}
	deadline := time.Now().Add(waitDeadline)
	for {
		c, err := net.DialTimeout("unix", args[0], time.Second)
		if err == nil {
			c.Close()
			if neg {
				ts.Fatalf("%s accepts connections", args[0])
			}
			return
		}
		if neg {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("socket %s did not answer within %v: %v", args[0], waitDeadline, err)
		}
		time.Sleep(20 * time.Millisecond) // poll interval of a wait with a deadline
	}
}

// waitstate GROUP MEMBER STATE: wait until the agent on $SOCK reports the
// member in STATE.
func cmdWaitState(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 3 || neg {
		ts.Fatalf("usage: waitstate GROUP MEMBER STATE")
	}
	c := agent.NewClient(ts.Getenv("SOCK"))
	defer c.Close()
	deadline := time.Now().Add(waitDeadline)
	last := "no answer"
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		rep, err := c.ListGroups(ctx, args[0])
		cancel()
		if err == nil {
			for _, g := range rep.Groups {
				for _, m := range g.Members {
					if m.Name == args[1] {
						if m.State == args[2] {
							return
						}
						last = m.State + " (" + m.LastError + ")"
					}
				}
			}
		} else {
			last = err.Error()
		}
		time.Sleep(50 * time.Millisecond)
	}
	ts.Fatalf("member %s of %s not %s within %v; last seen: %s", args[1], args[0], args[2], waitDeadline, last)
}

// agentsig SIGNAL: send HUP or TERM to the agent answering on $SOCK.
func cmdAgentSig(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 1 || neg {
		ts.Fatalf("usage: agentsig HUP|TERM")
	}
	sig := map[string]syscall.Signal{"HUP": syscall.SIGHUP, "TERM": syscall.SIGTERM}[args[0]]
	if sig == 0 {
		ts.Fatalf("unknown signal %s", args[0])
	}
	c := agent.NewClient(ts.Getenv("SOCK"))
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.Status(ctx)
	ts.Check(err)
	ts.Check(syscall.Kill(st.PID, sig))
}

// p11serve LABEL: serve token LABEL, made in its own token directory, with
// `p11-kit server` on $SHORT/LABEL.sock (own process group), and wait
// until it answers. Running it again restarts the server on the same
// token and socket.
func cmdP11Serve(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 1 || neg {
		ts.Fatalf("usage: p11serve LABEL")
	}
	label := args[0]
	sock := serveToken(ts, label, "p11-kit server", ".sock", "server.log", func(sock string) *exec.Cmd {
		return exec.Command("p11-kit", "server", "-f", "-n", sock, "--provider", softhsmModule, "pkcs11:token="+label)
	})
	ts.Setenv(strings.ToUpper(strings.ReplaceAll(label, "-", "_"))+"_ADDR", "unix:path="+sock)
}

// serveToken makes token label in its own token directory (once), starts
// the server command (for the socket $SHORT/label+suffix) in its own
// process group, replacing a previous server of that label, and waits
// until the socket answers. It returns the socket path.
func serveToken(ts *testscript.TestScript, label, what, suffix, logName string, command func(sock string) *exec.Cmd) string {
	dir := filepath.Join(ts.Getenv("WORK"), "served-"+label)
	conf := filepath.Join(dir, "softhsm2.conf")
	if _, err := os.Stat(conf); errors.Is(err, os.ErrNotExist) {
		ts.Check(os.MkdirAll(filepath.Join(dir, "tokens"), 0o700))
		ts.Check(os.WriteFile(conf, []byte("directories.tokendir = "+filepath.Join(dir, "tokens")+"\nobjectstore.backend = file\nlog.level = ERROR\n"), 0o600))
		ts.Check(initToken(conf, label))
	}
	sock := filepath.Join(ts.Getenv("SHORT"), label+suffix)
	os.Remove(sock) // a killed server leaves it behind
	cmd := command(sock)
	cmd.Env = append(os.Environ(), "SOFTHSM2_CONF="+conf)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := os.Create(filepath.Join(dir, logName))
	ts.Check(err)
	cmd.Stdout, cmd.Stderr = out, out
	ts.Check(cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); out.Close() }()
	st := stateOf(ts)
	st.mu.Lock()
	if old := st.servers[label]; old != nil {
		killGroup(old)
	}
	st.servers[label] = cmd
	st.mu.Unlock()
	deadline := time.Now().Add(waitDeadline)
	for {
		select {
		case err := <-exited:
			ts.Fatalf("%s for %s exited: %v", what, label, err)
		default:
		}
		if c, err := net.DialTimeout("unix", sock, time.Second); err == nil {
			c.Close()
			return sock
		} else if time.Now().After(deadline) {
			ts.Fatalf("%s for %s did not answer on %s within %v", what, label, sock, waitDeadline)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// p11kill LABEL: SIGKILL the server of LABEL and its children.
func cmdP11Kill(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 1 || neg {
		ts.Fatalf("usage: p11kill LABEL")
	}
	st := stateOf(ts)
	st.mu.Lock()
	defer st.mu.Unlock()
	c := st.servers[args[0]]
	if c == nil {
		ts.Fatalf("no server for %s", args[0])
	}
	killGroup(c)
	delete(st.servers, args[0])
}

func killGroup(c *exec.Cmd) {
	if c.Process != nil {
		syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
	}
}

// removeBinaries runs the tests, then removes the binaries they built: not
// before, as -count runs every test again on the same binaries (without
// them, scripts would run whatever hactl is installed on PATH).
type removeBinaries struct{ m *testing.M }

func (r removeBinaries) Run() int {
	code := r.m.Run()
	if buildOnce.dir != "" {
		os.RemoveAll(buildOnce.dir)
	}
	return code
}

// TestMain registers the helper programs the scripts exec.
func TestMain(m *testing.M) {
	testhsm.MakerMain() // a child re-executed to make tokens ends here
	testscript.Main(removeBinaries{m}, map[string]func(){
		"mkkey":     mkkeyMain,
		"grpkey":    grpkeyMain,
		"lsobj":     lsobjMain,
		"olddomain": olddomainMain,
	})
}

// mkkey TOKEN LABEL [public] (exec'd by scripts): generate an EC P-256
// key pair on a SoftHSM token directly, as an application bypassing the
// group would, logged in with the PIN in $PINFILE. With "public" only the
// public half is kept on the token (it replicates without a domain key),
// and nothing logs in: both halves are public objects. A script may make
// such a key while haagent probes the token; a login is unsafe then:
// SoftHSM 2.6.1 rewrites token.object on every C_Login and lets go of the
// file's lock before its buffered bytes are written, so a C_GetTokenInfo
// in another process waiting for that lock reads the file empty and
// answers CKR_GENERAL_ERROR, and the probe fails the member. So scripts
// make a private key ("mkkey TOKEN LABEL") while no agent runs.
// It runs in its own process because SoftHSM reads SOFTHSM2_CONF once per
// process.
func mkkeyMain() {
	if err := mkkey(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mkkey:", err)
		os.Exit(1)
	}
}

func mkkey(args []string) error {
	if len(args) < 2 || len(args) > 3 || (len(args) == 3 && args[2] != "public") {
		return errors.New("usage: mkkey TOKEN LABEL [public]")
	}
	privOnToken := len(args) == 2
	spec := slot.Spec{Name: "mkkey", Module: softhsmModule, TokenLabel: args[0]}
	if privOnToken {
		b, err := os.ReadFile(os.Getenv("PINFILE"))
		if err != nil {
			return err
		}
		spec.PIN = secret.NewPIN([]byte(strings.TrimSpace(string(b))))
		defer spec.PIN.Zero()
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitDeadline)
	defer cancel()
	s, err := slot.Open(ctx, spec)
	if err != nil {
		return err
	}
	defer s.Close()
	ecParams := []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}
	pub := []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
		pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, ecParams),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, args[1]),
		pkcs11.NewAttribute(pkcs11.CKA_ID, []byte(args[1])),
		pkcs11.NewAttribute(pkcs11.CKA_VERIFY, true),
	}
	priv := []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, privOnToken),
		pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, privOnToken),
		pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true),
		pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, true),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, args[1]),
		pkcs11.NewAttribute(pkcs11.CKA_ID, []byte(args[1])),
		pkcs11.NewAttribute(pkcs11.CKA_SIGN, true),
	}
	_, _, err = s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil), pub, priv)
	return err
}

var scrubbers = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`"slotId": \d+`), `"slotId": 0`},
	{regexp.MustCompile(`"tokenSerial": "[0-9a-f]{16}"`), `"tokenSerial": "SERIAL"`},
	{regexp.MustCompile(`"(started|time|comparedAt)": "[^"]+"`), `"$1": "TIME"`},
	{regexp.MustCompile(`"comparedAgo": "[^"]+"`), `"comparedAgo": "AGE"`},
	{regexp.MustCompile(`"uptime": "[^"]+"`), `"uptime": "UPTIME"`},
	{regexp.MustCompile(`"pid": \d+`), `"pid": 0`},
}

// stalled GROUP MEMBER: report to the agent on $SOCK, as an application's
// engine does (pkg/fleet), that its tombstone register writer stalled in
// mid-write on MEMBER (the tombstone_stalled event pkg/ha emits for
// tombstone.ErrStalled). A real stall takes half a day of a paused host;
// pkg/sync/tombstone's TestFoldRacingAStalledOwnerLosesNothing makes one.
func cmdStalled(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: stalled GROUP MEMBER")
	}
	r := fleet.Start(fleet.Options{Socket: ts.Getenv("SOCK"), Program: "stalled-app"})
	r.GroupEvent(group.Event{Kind: group.TombstoneStalled, Group: args[0], Member: args[1],
		Err: fmt.Errorf("member %s: %w: 13h0m0s since the register's last write, 12h0m0s allowed", args[1], tombstone.ErrStalled)})
	r.Close() // sends the last report, with the event, and waits for it
}

// scrub FILE: replace what differs between runs (slot IDs, token serials,
// times, pids) with fixed placeholders, so JSON output can be compared
// with cmp.
func cmdScrub(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 1 || neg {
		ts.Fatalf("usage: scrub FILE")
	}
	p := ts.MkAbs(args[0])
	var data string
	if args[0] == "stdout" {
		data = ts.ReadFile("stdout")
	} else {
		b, err := os.ReadFile(p)
		ts.Check(err)
		data = string(b)
	}
	for _, s := range scrubbers {
		data = s.re.ReplaceAllString(data, s.with)
	}
	ts.Check(os.WriteFile(filepath.Join(ts.Getenv("WORK"), "scrubbed"), []byte(data), 0o644))
}

// envsubst IN OUT: copy IN to OUT with $VARIABLES replaced by the
// script's environment (config files that name $SOCK, $WORK, …).
func cmdEnvsubst(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 2 || neg {
		ts.Fatalf("usage: envsubst IN OUT")
	}
	out := os.Expand(ts.ReadFile(args[0]), ts.Getenv)
	ts.Check(os.WriteFile(ts.MkAbs(args[1]), []byte(out), 0o600))
}
