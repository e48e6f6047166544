package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/test/load"
	"golang.org/x/term"
)

// The group the demo builds.
const (
	groupLabel  = "demo"
	groupSerial = "1000001"
	slotID      = 1000001 // libhapkcs11.so's virtual slot ID: the serial
	keyLabel    = "demo-sign"
	keyID       = "01"
)

// memberPlan is one member of the demo group.
type memberPlan struct {
	name, label string
	standby     bool
}

func plan() []memberPlan {
	return []memberPlan{{"hsm-a", "ha-a", false}, {"hsm-b", "ha-b", false}, {"hsm-c", "ha-c", true}}
}

// demo is one run.
type demo struct {
	o   options
	reg *load.Registry
	w   io.Writer
	cwd string

	softConf, userFile, soFile string
	conf, sock                 string
	sockDir                    string // a temporary directory for sockets when out's path is long
	servers                    []*load.Server
	agentProc                  *load.Proc
	env                        []string // every child's environment

	outMu    sync.Mutex
	progress bool // a progress line is on the terminal
	tty      bool
}

// say prints one narrative line.
func (d *demo) say(format string, args ...any) {
	d.outMu.Lock()
	defer d.outMu.Unlock()
	d.clearProgress()
	fmt.Fprintf(d.w, format+"\n", args...)
}

// title starts a chapter of the story.
func (d *demo) title(format string, args ...any) {
	d.outMu.Lock()
	defer d.outMu.Unlock()
	d.clearProgress()
	fmt.Fprintf(d.w, "\n== "+format+"\n", args...)
}

func (d *demo) clearProgress() {
	if d.progress {
		fmt.Fprint(d.w, "\r\033[K")
		d.progress = false
	}
}

// show shortens the demo's own paths in what it prints. Socket addresses
// must stay absolute: they are shown under $PWD.
func (d *demo) show(s string) string {
	out := relTo(d.cwd, d.o.out)
	pairs := []string{
		"unix:path=" + d.o.out, "unix:path=$PWD/" + out,
		"unix:" + d.o.out, "unix:$PWD/" + out,
		"--socket " + d.o.out, "--socket $PWD/" + out,
		d.o.bin + "/", relTo(d.cwd, d.o.bin) + "/",
		d.o.out, out,
		load.SoftHSMModule, "libsofthsm2.so",
	}
	if d.sockDir != "" {
		pairs = append([]string{d.sockDir, "$SOCKDIR"}, pairs...)
	}
	return strings.NewReplacer(pairs...).Replace(s)
}

func relTo(base, p string) string {
	if r, err := filepath.Rel(base, p); err == nil && !strings.HasPrefix(r, "..") {
		return r
	}
	return p
}

// command is one command the demo runs and shows.
type command struct {
	env  []string // shown before the command, and added to its environment
	path string
	args []string
	ok   []int // exit codes that are not failures (default: 0)
	// filter keeps the lines to show (nil: all).
	filter func(string) (string, bool)
	quiet  bool // do not print the output
}

// exec runs c, shows it and its output, and returns the output and exit
// code. An exit code outside c.ok is an error.
func (d *demo) exec(ctx context.Context, c command) (string, int, error) {
	name := filepath.Base(c.path)
	line := strings.Join(append(append(append([]string{}, c.env...), name), c.args...), " ")
	d.say("$ %s", d.show(line))
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.path, c.args...)
	cmd.Env = append(append([]string{}, d.env...), c.env...)
	cmd.Dir = d.o.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	out, err := cmd.CombinedOutput()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		return string(out), -1, fmt.Errorf("%s: %w", name, err)
	}
	if !c.quiet {
		for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
			if c.filter != nil {
				var keep bool
				if l, keep = c.filter(l); !keep {
					continue
				}
			}
			if l != "" || c.filter == nil {
				d.say("    %s", d.show(l))
			}
		}
	}
	ok := c.ok
	if ok == nil {
		ok = []int{0}
	}
	for _, k := range ok {
		if code == k {
			return string(out), code, nil
		}
	}
	if ctx.Err() != nil {
		return string(out), code, fmt.Errorf("%s: %w", name, ctx.Err())
	}
	return string(out), code, fmt.Errorf("%s exited %d:\n%s", name, code, d.show(string(out)))
}

