package testhsm

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/remote"
	"golang.org/x/sys/unix"
)

// readyDeadline bounds how long Serve and Restart wait for the server's
// socket to answer.
const readyDeadline = 15 * time.Second

// exitDeadline bounds how long Kill waits for the server to be reaped.
const exitDeadline = 10 * time.Second

// Served is a token served by a real server process on a Unix socket:
// `p11-kit server` (Serve) or hagroup's own hsmserve (ServeRemote). The
// server runs in its own process group, so Kill and Stop reach every child
// it forks. Methods are safe for concurrent use.
type Served struct {
	t      testing.TB
	remote bool // hsmserve rather than p11-kit server
	name   string
	label  string
	serial string
	conf   string
	sock   string
	bin    string // hsmserve (remote)
	// module and initArgs are what hsmserve serves (remote): SoftHSM,
	// or NSS softokn on its own database (ServeNSS).
	module   string
	initArgs string
	// command, when set, runs the server instead (ServeOCK: hsmserve
	// inside a mount namespace of its own, after pkcsslotd).
	command func() *exec.Cmd

	mu   sync.Mutex
	proc *serverProc // nil when no server runs
}

// serverProc is one run of the server.
type serverProc struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{} // closed once the process has been reaped
	err  error         // Wait's result, valid after done
}

// Serve makes a fresh token labelled name in its own SoftHSM token
// directory and serves it with `p11-kit server`. The server is killed and
// its directory removed when the test ends.
func Serve(t testing.TB, name string) *Served {
	t.Helper()
	return serve(t, name, false)
}

// ServeRemote makes a fresh token labelled name in its own SoftHSM token
// directory and serves it with hagroup's hsmserve (cmd/hsmserve, built once
// per test binary). Its Token has Module = remote.ModulePath(socket) and no
// ModuleEnv: every slot.Open of it gets a connection of its own, and
// Reinit connects again. The server is killed and its directory removed
// when the test ends.
func ServeRemote(t testing.TB, name string) *Served {
	t.Helper()
	return serve(t, name, true)
}

