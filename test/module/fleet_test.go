package module

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
)

func goBinary(t testing.TB, name, pkg string) string {
	return buildOnce(t, name, func(out string) error {
		return command(5*time.Minute, repoDir, "go", "build", "-o", out, pkg)
	})
}

// signer is a signing process (signload on libhapkcs11.so, or fleetsign on
// the Go API) whose output lines are read as they come.
type signer struct {
	t        *testing.T
	name     string
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	lines    chan string
	progress int
	rates    []int
	stderr   strings.Builder
	all      []string
}

func startSigner(t *testing.T, r *rig, name string, args ...string) *signer {
	t.Helper()
	s := &signer{t: t, name: name, lines: make(chan string, 4096)}
	s.cmd = exec.CommandContext(t.Context(), args[0], args[1:]...)
	s.cmd.Env, s.cmd.Dir, s.cmd.Stderr = r.env, r.dir, &s.stderr
	var err error
	if s.stdin, err = s.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(s.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			s.lines <- sc.Text()
		}
	}()
	return s
}

// waitFor reads the signer's lines until cond holds or d passes.
func (s *signer) waitFor(what string, d time.Duration, cond func() bool) {
	s.t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for !cond() {
		select {
		case line, ok := <-s.lines:
			if !ok {
				s.t.Fatalf("%s ended while waiting for %s: %s", s.name, what, s.stderr.String())
			}
			s.all = append(s.all, line)
			if n, ok := strings.CutPrefix(line, "progress "); ok {
				s.progress, _ = strconv.Atoi(n)
			}
			if n, ok := strings.CutPrefix(line, "rate "); ok {
				v, _ := strconv.Atoi(n)
				s.rates = append(s.rates, v)
			}
			if strings.HasPrefix(line, "error ") {
				s.t.Errorf("%s: %s", s.name, line)
			}
		case <-deadline.C:
			s.t.Fatalf("%s: no %s within %v (progress %d)", s.name, what, d, s.progress)
		}
	}
}

// finish closes the signer's input and returns its total line.
func (s *signer) finish() string {
	s.t.Helper()
	s.stdin.Close()
	for line := range s.lines {
		s.all = append(s.all, line)
	}
	if err := s.cmd.Wait(); err != nil {
		s.t.Fatalf("%s: %v\n%s", s.name, err, s.stderr.String())
	}
	for _, l := range s.all {
		if strings.HasPrefix(l, "total ") {
			if !strings.Contains(l, "failed=0") {
				for _, e := range s.all {
					if strings.HasPrefix(e, "error ") {
						s.t.Logf("%s: %s", s.name, e) // the first few, so that a failure explains itself
					}
				}
			}
			return l
		}
	}
	s.t.Fatalf("%s printed no total", s.name)
	return ""
}

// lockedBuffer collects a process's stderr while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// hactlOut runs hactl and returns its standard output alone (a degraded
// group's exit 3 and its summary on stderr are expected here).
func hactlOut(t *testing.T, r *rig, hactl string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, hactl, args...)
	cmd.Env, cmd.Dir = r.env, r.dir
	out, err := cmd.Output()
	return string(out), err
}

// agentRun is a haagent on a rig's configuration, on a socket of its own.
type agentRun struct {
	r      *rig
	hactl  string
	cmd    *exec.Cmd
	stderr *lockedBuffer
	done   chan error
}

// startAgent points the rig's configuration at a socket in its directory
// (metrics on a free loopback port, a probe every 500 ms), starts haagent
// and waits until it listens.
func startAgent(ctx context.Context, t *testing.T, r *rig) *agentRun {
	t.Helper()
	a := &agentRun{r: r, hactl: goBinary(t, "hactl", "./cmd/hactl"), stderr: &lockedBuffer{}, done: make(chan error, 1)}
	haagent := goBinary(t, "haagent", "./cmd/haagent")
	sock := filepath.Join(r.dir, "agent.sock")
	cfg, err := os.ReadFile(r.conf)
	if err != nil {
		t.Fatal(err)
	}
	// The rig's config names a socket no agent listens on; this agent
	// listens on sock.
	noAgent := fmt.Sprintf("socket = %q\n", filepath.Join(r.dir, "no-agent.sock"))
	if !strings.Contains(string(cfg), noAgent) {
		t.Fatalf("the rig's config has no %q", noAgent)
	}
	conf := strings.Replace(string(cfg), noAgent, fmt.Sprintf("socket = %q\nmetrics = \"127.0.0.1:0\"\n", sock), 1)
	conf = strings.Replace(conf, "[ha]\n", "[ha]\nprobe_interval = \"500ms\"\n", 1)
	if err := os.WriteFile(r.conf, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	a.cmd = exec.CommandContext(ctx, haagent, "--config", r.conf)
	a.cmd.Env, a.cmd.Dir, a.cmd.Stderr = r.env, r.dir, a.stderr
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { a.done <- a.cmd.Wait() }()
	a.waitUntil(t, "haagent listening", time.Minute, func() (bool, string) {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
		}
		return err == nil, fmt.Sprint(err)
	})
	return a
}

