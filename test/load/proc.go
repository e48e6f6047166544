// Package load holds what the demo (cmd/hademo) and the chaos soak
// (test/soak) share to put libhapkcs11.so under real load and real faults:
// child processes in their own process groups that are always cleaned up,
// member tokens served by their own server process (killed, stopped and
// restarted for real), the C load generator c/haload.c (built with gcc at run
// time; a Go program cannot load libhapkcs11.so, which holds a Go runtime of
// its own), the per-member counters the module writes when
// HAGROUP_STATS_FILE is set, and an independent check of every signature.
package load

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// exitDeadline bounds how long a kill waits for the process to be reaped.
const exitDeadline = 10 * time.Second

// Registry tracks every child process a run starts, so that one call
// (deferred, and on a signal) stops them all. Safe for concurrent use.
type Registry struct {
	mu    sync.Mutex
	procs map[*Proc]struct{}
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{procs: map[*Proc]struct{}{}} }

// Proc is one child process, leader of its own process group: signals go
// to the whole group (p11-kit server forks a child per connection).
type Proc struct {
	Name string
	cmd  *exec.Cmd
	reg  *Registry
	out  *SyncBuffer
	done chan struct{} // closed once reaped
	err  error         // Wait's result, valid after done
}

// Spec describes a process to start.
type Spec struct {
	Name  string    // for messages
	Path  string    // executable
	Args  []string  // arguments after the executable
	Env   []string  // full environment (nil: inherit)
	Dir   string    // working directory
	Stdin io.Reader // nil: /dev/null
	// Output receives stdout and stderr; nil keeps them in a buffer that
	// Output returns.
	Output io.Writer
}

// Start starts s in its own process group and registers it. The child is
// also killed if this process dies without cleaning up (PR_SET_PDEATHSIG).
func (r *Registry) Start(s Spec) (*Proc, error) {
	cmd := exec.Command(s.Path, s.Args...)
	cmd.Env = s.Env
	cmd.Dir = s.Dir
	cmd.Stdin = s.Stdin
	p := &Proc{Name: s.Name, cmd: cmd, reg: r, done: make(chan struct{})}
	if s.Output != nil {
		cmd.Stdout, cmd.Stderr = s.Output, s.Output
	} else {
		p.out = &SyncBuffer{}
		cmd.Stdout, cmd.Stderr = p.out, p.out
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", s.Name, err)
	}
	r.mu.Lock()
	r.procs[p] = struct{}{}
	r.mu.Unlock()
	go func() {
		p.err = cmd.Wait()
		close(p.done)
		r.mu.Lock()
		delete(r.procs, p)
		r.mu.Unlock()
	}()
	return p, nil
}

// StopAll kills every registered process group (SIGCONT first, so stopped
// ones die too) and waits until each is reaped. It returns how many it
// killed and the first error.
func (r *Registry) StopAll() (int, error) {
	r.mu.Lock()
	var ps []*Proc
	for p := range r.procs {
		ps = append(ps, p)
	}
	r.mu.Unlock()
	var errs []error
	for _, p := range ps {
		errs = append(errs, p.Kill())
	}
	return len(ps), errors.Join(errs...)
}

// PID returns the process ID (also its process group ID).
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited and been reaped.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is the process's exit error; valid once Done is closed.
func (p *Proc) Err() error { return p.err }

// Output returns what the process wrote, when no Output writer was given.
func (p *Proc) Output() string {
	if p.out == nil {
		return ""
	}
	return string(bytes.TrimSpace(p.out.Bytes()))
}

// Kill sends SIGKILL to the process group and waits (with a deadline)
// until the process is reaped. Killing an exited process is not an error.
func (p *Proc) Kill() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	pid := p.PID()
	_ = syscall.Kill(-pid, syscall.SIGCONT)
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
		return fmt.Errorf("kill %s (pid %d): %w", p.Name, pid, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(exitDeadline):
		return fmt.Errorf("%s (pid %d) not reaped within %v of SIGKILL", p.Name, pid, exitDeadline)
	}
}

// Signal sends sig to the process (not its group).
func (p *Proc) Signal(sig syscall.Signal) error {
	if err := syscall.Kill(p.PID(), sig); err != nil {
		return fmt.Errorf("%v to %s (pid %d): %w", sig, p.Name, p.PID(), err)
	}
	return nil
}

// Stop sends SIGSTOP to the process group and waits (with a deadline)
// until the leader has stopped.
func (p *Proc) Stop() error { return p.groupSignal(syscall.SIGSTOP, unix.WSTOPPED) }

// Cont sends SIGCONT to the process group and waits (with a deadline)
// until the leader runs again.
func (p *Proc) Cont() error { return p.groupSignal(syscall.SIGCONT, unix.WCONTINUED) }

func (p *Proc) groupSignal(sig syscall.Signal, state int) error {
	pid := p.PID()
	if err := syscall.Kill(-pid, sig); err != nil {
		return fmt.Errorf("%v to %s (pid %d): %w", sig, p.Name, pid, err)
	}
	// WNOWAIT leaves the report for os/exec's Wait.
	res := make(chan error, 1)
	go func() {
		var info unix.Siginfo
		res <- unix.Waitid(unix.P_PID, pid, &info, state|unix.WNOWAIT, nil)
	}()
	select {
	case err := <-res:
		if err != nil {
			return fmt.Errorf("wait for %s after %v: %w", p.Name, sig, err)
		}
		return nil
	case <-p.done:
		return fmt.Errorf("%s exited while waiting for %v to take effect", p.Name, sig)
	case <-time.After(exitDeadline):
		return fmt.Errorf("%s did not change state within %v of %v; its threads: %s", p.Name, exitDeadline, sig, threadStates(pid))
	}
}

// threadStates describes each thread of pid as the kernel sees it: its
// state letter and the kernel function it waits in, so that a stop that
// never completes names the thread that held it up.
func threadStates(pid int) string {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tids, err := os.ReadDir(dir)
	if err != nil {
		return err.Error()
	}
	var b bytes.Buffer
	for _, t := range tids {
		stat, _ := os.ReadFile(dir + "/" + t.Name() + "/stat")
		wchan, _ := os.ReadFile(dir + "/" + t.Name() + "/wchan")
		state := "?"
		if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
			state = string(stat[i+2])
		}
		fmt.Fprintf(&b, "%s:%s:%s ", t.Name(), state, wchan)
	}
	return string(bytes.TrimSpace(b.Bytes()))
}

// Wait waits for the process to exit, or ctx.
func (p *Proc) Wait(ctx context.Context) error {
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return fmt.Errorf("waiting for %s: %w", p.Name, ctx.Err())
	}
}

// SyncBuffer is a bytes.Buffer safe for concurrent writes.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// Bytes returns a copy of what was written.
func (b *SyncBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.b.Bytes()...)
}

// WithEnv returns env with key set to value, replacing an earlier value.
func WithEnv(env []string, key, value string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if len(kv) > len(key) && kv[:len(key)+1] == key+"=" {
			continue
		}
		out = append(out, kv)
	}
	return append(out, key+"="+value)
}

// Environ is os.Environ with the given KEY=VALUE pairs set.
func Environ(kv ...string) []string {
	env := os.Environ()
	for _, p := range kv {
		k, v, _ := bytes.Cut([]byte(p), []byte("="))
		env = WithEnv(env, string(k), string(v))
	}
	return env
}
