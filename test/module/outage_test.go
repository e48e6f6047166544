package module

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestFullOutage: the group's only member, served by hsmserve, is killed
// under an application's logged-in session and restarted. In activeBasic
// the old session answers CKR_SESSION_HANDLE_INVALID once the member is
// back, the login is gone with it, and a fresh session logs in and signs;
// in activeEnhanced the same session signs again without a new login.
func TestFullOutage(t *testing.T) {
	for _, tc := range []struct {
		mode string
		// after the member is back: the old session's C_Sign and state
		sign, state string
	}{
		{mode: "activeBasic", sign: "sign rv=0xb3", state: "state rv=0xb3 state=0"},
		{mode: "activeEnhanced", sign: "sign rv=0x0", state: "state rv=0x0 state=1"}, // CKS_RO_USER_FUNCTIONS
	} {
		t.Run(tc.mode, func(t *testing.T) {
			r := newRig(t, rigOpts{remote: true, solo: true, mode: tc.mode})
			r.keypair("outage", "0d")
			o := startOutage(t, r, "outage")
			if got := o.ask("state"); got != "state rv=0x0 state=1" {
				t.Fatalf("before the outage: %q, want a logged-in read-only session", got)
			}

			r.served.Kill()
			// The next operations find the member gone: the group is down.
			deadline := time.Now().Add(time.Minute)
			for {
				got := o.ask("sign")
				if got == "sign rv=0x30" { // CKR_DEVICE_ERROR
					break
				}
				if got != "sign rv=0x0" || time.Now().After(deadline) {
					t.Fatalf("with the only member killed: %q, want CKR_DEVICE_ERROR (0x30)\nHA event log:\n%s", got, r.haLog())
				}
			}
			waitLog(t, r, `"event":"group_down"`)

			r.served.Restart(t)
			waitLog(t, r, `"member":"hsm-2","event":"member_recovered"`)
			if got := o.ask("sign"); got != tc.sign {
				t.Errorf("old session after the recovery: %q, want %q", got, tc.sign)
			}
			if got := o.ask("state"); got != tc.state {
				t.Errorf("old session's state after the recovery: %q, want %q", got, tc.state)
			}
			// A new session works in both modes. In activeBasic the login
			// was lost with the sessions, so C_Login must succeed (not
			// CKR_USER_ALREADY_LOGGED_IN); in activeEnhanced it was kept.
			want := "fresh open=0x0 login=0x0 sign=0x0"
			if tc.mode == "activeEnhanced" {
				want = "fresh open=0x0 login=0x100 sign=0x0"
			}
			if got := o.ask("fresh"); got != want {
				t.Errorf("new session after the recovery: %q, want %q\nHA event log:\n%s", got, want, r.haLog())
			}
			o.close()
		})
	}
}

// outageProg drives the outage C program line by line.
type outageProg struct {
	t     *testing.T
	cmd   *exec.Cmd
	in    *bufio.Writer
	close func()
	lines chan string
	err   *strings.Builder
}

func startOutage(t *testing.T, r *rig, label string) *outageProg {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	cmd := exec.CommandContext(ctx, cprog(t, "outage"), r.lib, virtualSlot, r.pinFile, label)
	cmd.Env = r.env
	cmd.Dir = r.dir
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	o := &outageProg{t: t, cmd: cmd, in: bufio.NewWriter(stdin), lines: make(chan string, 16), err: &strings.Builder{}}
	cmd.Stderr = o.err
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(o.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			o.lines <- sc.Text()
		}
	}()
	done := false
	o.close = func() {
		if done {
			return
		}
		done = true
		stdin.Close()
		for range o.lines {
		}
		if err := cmd.Wait(); err != nil {
			t.Errorf("outage: %v\nstderr: %s", err, o.err.String())
		}
		cancel()
	}
	t.Cleanup(o.close)
	if got := o.read("ready"); got != "ready" {
		t.Fatalf("outage did not start: %q\nstderr: %s", got, o.err.String())
	}
	return o
}

// read returns the next line, failing the test after a deadline.
func (o *outageProg) read(what string) string {
	o.t.Helper()
	select {
	case line, ok := <-o.lines:
		if !ok {
			o.t.Fatalf("outage ended waiting for %s; stderr: %s", what, o.err.String())
		}
		return line
	case <-time.After(time.Minute):
		o.t.Fatalf("no answer to %s within a minute", what)
	}
	return ""
}

// ask sends one command and returns its answer.
func (o *outageProg) ask(cmd string) string {
	o.t.Helper()
	fmt.Fprintln(o.in, cmd)
	if err := o.in.Flush(); err != nil {
		o.t.Fatalf("outage: %v", err)
	}
	return o.read(cmd)
}

// waitLog waits until the HA event log holds sub.
func waitLog(t *testing.T, r *rig, sub string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(r.haLog(), sub) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s in the HA event log within a minute:\n%s", sub, r.haLog())
		}
		time.Sleep(50 * time.Millisecond) // polling a file the module appends to, under a deadline
	}
}