// stop ends the agent (continuing it first, if a test stopped it).
func (a *agentRun) stop() {
	a.cmd.Process.Signal(syscall.SIGCONT)
	a.cmd.Process.Signal(syscall.SIGTERM)
	<-a.done
}

// hactlJSON runs hactl hagroup args with the agent's configuration and
// decodes its JSON into v.
func (a *agentRun) hactlJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out, err := hactlOut(t, a.r, a.hactl, append([]string{"--config", a.r.conf, "hagroup"}, args...)...)
	if jerr := json.Unmarshal([]byte(out), v); jerr != nil {
		t.Fatalf("hactl %s: %v %v\n%s", strings.Join(args, " "), err, jerr, out)
	}
}

// waitUntil polls cond until it holds or d passes; the test fails with
// cond's last word and the agent's log.
func (a *agentRun) waitUntil(t *testing.T, what string, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	end := time.Now().Add(d)
	last := ""
	for time.Now().Before(end) {
		ok, s := cond()
		if ok {
			return
		}
		last = s
		time.Sleep(100 * time.Millisecond) // polling hactl, bounded by the deadline
	}
	t.Fatalf("%s: not within %v; last: %s\nhaagent: %s", what, d, last, a.stderr.String())
}

// The fleet seen from one place: a C application on libhapkcs11.so and a
// Go program on pkg/ha sign through the group while haagent runs. Both
// appear in hactl hagroup clients with their operations; the member
// killed under them shows in listgroups' APP FAILURES and in the HA log
// as one line saying who saw it, not one per process; a pkcs11-tool run
// adds no line; and with the agent hung, then stopped, both keep signing
// and no signature fails.
func TestFleetSeenByTheAgent(t *testing.T) {
	r := newRig(t, rigOpts{remote: true})
	r.keypair("load1", "0c")
	fleetsign := goBinary(t, "fleetsign", "./test/module/fleetsign")

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	a := startAgent(ctx, t, r)
	ag, agErr, agentDone, hactl := a.cmd, a.stderr, a.done, a.hactl
	defer a.stop()
	hactlJSON := func(v any, args ...string) { t.Helper(); a.hactlJSON(t, v, args...) }
	waitUntil := func(what string, d time.Duration, cond func() (bool, string)) {
		t.Helper()
		a.waitUntil(t, what, d, cond)
	}
	var metricsAddr string
	waitUntil("haagent's metrics address in its log", time.Minute, func() (bool, string) {
		m := regexp.MustCompile(`msg="metrics endpoint" addr=(\S+)`).FindStringSubmatch(agErr.String())
		if m != nil {
			metricsAddr = m[1]
		}
		return m != nil, "none"
	})

	// The agent's own opening lines come first: it opens the group after
	// it listens.
	waitUntil("haagent's group_opened in the HA log", time.Minute, func() (bool, string) {
		return strings.Contains(r.haLog(), `"event":"group_opened"`), r.haLog()
	})
	// A pkcs11-tool run while the agent runs adds no line to the HA log
	// (it used to add client-start and per-member lines).
	logBefore := r.haLog()
	r.tool("-L")
	if after := r.haLog(); after != logBefore {
		t.Errorf("a pkcs11-tool -L run wrote to the HA log:\n%s", strings.TrimPrefix(after, logBefore))
	}

	c := startSigner(t, r, "signload", cprog(t, "signload"), r.lib, virtualSlot, r.pinFile, "load1", "2")
	g := startSigner(t, r, "fleetsign", fleetsign, "-config", r.conf, "-group", groupLabel, "-pin-file", r.pinFile, "-key", "load1")
	c.waitFor("signing", time.Minute, func() bool { return c.progress >= 400 })
	g.waitFor("signing", time.Minute, func() bool { return g.progress >= 400 })

	var cl agent.ClientsReport
	waitUntil("both processes in hactl hagroup clients with their operations", time.Minute, func() (bool, string) {
		hactlJSON(&cl, "clients", "--json")
		seen := map[string]bool{}
		for _, p := range cl.Clients {
			var ops uint64
			for _, gr := range p.Groups {
				for _, m := range gr.Members {
					ops += m.Operations
				}
			}
			pid := map[string]int{"signload": c.cmd.Process.Pid, "fleetsign": g.cmd.Process.Pid}[p.Program]
			seen[p.Program] = ops >= 400 && p.PID == pid && p.UID == os.Getuid() && len(p.Groups) == 1 && p.Groups[0].Group == groupLabel
		}
		return seen["signload"] && seen["fleetsign"], fmt.Sprintf("%+v", cl.Clients)
	})
	if cl.SchemaVersion != agent.SchemaVersion {
		t.Errorf("clients --json schemaVersion %d", cl.SchemaVersion)
	}

	r.served.Kill()
	waitUntil("hsm-2 failed in both applications, with an error", time.Minute, func() (bool, string) {
		hactlJSON(&cl, "clients", "--json")
		n := 0
		for _, p := range cl.Clients {
			for _, m := range p.Groups[0].Members {
				if m.Name == "hsm-2" && m.State == "failed" && m.Errors >= 1 {
					n++
				}
			}
		}
		return n == 2, fmt.Sprintf("%+v", cl.Clients)
	})
	var rep agent.GroupsReport
	waitUntil("the applications' failures of hsm-2 in listgroups", time.Minute, func() (bool, string) {
		hactlJSON(&rep, "listgroups", "--json")
		for _, m := range rep.Groups[0].Members {
			if m.Name == "hsm-2" {
				// Each application charged hsm-2 at least one error
				// (the call that found it dead); how many failovers each
				// counts depends on what was in flight.
				return m.ClientFailures >= 2 && m.ClientFailovers >= 1, fmt.Sprintf("%+v", m)
			}
		}
		return false, "no hsm-2"
	})
	// The applications' failures are in the agent's metrics too.
	var hsm2 agent.MemberStatus
	for _, m := range rep.Groups[0].Members {
		if m.Name == "hsm-2" {
			hsm2 = m
		}
	}
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := regexp.MustCompile(`(?m)^hagroup_member_errors_total\{group="signing",member="hsm-2"\} (\S+)$`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("no hagroup_member_errors_total for hsm-2:\n%s", body)
	}
	if v, _ := strconv.ParseFloat(string(m[1]), 64); v < float64(hsm2.ClientFailures+hsm2.Failures) {
		t.Errorf("hagroup_member_errors_total{member=hsm-2} = %v, want at least the agent's %d plus the applications' %d", v, hsm2.Failures, hsm2.ClientFailures)
	}

	var failedLines []agent.Event
	waitUntil("member_failed of hsm-2 in halog", time.Minute, func() (bool, string) {
		out, _ := hactlOut(t, r, hactl, "--config", r.conf, "hagroup", "halog", "--json")
		failedLines = nil
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			var e agent.Event
			if json.Unmarshal([]byte(l), &e) == nil && e.Member == "hsm-2" && e.Event == "member_failed" {
				failedLines = append(failedLines, e)
			}
		}
		return len(failedLines) > 0, out
	})
	// Three engines saw hsm-2 fail (the agent's, signload's, fleetsign's):
	// one line says so at once; the repeats wait for the folded summary.
	if len(failedLines) != 1 || failedLines[0].Repeats != 0 || failedLines[0].Program == "" || failedLines[0].PID == 0 {
		t.Errorf("member_failed lines of hsm-2: %+v, want one first line naming who saw it", failedLines)
	}

	for _, cmd := range [][]string{{"clients"}, {"halog"}} {
		out, _ := hactlOut(t, r, hactl, append([]string{"--config", r.conf, "hagroup"}, cmd...)...)
		t.Logf("hactl hagroup %s:\n%s", cmd[0], out)
	}

	// With the agent hung (stopped by SIGSTOP: its socket takes a
	// connection and never answers), then gone, both keep signing and no
	// signature fails: an application never waits on the agent. How fast
	// they sign is logged, not compared: two windows of seconds on a
	// loaded machine measure the machine (see the pkg/fleet tests for
	// the reporter's bound on a hung agent).
	keepSigning := func(what string) {
		t.Helper()
		at, gat, rates := c.progress, g.progress, len(g.rates)
		c.waitFor("1000 signatures with the agent "+what, time.Minute, func() bool { return c.progress >= at+1000 })
		// Three rate lines too, for the log.
		g.waitFor("1000 signatures with the agent "+what, time.Minute, func() bool {
			return g.progress >= gat+1000 && len(g.rates) >= rates+3
		})
	}
	keepSigning("up")
	n := len(g.rates)
	if err := ag.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	keepSigning("hung")
	hung := len(g.rates)
	ag.Process.Signal(syscall.SIGCONT)
	ag.Process.Signal(syscall.SIGTERM)
	select {
	case <-agentDone:
	case <-time.After(time.Minute):
		t.Fatal("haagent did not stop within a minute")
	}
	agentDone <- nil // for the deferred stop
	keepSigning("stopped")
	t.Logf("fleetsign signatures/s with the agent up %v, hung %v, stopped %v", g.rates[n-3:n], g.rates[n:hung], g.rates[hung:])
	for _, s := range []*signer{c, g} {
		total := s.finish()
		if !strings.Contains(total, "sign_failed=0") {
			t.Errorf("%s: %s, want no failed signature", s.name, total)
		}
	}
}

