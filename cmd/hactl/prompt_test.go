package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal pair: the master for the test, the
// slave for hactl's stdin, stdout and stderr.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	fd := int(m.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock pty: %v", err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pty number: %v", err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open pty slave: %v", err)
	}
	t.Cleanup(func() { m.Close(); s.Close() })
	return m, s
}

// runOnTerminal starts the real hactl on a terminal of its own, waits
// until it asks its question, types answer and returns its exit code and
// everything it wrote.
func runOnTerminal(t *testing.T, answer string, args ...string) (int, string) {
	t.Helper()
	master, slave := openPTY(t)
	ctx, cancel := context.WithTimeout(t.Context(), waitDeadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(buildBinaries(t), "hactl"), args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	var out bytes.Buffer
	buf := make([]byte, 4096)
	typed, asked := false, 0
	for {
		master.SetReadDeadline(time.Now().Add(waitDeadline))
		n, err := master.Read(buf)
		out.Write(buf[:n])
		// survey asks for the terminal's size, then for the cursor's
		// position (ESC[6n, after showing the cursor again: ESC[?25h),
		// with the terminal in raw mode, so a ^C is a byte it reads, not
		// a SIGINT. The answer goes just before the terminal's report of
		// the position: survey keeps what was typed before the report
		// and drops what follows it in the same read.
		for ; asked < strings.Count(out.String(), "\x1b[6n"); asked++ {
			report := "\x1b[1;1R"
			if !typed && strings.Contains(out.String(), "\x1b[?25h\x1b[6n") {
				report, typed = answer+report, true
			}
			if _, err := master.WriteString(report); err != nil {
				t.Fatal(err)
			}
		}
		if err != nil {
			break // EIO once hactl has exited and closed the terminal
		}
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("hactl: %v\n%s", err, out.String())
	}
	if !typed {
		t.Fatalf("hactl never asked its question:\n%s", out.String())
	}
	return cmd.ProcessState.ExitCode(), out.String()
}

// TestPromptAnswers: Ctrl-C at a confirmation exits 130, a no exits 7,
// and neither changes the file.
func TestPromptAnswers(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "hagroup.toml")
	pin := filepath.Join(dir, "pin")
	os.WriteFile(pin, []byte("1234\n"), 0o600)
	orig := fmt.Sprintf(`[[group]]
label = "signing"
serial = "1000001"

[[group.member]]
name = "hsm-a"
module = %q
token_label = "ha-a"
pin_file = %q
`, softhsmModule, pin)
	for _, tc := range []struct {
		name, answer string
		want         int
		says         string
	}{
		{"ctrl-c", "\x03", ExitInterrupted, "hactl: interrupted"},
		{"no", "n\r", ExitDeclined, "hactl: not confirmed; nothing changed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(conf, []byte(orig), 0o600); err != nil {
				t.Fatal(err)
			}
			code, out := runOnTerminal(t, tc.answer, "--config", conf, "--socket", filepath.Join(dir, "none.sock"),
				"hagroup", "deletegroup", "--label", "signing")
			if code != tc.want {
				t.Errorf("exit code %d, want %d; output:\n%s", code, tc.want, out)
			}
			if !strings.Contains(out, tc.says) {
				t.Errorf("output does not say %q:\n%s", tc.says, out)
			}
			if got, _ := os.ReadFile(conf); string(got) != orig {
				t.Errorf("the config changed:\n%s", got)
			}
		})
	}
}