func (d *demo) hactl(ctx context.Context, ok []int, args ...string) (string, int, error) {
	return d.exec(ctx, command{path: filepath.Join(d.o.bin, "hactl"), args: args, ok: ok})
}

// cleanup stops every process the demo started and removes the socket
// directory; it returns how many processes were still running.
func (d *demo) cleanup() (int, error) {
	n, err := d.reg.StopAll()
	if d.sockDir != "" {
		err = errors.Join(err, os.RemoveAll(d.sockDir))
	}
	return n, err
}

// run tells the story.
func (d *demo) run(ctx context.Context) error {
	d.tty = term.IsTerminal(int(os.Stdout.Fd()))
	d.say("hagroup demo: one HA group of three HSMs, a signing load through libhapkcs11.so, the primary HSM killed mid-load.")
	d.say("output in %s", relTo(d.cwd, d.o.out))
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"tokens", d.makeTokens},
		{"servers", d.startServers},
		{"configuration", d.configure},
		{"domain key", d.installDomain},
		{"signing key", d.makeKey},
		{"agent", d.startAgent},
	}
	for _, s := range steps {
		if err := s.fn(ctx); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	r, err := d.failover(ctx)
	if err != nil {
		return fmt.Errorf("failover: %w", err)
	}
	if err := d.finish(ctx, r); err != nil {
		return err
	}
	return nil
}

