package load

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hagroup/hagroup/pkg/remote"
)

// Paths of the modules the member servers use.
const (
	SoftHSMModule = "/usr/lib/softhsm/libsofthsm2.so"
	P11KitClient  = "/usr/lib/x86_64-linux-gnu/pkcs11/p11-kit-client.so"
)

// readyDeadline bounds how long a server start waits for its socket.
const readyDeadline = 15 * time.Second

// Kind is the server program that serves a member token.
type Kind string

const (
	// P11Kit is `p11-kit server`: members reach it through
	// p11-kit-client.so. Its RPC (0.24) carries neither
	// CKM_AES_KEY_WRAP_PAD nor attribute arrays, so such a member can sign,
	// verify and encrypt but cannot receive replicated private or secret
	// keys.
	P11Kit Kind = "p11-kit"
	// HSMServe is hagroup's own cmd/hsmserve: members reach it by the
	// module path hagroup-remote:unix:SOCKET (pkg/remote), which carries
	// every call.
	HSMServe Kind = "hsmserve"
)

// ServerSpec describes a member's server.
type ServerSpec struct {
	Kind     Kind
	Bin      string // the hsmserve executable (Kind HSMServe)
	Member   string // member name
	Label    string // token label
	Sock     string // socket path
	SoftConf string // SOFTHSM2_CONF of the token directory
	Log      string // where the server's output goes
}

// Server is one member token served by its own server process on a Unix
// socket: killing it (SIGKILL to its process group) is a real HSM outage,
// stopping it (SIGSTOP) a hung one. Methods are safe for concurrent use.
type Server struct {
	Member string // member name
	Label  string // token label
	Sock   string // socket path
	spec   ServerSpec
	reg    *Registry

	mu      sync.Mutex
	proc    *Proc
	stopped bool
}

// NewServer describes a server; Start runs it.
func NewServer(reg *Registry, spec ServerSpec) (*Server, error) {
	if len(spec.Sock) >= 100 {
		return nil, fmt.Errorf("member %s: socket path %s is too long for a Unix socket (108 bytes)", spec.Member, spec.Sock)
	}
	switch spec.Kind {
	case P11Kit:
	case HSMServe:
		if spec.Bin == "" {
			return nil, fmt.Errorf("member %s: no hsmserve executable given", spec.Member)
		}
	default:
		return nil, fmt.Errorf("member %s: unknown server kind %q", spec.Member, spec.Kind)
	}
	return &Server{Member: spec.Member, Label: spec.Label, Sock: spec.Sock, spec: spec, reg: reg}, nil
}

// Module is the member's module in the configuration.
func (s *Server) Module() string {
	if s.spec.Kind == HSMServe {
		return remote.ModulePath(s.Sock)
	}
	return P11KitClient
}

// ModuleEnv is the member's module_env in the configuration (nil for
// hsmserve).
func (s *Server) ModuleEnv() map[string]string {
	if s.spec.Kind == HSMServe {
		return nil
	}
	return map[string]string{"P11_KIT_SERVER_ADDRESS": s.Address()}
}

// Command is the server's command line, for display.
func (s *Server) Command() string {
	if s.spec.Kind == HSMServe {
		return fmt.Sprintf("hsmserve --module %s --socket %s --token-label %s", SoftHSMModule, s.Sock, s.Label)
	}
	return fmt.Sprintf("p11-kit server -n %s --provider %s pkcs11:token=%s", s.Sock, SoftHSMModule, s.Label)
}

// Address is the member's P11_KIT_SERVER_ADDRESS.
func (s *Server) Address() string { return "unix:path=" + s.Sock }

// PID returns the running server's process ID, 0 when none runs.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.PID()
}

// Start runs the server and waits (with a deadline, or ctx) until its
// socket accepts connections.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		return fmt.Errorf("member %s: server already running (pid %d)", s.Member, s.proc.PID())
	}
	// A SIGKILLed server leaves its socket behind.
	if err := os.Remove(s.Sock); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("member %s: remove stale socket: %w", s.Member, err)
	}
	log, err := os.OpenFile(s.spec.Log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("member %s: server log: %w", s.Member, err)
	}
	ps := Spec{
		Name:   string(s.spec.Kind) + " for " + s.Member,
		Path:   "p11-kit",
		Args:   []string{"server", "-f", "-n", s.Sock, "--provider", SoftHSMModule, "pkcs11:token=" + s.Label},
		Env:    Environ("SOFTHSM2_CONF=" + s.spec.SoftConf),
		Dir:    filepath.Dir(s.Sock),
		Output: log,
	}
	if s.spec.Kind == HSMServe {
		ps.Path = s.spec.Bin
		ps.Args = []string{"--module", SoftHSMModule, "--socket", s.Sock, "--token-label", s.Label}
	}
	p, err := s.reg.Start(ps)
	log.Close() // the child has its own descriptor
	if err != nil {
		return fmt.Errorf("member %s: %w", s.Member, err)
	}
	if err := waitSocket(ctx, s.Sock, p); err != nil {
		_ = p.Kill()
		b, _ := os.ReadFile(s.spec.Log)
		return fmt.Errorf("member %s: %w (server log: %s)", s.Member, err, lastLines(string(b), 5))
	}
	s.proc, s.stopped = p, false
	return nil
}

// Kill kills the server's process group and waits until it is reaped.
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return nil
	}
	err := s.proc.Kill()
	s.proc, s.stopped = nil, false
	if err != nil {
		return fmt.Errorf("member %s: %w", s.Member, err)
	}
	return nil
}

// Stop freezes the server (SIGSTOP to its group): calls to it hang.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return fmt.Errorf("member %s: no server to stop", s.Member)
	}
	if err := s.proc.Stop(); err != nil {
		return fmt.Errorf("member %s: %w", s.Member, err)
	}
	s.stopped = true
	return nil
}

// Cont resumes a stopped server.
func (s *Server) Cont() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return fmt.Errorf("member %s: no server to continue", s.Member)
	}
	if err := s.proc.Cont(); err != nil {
		return fmt.Errorf("member %s: %w", s.Member, err)
	}
	s.stopped = false
	return nil
}

// waitSocket polls a Unix socket until it accepts a connection, p exits,
// ctx ends or readyDeadline passes.
func waitSocket(ctx context.Context, sock string, p *Proc) error {
	ctx, cancel := context.WithTimeout(ctx, readyDeadline)
	defer cancel()
	retry := time.NewTimer(0)
	defer retry.Stop()
	var dialErr error
	for {
		select {
		case <-p.Done():
			return fmt.Errorf("server exited before its socket answered: %v", p.Err())
		case <-ctx.Done():
			return fmt.Errorf("socket %s did not answer: %w (last dial: %v)", sock, ctx.Err(), dialErr)
		case <-retry.C:
		}
		c, err := net.DialTimeout("unix", sock, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		dialErr = err
		retry.Reset(10 * time.Millisecond)
	}
}

func lastLines(s string, n int) string {
	lines := splitLines(s)
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	out := ""
	for i, l := range lines {
		if i > 0 {
			out += " | "
		}
		out += l
	}
	return out
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			if i > start {
				out = append(out, s[start:i])
			}
			start = i + 1
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}