func serve(t testing.TB, name string, remote bool) *Served {
	t.Helper()
	fn := "testhsm.Serve"
	if remote {
		fn = "testhsm.ServeRemote"
	}
	if name == "" || len(name) > 32 {
		t.Fatalf("%s: name %q must be 1 to 32 bytes (it is the token label)", fn, name)
	}
	var bin string
	if remote {
		var err error
		if bin, err = hsmserveBinary(); err != nil {
			t.Fatalf("%s(%s): %v", fn, name, err)
		}
	}
	// A short directory: the socket path must fit in sun_path (108 bytes).
	dir, err := os.MkdirTemp("", "hsrv-")
	if err != nil {
		t.Fatalf("%s(%s): %v", fn, name, err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	conf, err := writeConf(dir)
	if err != nil {
		t.Fatalf("%s(%s): %v", fn, name, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), initDeadline(1))
	serials, err := initTokens(ctx, conf, []string{name})
	cancel()
	if err != nil {
		t.Fatalf("%s(%s): %v", fn, name, err)
	}
	return start(t, fn, &Served{
		t:      t,
		remote: remote,
		bin:    bin,
		name:   name,
		label:  name,
		serial: serials[name],
		conf:   conf,
		sock:   filepath.Join(dir, "p11.sock"),
		module: SoftHSMModule,
	})
}

// ServeTaken serves tok, a token of this test process's pool (Take), with
// hsmserve, so that the test process and the server's processes use one
// token store, as an application and an agent of one host do. The server
// is killed when the test ends; the token stays the pool's.
func ServeTaken(t testing.TB, tok Token) *Served {
	t.Helper()
	bin, err := hsmserveBinary()
	if err != nil {
		t.Fatalf("testhsm.ServeTaken(%s): %v", tok.Name, err)
	}
	dir, err := os.MkdirTemp("", "hsrv-")
	if err != nil {
		t.Fatalf("testhsm.ServeTaken(%s): %v", tok.Name, err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return start(t, "testhsm.ServeTaken", &Served{
		t:      t,
		remote: true,
		bin:    bin,
		name:   tok.Name,
		label:  tok.Label,
		serial: tok.Serial,
		conf:   os.Getenv("SOFTHSM2_CONF"),
		sock:   filepath.Join(dir, "p11.sock"),
		module: SoftHSMModule,
	})
}

// start starts s's server (fn names the caller in failures) and stops it
// when the test ends.
func start(t testing.TB, fn string, s *Served) *Served {
	t.Helper()
	name := s.name
	if len(s.sock) >= 100 {
		t.Fatalf("%s(%s): socket path %s too long for a Unix socket; set a shorter TMPDIR", fn, name, s.sock)
	}
	t.Cleanup(s.shutdown)
	if err := s.start(); err != nil {
		t.Fatalf("%s(%s): %v", fn, name, err)
	}
	return s
}

// Address returns the P11_KIT_SERVER_ADDRESS of a p11-kit server.
func (s *Served) Address() string { return "unix:path=" + s.sock }

// Socket returns the path of the server's Unix socket.
func (s *Served) Socket() string { return s.sock }

// Token describes the served token as seen through p11-kit-client.so
// (Serve) or the hagroup remote client (ServeRemote).
func (s *Served) Token() Token {
	if s.remote {
		so := SOPIN
		if s.module == NSSModule {
			so = "" // an NSS database has no SO PIN
		}
		return Token{
			Name:    s.name,
			Label:   s.label,
			Serial:  s.serial,
			Module:  remote.ModulePath(s.sock),
			UserPIN: UserPIN,
			SOPIN:   so,
		}
	}
	return Token{
		Name:      s.name,
		Label:     s.label,
		Serial:    s.serial,
		Module:    P11KitClient,
		ModuleEnv: map[string]string{"P11_KIT_SERVER_ADDRESS": s.Address()},
		UserPIN:   UserPIN,
		SOPIN:     SOPIN,
	}
}

// Kill sends SIGKILL to the server's whole process group and waits until
// the server has exited.
func (s *Served) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.killLocked(); err != nil {
		s.t.Errorf("testhsm: kill server %s: %v", s.name, err)
	}
}

// Stop sends SIGSTOP to the server's process group and waits (with a
// deadline) until every thread of the group has stopped, the children
// serving connections too: calls to the token then hang until Cont.
func (s *Served) Stop() { s.signal(syscall.SIGSTOP, unix.WSTOPPED) }

// Cont sends SIGCONT to the server's process group and waits (with a
// deadline) until the server runs again.
func (s *Served) Cont() { s.signal(syscall.SIGCONT, unix.WCONTINUED) }

// PID returns the process ID of the running server (also its process
// group ID), 0 when none runs.
func (s *Served) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.cmd.Process.Pid
}

// Restart kills a running server and starts a new one on the same token
// directory and socket, waiting (with a deadline) until the socket answers.
func (s *Served) Restart(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	err := s.killLocked()
	s.mu.Unlock()
	if err != nil {
		t.Fatalf("testhsm: restart server %s: %v", s.name, err)
	}
	if err := s.start(); err != nil {
		t.Fatalf("testhsm: restart server %s: %v", s.name, err)
	}
}

// signal sends sig to the server's process group and waits until the
// server reports the state change in (WSTOPPED or WCONTINUED).
func (s *Served) signal(sig syscall.Signal, state int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		s.t.Errorf("testhsm: %v to server %s: not running", sig, s.name)
		return
	}
	pid := s.proc.cmd.Process.Pid
	if err := syscall.Kill(-pid, sig); err != nil {
		s.t.Errorf("testhsm: %v to server %s: %v", sig, s.name, err)
		return
	}
	// WNOWAIT leaves the report for others (os/exec's Wait among them).
	done := make(chan error, 1)
	go func() {
		var info unix.Siginfo
		done <- unix.Waitid(unix.P_PID, pid, &info, state|unix.WNOWAIT, nil)
	}()
	select {
	case err := <-done:
		if err != nil {
			s.t.Errorf("testhsm: wait for server %s after %v: %v", s.name, sig, err)
		}
	case <-time.After(exitDeadline):
		s.t.Errorf("testhsm: server %s did not change state within %v of %v", s.name, exitDeadline, sig)
	}
	if sig == syscall.SIGSTOP {
		if err := waitGroupStopped(pid, exitDeadline); err != nil {
			s.t.Errorf("testhsm: server %s after %v: %v", s.name, sig, err)
		}
	}
}

// start runs a new server and waits until its socket accepts connections.
func (s *Served) start() error {
	// A SIGKILLed server leaves its socket behind.
	if err := os.Remove(s.sock); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	what := "p11-kit server"
	cmd := exec.Command("p11-kit", "server", "-f", "-n", s.sock,
		"--provider", SoftHSMModule, "pkcs11:token="+s.label)
	if s.remote {
		what = "hsmserve"
		cmd = exec.Command(s.bin, "--module", s.module, "--socket", s.sock, "--token-label", s.label, "--init-args", s.initArgs)
	}
	if s.command != nil {
		cmd = s.command()
	}
	cmd.Env = withEnv(os.Environ(), "SOFTHSM2_CONF", s.conf)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out := &syncBuffer{}
	cmd.Stdout = out
	cmd.Stderr = out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", what, err)
	}
	p := &serverProc{cmd: cmd, out: out, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	return s.waitReady(p, what)
}

// waitReady polls the socket until a connection succeeds, the server exits
// or the deadline passes.
func (s *Served) waitReady(p *serverProc, what string) error {
	deadline := time.Now().Add(readyDeadline)
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before it answered (%v): %s", what, p.err, bytes.TrimSpace(p.out.Bytes()))
		case <-retry.C:
		}
		c, err := net.DialTimeout("unix", s.sock, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s socket %s did not answer within %v: %v", what, s.sock, readyDeadline, err)
		}
		retry.Reset(10 * time.Millisecond)
	}
}

// killLocked kills the process group of the running server, if any, and
// waits until the server is reaped.
func (s *Served) killLocked() error {
	p := s.proc
	if p == nil {
		return nil
	}
	s.proc = nil
	pid := p.cmd.Process.Pid
	// SIGCONT first so a stopped group dies promptly and releases its clients.
	_ = syscall.Kill(-pid, syscall.SIGCONT)
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
		return err
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(exitDeadline):
		return fmt.Errorf("server pid %d not reaped within %v", pid, exitDeadline)
	}
}

func (s *Served) shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.killLocked(); err != nil {
		s.t.Errorf("testhsm: clean up server %s: %v", s.name, err)
	}
}

// syncBuffer is a bytes.Buffer safe for the concurrent writes of a child's
// stdout and stderr.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.b.Bytes()...)
}