// makeTokens creates the three SoftHSM tokens.
func (d *demo) makeTokens(ctx context.Context) error {
	d.title("1. Three HSMs: SoftHSM tokens")
	var err error
	if d.softConf, err = load.WriteSoftHSMConf(d.o.out); err != nil {
		return err
	}
	if _, _, d.userFile, d.soFile, err = load.NewPINs(d.o.out); err != nil {
		return err
	}
	var labels []string
	for _, m := range plan() {
		labels = append(labels, m.label)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if err := load.InitTokens(ctx, self, d.softConf, d.userFile, d.soFile, labels); err != nil {
		return err
	}
	d.conf = filepath.Join(d.o.out, "hagroup.toml")
	d.env = load.Environ("SOFTHSM2_CONF="+d.softConf, "HAGROUP_CONF="+d.conf)
	d.say("tokens %s initialised in %s/tokens; random PINs in user.pin and so.pin (mode 0600, never on a command line)",
		strings.Join(labels, ", "), relTo(d.cwd, d.o.out))
	_, _, err = d.hactl(ctx, nil, "slot", "list", "--module", load.SoftHSMModule)
	return err
}

// startServers serves each token with its own server process.
func (d *demo) startServers(ctx context.Context) error {
	d.title("2. Each HSM behind its own server process (hsmserve), so that it can really die")
	d.say("hsmserve is hagroup's token server: a member reaches it by the module path hagroup-remote:unix:SOCKET,")
	d.say("which carries every PKCS#11 call, the key wrapping that replicates private keys included.")
	sockDir := d.o.out
	if len(sockDir) > 80 {
		dir, err := os.MkdirTemp("", "hademo-")
		if err != nil {
			return err
		}
		d.sockDir, sockDir = dir, dir
		d.say("(sockets in %s: the output path is too long for Unix sockets)", dir)
	}
	logs := filepath.Join(d.o.out, "logs")
	if err := os.MkdirAll(logs, 0o700); err != nil {
		return err
	}
	for _, m := range plan() {
		s, err := load.NewServer(d.reg, load.ServerSpec{Kind: load.HSMServe, Bin: filepath.Join(d.o.bin, "hsmserve"),
			Member: m.name, Label: m.label, Sock: filepath.Join(sockDir, m.name+".sock"), SoftConf: d.softConf,
			Log: filepath.Join(logs, m.name+"-server.log")})
		if err != nil {
			return err
		}
		if err := s.Start(ctx); err != nil {
			return err
		}
		d.servers = append(d.servers, s)
		d.say("$ %s &    # %s, pid %d", d.show(s.Command()), m.name, s.PID())
	}
	return nil
}

// configure writes the agent settings and builds the group with hactl.
func (d *demo) configure(ctx context.Context) error {
	d.title("3. The HA group, configured with hactl")
	d.sock = filepath.Join(filepath.Dir(d.servers[0].Sock), "haagent.sock")
	logFile := filepath.Join(d.o.out, "ha.log")
	base := fmt.Sprintf(`# Written by hademo: where haagent listens and keeps its state and the HA
# event log, and quick timings for a demo (the defaults suit production).
[agent]
socket = %q
state_dir = %q
log_file = %q

[ha]
probe_interval = "500ms"  # haagent's health probe of idle members
interval = "1s"           # retry a failed member every second
command_timeout = "5s"    # a call that hangs longer fails its member
`, d.sock, filepath.Join(d.o.out, "state"), logFile)
	if err := os.WriteFile(d.conf, []byte(base), 0o600); err != nil {
		return err
	}
	// The module appends to the HA event log only if it exists.
	if err := os.WriteFile(logFile, nil, 0o600); err != nil {
		return err
	}
	d.say("export HAGROUP_CONF=%s    # [agent] and [ha] settings written by hademo:", d.show(d.conf))
	for _, l := range strings.Split(strings.TrimSpace(base), "\n") {
		if !strings.HasPrefix(l, "#") {
			d.say("    %s", d.show(l))
		}
	}
	for i, m := range plan() {
		s := d.servers[i]
		member := []string{"--name", m.name, "--token-label", m.label, "--module", s.Module()}
		for k, v := range s.ModuleEnv() {
			member = append(member, "--module-env", k+"="+v)
		}
		member = append(member, "--pin-file", d.userFile)
		var args []string
		if i == 0 {
			args = append([]string{"hagroup", "creategroup", "--label", groupLabel, "--serial", groupSerial}, member...)
		} else {
			args = append([]string{"hagroup", "addmember", "--group", groupLabel}, member...)
		}
		if _, _, err := d.hactl(ctx, nil, args...); err != nil {
			return err
		}
		if m.standby {
			if _, _, err := d.hactl(ctx, nil, "hagroup", "addstandby", "--group", groupLabel, "--member", m.name); err != nil {
				return err
			}
		}
	}
	return nil
}

// installDomain runs the domain-key ceremony.
func (d *demo) installDomain(ctx context.Context) error {
	d.title("4. The group's domain key: the same AES-256 key on every member, to replicate private keys under")
	_, _, err := d.hactl(ctx, nil, "hagroup", "domain", "--group", groupLabel, "--install", "--so-pin-file", d.soFile)
	return err
}

// makeKey generates the signing key through libhapkcs11.so and shows it on
// every member, through each member's server.
func (d *demo) makeKey(ctx context.Context) error {
	d.title("5. A signing key made through libhapkcs11.so: created on the primary, replicated to every member")
	pin, err := os.ReadFile(d.userFile)
	if err != nil {
		return err
	}
	pinEnv := "HA_PIN=" + strings.TrimSpace(string(pin))
	clear(pin)
	// The PIN reaches pkcs11-tool in its environment (--pin env:HA_PIN),
	// never on its command line; it is not shown.
	keygen := command{
		path: "pkcs11-tool",
		args: []string{"--module", filepath.Join(d.o.bin, "libhapkcs11.so"), "--slot", fmt.Sprint(slotID),
			"--login", "--pin", "env:HA_PIN", "--keypairgen", "--key-type", "EC:prime256v1",
			"--label", keyLabel, "--id", keyID},
	}
	d.env = append(d.env, pinEnv)
	defer func() { d.env = d.env[:len(d.env)-1] }()
	if _, _, err := d.exec(ctx, keygen); err != nil {
		return err
	}
	d.say("")
	d.say("The key on every member, listed through that member's own server:")
	points := map[string]string{}
	listing := func(l string) (string, bool) {
		t := strings.TrimSpace(l)
		switch {
		case strings.Contains(t, "Key Object"):
			return t, true
		case strings.HasPrefix(t, "label:") || strings.HasPrefix(t, "ID:"):
			return "  " + t, true
		case strings.HasPrefix(t, "EC_POINT:"):
			p := strings.TrimSpace(strings.TrimPrefix(t, "EC_POINT:"))
			return "  EC_POINT:   " + p[:min(24, len(p))] + "…", true
		}
		return "", false
	}
	// libhapkcs11.so lists each member's own token too (only = false),
	// reached through the member's module: here, its hsmserve.
	out, _, err := d.exec(ctx, command{path: "pkcs11-tool", args: []string{"--module", filepath.Join(d.o.bin, "libhapkcs11.so"), "-L"},
		filter: func(l string) (string, bool) { return l, strings.HasPrefix(l, "Slot ") }})
	if err != nil {
		return err
	}
	memberSlots := parseMemberSlots(out)
	for _, m := range plan() {
		var point string
		id, ok := memberSlots[m.name]
		if !ok {
			return fmt.Errorf("libhapkcs11.so lists no slot for member %s", m.name)
		}
		c := command{
			path:   "pkcs11-tool",
			args:   []string{"--module", filepath.Join(d.o.bin, "libhapkcs11.so"), "--slot", id, "--login", "--pin", "env:HA_PIN", "--list-objects"},
			filter: listing,
		}
		out, _, err := d.exec(ctx, c)
		if err != nil {
			return err
		}
		for _, l := range strings.Split(out, "\n") {
			if t := strings.TrimSpace(l); strings.HasPrefix(t, "EC_POINT:") {
				point = strings.TrimSpace(strings.TrimPrefix(t, "EC_POINT:"))
			}
		}
		if point == "" {
			return fmt.Errorf("member %s: no EC public key listed", m.name)
		}
		points[m.name] = point
	}
	first := points[plan()[0].name]
	for name, p := range points {
		if p != first {
			return fmt.Errorf("member %s holds a different public key under %q", name, keyLabel)
		}
	}
	d.say("same key pair on all three members")
	return nil
}

// startAgent starts haagent and shows the group.
func (d *demo) startAgent(ctx context.Context) error {
	d.title("6. haagent: health probes, automatic recovery, the HA event log; hactl talks to it")
	logPath := filepath.Join(d.o.out, "logs", "haagent.log")
	f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	p, err := d.reg.Start(load.Spec{Name: "haagent", Path: filepath.Join(d.o.bin, "haagent"),
		Args: []string{"--config", d.conf}, Env: d.env, Dir: d.o.out, Output: f})
	if err != nil {
		return err
	}
	d.agentProc = p
	d.say("$ haagent --config %s &    # pid %d, log in %s", d.show(d.conf), p.PID(), d.show(logPath))
	if err := d.waitAgent(ctx, 30*time.Second, func(agent.GroupsReport) bool { return true }); err != nil {
		return err
	}
	_, _, err = d.hactl(ctx, nil, "hagroup", "listgroups")
	return err
}

// waitAgent polls haagent's listgroups until cond holds, the agent exits,
// ctx ends or d passes.
func (d *demo) waitAgent(ctx context.Context, limit time.Duration, cond func(agent.GroupsReport) bool) error {
	c := agent.NewClient(d.sock)
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var last error
	for {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		rep, err := c.ListGroups(rctx, groupLabel)
		rcancel()
		if err == nil && cond(rep) {
			return nil
		}
		last = err
		select {
		case <-d.agentProc.Done():
			b, _ := os.ReadFile(filepath.Join(d.o.out, "logs", "haagent.log"))
			return fmt.Errorf("haagent exited (%v): %s", d.agentProc.Err(), bytes.TrimSpace(b))
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("haagent: %w (last error: %v)", ctx.Err(), last)
			}
			return fmt.Errorf("haagent did not report the expected state within %v", limit)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// memberState returns a member's state in an agent report.
func memberState(rep agent.GroupsReport, name string) string {
	for _, g := range rep.Groups {
		for _, m := range g.Members {
			if m.Name == name {
				return m.State
			}
		}
	}
	return ""
}

// parseMemberSlots maps member names to slot IDs in `pkcs11-tool -L` output
// of libhapkcs11.so ("Slot 3 (0x40a1b2c3): hagroup member hsm-a of demo").
func parseMemberSlots(out string) map[string]string {
	slots := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		open, close := strings.Index(l, "("), strings.Index(l, ")")
		if !strings.HasPrefix(l, "Slot ") || open < 0 || close < open {
			continue
		}
		rest := strings.TrimSpace(l[close+1:])
		rest = strings.TrimPrefix(rest, ":")
		name, ok := strings.CutPrefix(strings.TrimSpace(rest), "hagroup member ")
		if !ok {
			continue
		}
		name, _, _ = strings.Cut(name, " of ")
		slots[name] = l[open+1 : close]
	}
	return slots
}