// TestFleetSeesAForkedChild: a process forked from one that runs the
// engine, served by its helper, is in hactl hagroup clients as an operator
// needs to find it: the row's PID is the helper's (the kernel's word, as
// for every client) and its program names the child and its pid,
// "forkfleet (pid N, through hapkcs11-helper)", with the child's
// signatures counted; its parent is there under its own pid and name.
func TestFleetSeesAForkedChild(t *testing.T) {
	r := newRig(t, rigOpts{remote: true, allRemote: true})
	r.keypair("forkfleet", "0f06")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	a := startAgent(ctx, t, r)
	defer a.stop()

	s := startSigner(t, r, "forkfleet", cprog(t, "forkfleet"), r.lib, virtualSlot, r.pinFile, "forkfleet")
	s.waitFor("the child signing", time.Minute, func() bool { return s.progress >= 200 })
	var parent, child, helper int
	for _, l := range s.all {
		fmt.Sscanf(l, "parent %d", &parent)
		fmt.Sscanf(l, "child %d helper %d", &child, &helper)
	}
	if parent == 0 || child == 0 || helper == 0 {
		t.Fatalf("forkfleet did not name its parent, child and the child's helper: %q", s.all)
	}
	want := fmt.Sprintf("forkfleet (pid %d, through hapkcs11-helper)", child)
	var cl agent.ClientsReport
	a.waitUntil(t, "the child (through its helper) and the parent in hactl hagroup clients", time.Minute, func() (bool, string) {
		a.hactlJSON(t, &cl, "clients", "--json")
		seen := map[string]bool{}
		for _, p := range cl.Clients {
			var ops uint64
			for _, gr := range p.Groups {
				for _, m := range gr.Members {
					ops += m.Operations
				}
			}
			mine := p.UID == os.Getuid() && len(p.Groups) == 1 && p.Groups[0].Group == groupLabel
			switch p.Program {
			case want:
				seen["child"] = mine && p.PID == helper && ops >= 100
			case "forkfleet":
				seen["parent"] = mine && p.PID == parent && ops >= 1
			}
		}
		return seen["child"] && seen["parent"], fmt.Sprintf("%+v", cl.Clients)
	})
	// What the operator reads: the helper's pid and the child's name on
	// one row.
	out, err := hactlOut(t, r, a.hactl, "--config", r.conf, "hagroup", "clients")
	t.Logf("hactl hagroup clients:\n%s", out)
	row := regexp.MustCompile(`(?m)^` + strconv.Itoa(helper) + `\s+` + regexp.QuoteMeta(want) + `\s+.*\s` + groupLabel + `\s`)
	if err != nil || !row.MatchString(out) {
		t.Errorf("hactl hagroup clients (%v) has no row with PID %d and PROGRAM %q in group %s", err, helper, want, groupLabel)
	}
	if total := s.finish(); !strings.Contains(total, "sign_failed=0") {
		t.Errorf("forkfleet: %s", total)
	}
}
