package install

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// agentDeadline bounds the packaged agent's start.
const agentDeadline = 30 * time.Second

// checkOperatorSession runs what a new operator does after dpkg -i: three
// SoftHSM tokens, a group made with the installed hactl only (as root), the
// installed haagent run as the unit runs it (user hagroup, the unit's
// directories and modes), then listgroups and the cron sync check. It
// returns the PIN files it left in /etc/hagroup, as an operator would.
func checkOperatorSession(t *testing.T) (pins []string) {
	const softhsm = "/usr/lib/softhsm/libsofthsm2.so"
	if _, err := os.Stat(softhsm); err != nil {
		t.Log("SoftHSM not installed (scripts/deps.sh installs it): no operator session")
		return nil
	}
	// Tokens the agent's user may use, as /var/lib/softhsm would be.
	tokens := t.TempDir()
	os.Chmod(filepath.Dir(tokens), 0o755)
	conf := filepath.Join(tokens, "softhsm2.conf")
	write(t, conf, fmt.Sprintf("directories.tokendir = %s\nobjectstore.backend = file\n", tokens), 0o644)
	t.Setenv("SOFTHSM2_CONF", conf)
	for _, m := range []string{"a", "b", "c"} {
		sh(t, "softhsm2-util", "--init-token", "--free", "--label", "ha-"+m, "--so-pin", "87654321", "--pin", "1234")
		pin := "/etc/hagroup/pin-" + m
		write(t, pin, "1234\n", 0o640)
		sh(t, "chgrp", "hagroup", pin)
		pins = append(pins, "/"+filepath.Base(pin))
	}
	sh(t, "chown", "-R", "hagroup:hagroup", tokens)

	sh(t, "hactl", "hagroup", "creategroup", "--label", "signing", "--name", "hsm-a", "--token-label", "ha-a", "--module", softhsm, "--pin-file", "/etc/hagroup/pin-a")
	for _, m := range []string{"b", "c"} {
		sh(t, "hactl", "hagroup", "addmember", "--group", "signing", "--name", "hsm-"+m, "--token-label", "ha-"+m, "--module", softhsm, "--pin-file", "/etc/hagroup/pin-"+m)
	}

	// The unit's RuntimeDirectory, StateDirectory and LogsDirectory.
	for _, d := range []struct {
		path string
		mode string
	}{{"/run/hagroup", "0755"}, {"/var/lib/hagroup", "2770"}, {"/var/log/hagroup", "2770"}} {
		sh(t, "install", "-d", "-o", "hagroup", "-g", "hagroup", "-m", d.mode, d.path)
	}
	var log lockedBuffer
	agent := exec.Command("setpriv", "--reuid=hagroup", "--regid=hagroup", "--init-groups", "--",
		"/usr/bin/haagent", "--config", "/etc/hagroup/hagroup.toml", "--log-level", "info")
	agent.Env = append(os.Environ(), "SOFTHSM2_CONF="+conf)
	agent.Stdout, agent.Stderr = &log, &log
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = agent.Wait(); close(exited) }()
	defer func() {
		agent.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(agentDeadline):
			agent.Process.Kill()
			<-exited
			t.Errorf("haagent did not stop within %v of SIGINT\n%s", agentDeadline, log.String())
		}
	}()
	waitSocket(t, "/run/hagroup/haagent.sock", exited, &log)

	out := sh(t, "hactl", "hagroup", "listgroups")
	for _, m := range []string{"hsm-a", "hsm-b", "hsm-c"} {
		if !strings.Contains(out, "\n"+m+"   active ") && !strings.Contains(out, "\n"+m+"  active ") {
			t.Errorf("listgroups does not show %s active:\n%s", m, out)
		}
	}
	if !strings.HasPrefix(out, "Source: haagent at /run/hagroup/haagent.sock") {
		t.Errorf("listgroups did not come from the packaged agent:\n%s", out)
	}
	// What cron runs: exit 0, in sync.
	if out := sh(t, "hactl", "hagroup", "synchronize", "--group", "signing", "--check"); !strings.Contains(out, `group "signing" is in sync`) {
		t.Errorf("synchronize --check:\n%s", out)
	}
	agent.Process.Signal(os.Interrupt)
	select {
	case <-exited:
		if waitErr != nil {
			t.Errorf("haagent on SIGINT: %v, want exit 0\n%s", waitErr, log.String())
		}
	case <-time.After(agentDeadline):
		t.Errorf("haagent did not stop within %v of SIGINT", agentDeadline)
	}
	return pins
}

// waitSocket waits until the agent's socket accepts, failing at once with
// the agent's log when it exits first.
func waitSocket(t *testing.T, path string, exited <-chan struct{}, log *lockedBuffer) {
	deadline := time.Now().Add(agentDeadline)
	for {
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-exited:
			t.Fatalf("the packaged haagent exited before serving %s:\n%s", path, log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer within %v: %v\n%s", path, agentDeadline, err, log.String())
		}
		time.Sleep(20 * time.Millisecond) // poll interval of a wait with a deadline
	}
}

// lockedBuffer collects a process's output while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
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

func write(t *testing.T, path, data string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}
