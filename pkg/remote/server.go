package remote

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/hagroup/hagroup/internal/filelock"
	"github.com/hagroup/hagroup/internal/p11raw"
	"github.com/hagroup/hagroup/internal/tokenquirk"
	"github.com/miekg/pkcs11"
	"golang.org/x/sys/unix"
)

// Server serves the tokens of one PKCS#11 module to Clients over Unix
// stream connections. With Child set (as hsmserve does), each accepted
// connection is served by a process of its own that loads and
// initialises the module for it alone, as `p11-kit server` does: a
// client's login, logout and sessions never touch another's. Without
// Child, connections are served in this process and share one module
// context and its login state (for tests and embedding).
type Server struct {
	// Module is the path of the PKCS#11 module to serve.
	Module string
	// InitArgs, when set, is the pReserved string of the module's
	// C_Initialize (p11-kit's x-init-reserved), such as NSS softokn's
	// configdir='sql:DIR' …; checked by internal/initargs.
	InitArgs string
	// TokenLabel, when set, serves only the slot whose token has this
	// label; other slots do not exist for clients.
	TokenLabel string
	// AllowUID, when set, decides which peer uids may connect; by default
	// the server's own uid and root.
	AllowUID func(uid uint32) bool
	// Refused, when set, is told about each connection refused (its peer
	// uid is not allowed, it speaks another protocol, it breaks a bound).
	// Never given a PIN.
	Refused func(err error)
	// Child, when set, returns the command that serves one connection,
	// started before the connection comes and handed it over file
	// descriptor 3, a control socket (ServeHanded serves it there). The
	// server starts it with that descriptor, its own stderr unless the
	// command has one, and SIGKILL as its parent-death signal, and at
	// shutdown sends it SIGTERM, then SIGKILL after a grace period.
	Child func() *exec.Cmd
	// MaxConns bounds the connections served by children at once (0:
	// DefaultMaxConns); more are refused (closed at once).
	MaxConns int
	// StoreLock, when set, is the path of a lock file (StoreLockPath) that
	// the processes of this server take shared around the module's
	// C_Initialize and exclusive around a C_Login of a token whose login
	// rewrites its store (SoftHSM: internal/tokenquirk), so that no
	// connection reads that store half-written by another's login, and
	// around a change of the object list of a token that must read the
	// list first (rereadObjects).
	StoreLock string
}

// StoreLockPath is the store lock of the server listening at socket: a
// file beside it, in a directory only its owner may write (Listen).
func StoreLockPath(socket string) string { return socket + ".lock" }

// storeLockWait bounds a wait for the store lock: a client gives up its
// handshake after DialTimeout, and a login that waits longer is stuck.
const storeLockWait = DialTimeout

// lockStore takes the store lock (exclusive or shared); the release is a
// no-op when the server has none.
func (s *Server) lockStore(exclusive bool) (release func(), err error) {
	if s.StoreLock == "" {
		return func() {}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeLockWait)
	defer cancel()
	take := filelock.LockShared
	if exclusive {
		take = filelock.Lock
	}
	f, err := take(ctx, s.StoreLock, 0o600)
	if err != nil {
		return nil, fmt.Errorf("store lock %s: %w", s.StoreLock, err)
	}
	return func() { f.Close() }, nil
}

// Listen listens on a Unix socket at path, mode 0600. It refuses a
// directory that another user could write (a socket path there could be
// replaced under the server). A socket file left by a server that died is
// replaced; a socket that answers is not.
func Listen(path string) (net.Listener, error) {
	if err := checkSocketDir(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("listen on %s: a server already answers there", path)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("listen on %s: exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
		}
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	// Connections before the chmod are still checked by peer uid.
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("set mode of %s: %w", path, err)
	}
	return l, nil
}

// checkSocketDir refuses a socket directory that another user could
// write, sticky or not (they could bind the socket's path while the
// server is down and receive what clients send, their PINs), or that
// another user owns; and a directory above it that another user owns or
// could write without the sticky bit (they could move it aside and put
// their own in its place).
func checkSocketDir(dir string) error {
	own := uint32(os.Getuid())
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("socket directory: %w", err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("socket directory %s is not a directory", d)
		}
		what := "socket directory " + d
		if d != filepath.Clean(dir) {
			what = fmt.Sprintf("%s, above socket directory %s,", d, dir)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if ok && st.Uid != own && st.Uid != 0 {
			return fmt.Errorf("%s is owned by uid %d: use a directory of this user (uid %d) or root", what, st.Uid, own)
		}
		mode := fi.Mode()
		if mode.Perm()&0o022 != 0 && (d == filepath.Clean(dir) || mode&os.ModeSticky == 0) {
			return fmt.Errorf("%s has mode %v: group or others can write it; use a directory only its owner can write", what, mode&(os.ModePerm|os.ModeSticky))
		}
		if d == "/" {
			return nil
		}
	}
}

// closeWait bounds how long Serve waits at shutdown for calls in flight
// (in this process) or for children to exit after SIGTERM.
const closeWait = 5 * time.Second

// DefaultMaxConns is Server.MaxConns by default.
const DefaultMaxConns = 256

// Serve serves l until ctx ends (returning nil) or accepting fails. It
// closes l. Without Child it first loads and initialises the module.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	if s.Child != nil {
		return s.serveChildren(ctx, l)
	}
	m, release, err := s.load()
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	err = s.accept(ctx, l, func(nc net.Conn) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.serveConn(ctx, nc)
		}()
	})
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		release()
	case <-time.After(closeWait):
		// Calls hang in the module: leave it be; the process is exiting.
	}
	return err
}

// accept accepts connections until ctx ends or l fails, and hands each
// one whose peer is allowed to handle. It closes l.
func (s *Server) accept(ctx context.Context, l net.Listener, handle func(net.Conn)) error {
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	defer l.Close()
	for {
		nc, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accept on %s: %w", l.Addr(), err)
		}
		if err := s.checkPeer(nc); err != nil {
			nc.Close()
			s.refuse(err)
			continue
		}
		handle(nc)
	}
}

// serveChildren serves each connection in a child process of its own.
// One child is started ahead, its module loaded (see ServeHanded), and
// the next connection is handed to it over its control socket: a client's
// connection does not wait for a process start, which a tool that
// initialises the PKCS#11 module per task would pay at every start.
func (s *Server) serveChildren(ctx context.Context, l net.Listener) error {
	// Linux sends a child its parent-death signal when the thread that
	// started it ends, not the process: start every child from this one
	// locked thread, which lives until the children are stopped.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var (
		mu       sync.Mutex
		children = make(map[*exec.Cmd]chan struct{})
		spare    *child // started ahead; nil when it could not be
	)
	limit := s.MaxConns
	if limit <= 0 {
		limit = DefaultMaxConns
	}
	startSpare := func() {
		c, err := s.startChild()
		if err != nil {
			s.refuse(err)
			spare = nil
			return
		}
		done := make(chan struct{})
		mu.Lock()
		children[c.cmd] = done
		mu.Unlock()
		go func() {
			_ = c.cmd.Wait()
			mu.Lock()
			delete(children, c.cmd)
			mu.Unlock()
			close(done)
		}()
		spare = c
	}
	// hand gives nc to the spare, or to a new one should the spare have
	// died meanwhile, and starts the next spare.
	hand := func(nc net.Conn) error {
		defer startSpare()
		err := errors.New("refused a connection: no process to serve it could be started")
		for range 2 {
			if spare == nil {
				if startSpare(); spare == nil {
					return err
				}
			}
			c := spare
			spare = nil
			if err = c.hand(nc); err == nil {
				return nil
			}
		}
		return err
	}
	startSpare()
	err := s.accept(ctx, l, func(nc net.Conn) {
		defer nc.Close() // the child has its own descriptor
		mu.Lock()
		n := len(children)
		mu.Unlock()
		if spare != nil {
			n-- // the spare serves nobody yet
		}
		if n >= limit {
			s.refuse(fmt.Errorf("refused a connection: %d connections are served already", n))
			return
		}
		if err := hand(nc); err != nil {
			s.refuse(err)
		}
	})
	mu.Lock()
	left := maps.Clone(children)
	mu.Unlock()
	stopChildren(left)
	return err
}

// child is a connection's process, started before its connection: it
// receives it on ctl.
type child struct {
	cmd *exec.Cmd
	ctl *net.UnixConn
}

// startChild starts a process that will serve the connection it is
// handed over its control socket (Child's file descriptor 3).
func (s *Server) startChild() (*child, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("control socket for a connection's server process: %w", err)
	}
	mine, theirs := os.NewFile(uintptr(fds[0]), "control"), os.NewFile(uintptr(fds[1]), "control")
	defer theirs.Close()
	fc, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		return nil, fmt.Errorf("control socket for a connection's server process: %w", err)
	}
	cmd := s.Child()
	cmd.ExtraFiles = []*os.File{theirs}
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	// A parent killed outright takes its children along, so that a
	// killed server drops every connection, as one process would.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		fc.Close()
		return nil, fmt.Errorf("start the server process of a connection: %w", err)
	}
	return &child{cmd: cmd, ctl: fc.(*net.UnixConn)}, nil
}

// hand passes nc's descriptor to the child; an error means the child is
// gone (it failed to load the module, or was killed).
func (c *child) hand(nc net.Conn) error {
	defer c.ctl.Close()
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		return fmt.Errorf("connection from %s is not a Unix socket connection", nc.RemoteAddr())
	}
	f, err := uc.File()
	if err != nil {
		return fmt.Errorf("pass a connection to its server process: %w", err)
	}
	defer f.Close()
	if _, _, err := c.ctl.WriteMsgUnix([]byte{1}, unix.UnixRights(int(f.Fd())), nil); err != nil {
		return fmt.Errorf("pass a connection to its server process (pid %d): %w", c.cmd.Process.Pid, err)
	}
	return nil
}

// stopChildren sends each child SIGTERM and waits closeWait for it, then
// kills those left.
func stopChildren(children map[*exec.Cmd]chan struct{}) {
	for cmd := range children {
		_ = cmd.Process.Signal(syscall.SIGTERM)
	}
	grace := time.NewTimer(closeWait)
	defer grace.Stop()
	for cmd, done := range children {
		select {
		case <-done:
			continue
		case <-grace.C:
		}
		_ = cmd.Process.Kill()
		<-done
	}
}

// ServeHanded is the body of a Child: it loads the module, waits for the
// one connection its Server hands it over ctl, and then, with a module
// context of its own, initialises the module, serves the connection until
// the client closes it or ctx ends, and finalizes the module. The peer was
// checked by the Server that accepted it. The module is initialised only
// once the connection came: SoftHSM reads the token's state (its PINs
// among it) at C_Initialize and keeps it, and another process's login
// rewrites that file, so a view read ahead could be a torn one for the
// process's whole life (seen: CKR_USER_PIN_NOT_INITIALIZED at C_Login). A
// Server that stops before handing a connection closes ctl: ServeHanded
// then returns nil.
func (s *Server) ServeHanded(ctx context.Context, ctl *net.UnixConn) error {
	mc, err := s.open()
	if err != nil {
		ctl.Close()
		return err
	}
	nc, err := receiveConn(ctx, ctl)
	if err != nil || nc == nil {
		mc.Destroy()
		return err
	}
	m, release, err := s.initialize(mc) // destroys mc should it fail
	if err != nil {
		nc.Close()
		return err
	}
	defer release()
	m.serveConn(ctx, nc)
	return nil
}

// receiveConn reads the connection handed over ctl; nil when ctl closed
// (or ctx ended) first.
func receiveConn(ctx context.Context, ctl *net.UnixConn) (net.Conn, error) {
	stop := context.AfterFunc(ctx, func() { ctl.Close() })
	defer stop()
	defer ctl.Close()
	b, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := ctl.ReadMsgUnix(b, oob)
	if n == 0 || ctx.Err() != nil {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("receive the connection: %w", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, fmt.Errorf("receive the connection: no descriptor came (%v)", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return nil, fmt.Errorf("receive the connection: %d descriptors (%v)", len(fds), err)
	}
	f := os.NewFile(uintptr(fds[0]), "connection")
	defer f.Close()
	nc, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("receive the connection: %w", err)
	}
	return nc, nil
}

// load loads and initialises the module; release finalizes it (unless
// this process had initialised it already: then it is served as it is).
func (s *Server) load() (m *served, release func(), err error) {
	mc, err := s.open()
	if err != nil {
		return nil, nil, err
	}
	return s.initialize(mc)
}

// open loads the module without initialising it.
func (s *Server) open() (*pkcs11.Ctx, error) {
	mc := pkcs11.New(s.Module)
	if mc == nil {
		if _, err := os.Stat(s.Module); err != nil {
			return nil, fmt.Errorf("load PKCS#11 module: %w", err)
		}
		return nil, fmt.Errorf("load PKCS#11 module %s: dlopen failed or no C_GetFunctionList", s.Module)
	}
	return mc, nil
}

// initialize initialises the loaded module mc; release finalizes it
// (unless this process had initialised it already: then it is served as it
// is).
func (s *Server) initialize(mc *pkcs11.Ctx) (m *served, release func(), err error) {
	foreign := false
	unlock, err := s.lockStore(false)
	if err != nil {
		mc.Destroy()
		return nil, nil, fmt.Errorf("initialise PKCS#11 module %s: %w", s.Module, err)
	}
	err = p11raw.Initialize(mc, s.InitArgs)
	unlock()
	if err != nil {
		if !errors.Is(err, pkcs11.Error(pkcs11.CKR_CRYPTOKI_ALREADY_INITIALIZED)) {
			mc.Destroy()
			return nil, nil, fmt.Errorf("initialise PKCS#11 module %s: %w", s.Module, err)
		}
		foreign = true
	}
	fl, flErr := p11raw.FunctionList(mc, s.Module)
	release = func() {
		if !foreign {
			_ = mc.Finalize()
			mc.Destroy()
		}
	}
	return &served{srv: s, ctx: mc, fl: fl, flErr: flErr}, release, nil
}

// served is the module being served.
type served struct {
	srv   *Server
	ctx   *pkcs11.Ctx
	fl    unsafe.Pointer
	flErr error
	// objects holds the object locks of the served tokens that need one
	// (internal/tokenquirk): the server calls the module from many
	// threads of one process, for every client.
	objects tokenquirk.Locks
}

// objectAccess is what o does to the token's objects.
func objectAccess(o op) tokenquirk.Access {
	switch o {
	case opCreateObject, opCreateObjectNested, opCopyObject, opDestroyObject,
		opGenerateKey, opGenerateKeyPair, opUnwrapKey, opDeriveKey:
		return tokenquirk.Change
	case opSetAttributeValue:
		return tokenquirk.Write
	case opFindObjectsInit, opFindObjects, opGetAttributeValue, opGetNestedAttribute, opDigestKey:
		return tokenquirk.Read
	}
	return tokenquirk.None
}

// objectLock returns the object lock of the token in slot id, nil when it
// needs none.
func (m *served) objectLock(id uint) (*tokenquirk.ObjectLock, error) {
	ti, err := m.ctx.GetTokenInfo(id)
	if err != nil {
		return nil, err
	}
	return m.objects.For(id, ti.ManufacturerID, ti.Model), nil
}

// rereadObjects makes the module read the object list of session sh's
// token again before a change (tokenquirk: Hold.RereadFirst), under the
// store lock, which the other processes of this server hold for their
// changes too: so no change of theirs falls between the read and this
// one, to be hidden from this process by it. The release lets the lock go
// after the change. A change that cannot have the lock within
// tokenquirk.ChangeLockWait goes on without it, the read still made.
func (m *served) rereadObjects(sh pkcs11.SessionHandle) (release func(), err error) {
	si, err := m.ctx.GetSessionInfo(sh)
	if err != nil {
		return nil, err
	}
	release = func() {}
	if m.srv.StoreLock != "" {
		release = tokenquirk.LockChange(context.Background(), m.srv.StoreLock, 0o600)
	}
	// Its answer does not matter: the token reads its object list before
	// it reads the flags it may fail on.
	_, _ = m.ctx.GetTokenInfo(si.SlotID)
	return release, nil
}

// lockLogin takes the store lock for a login on session sh when its token
// rewrites its store at every login.
func (m *served) lockLogin(sh pkcs11.SessionHandle) (release func(), err error) {
	if m.srv.StoreLock == "" {
		return func() {}, nil
	}
	si, err := m.ctx.GetSessionInfo(sh)
	if err != nil {
		return nil, err
	}
	ti, err := m.ctx.GetTokenInfo(si.SlotID)
	if err != nil {
		return nil, err
	}
	if !tokenquirk.LoginRewritesStore(ti.ManufacturerID, ti.Model) {
		return func() {}, nil
	}
	return m.srv.lockStore(true)
}

// Back-pressure: a connection runs at most maxInFlight requests at once,
// and the server reads the body of another only while the requests
// running and the replies not yet written hold less than MaxFrame bytes
// between them (any one frame is admitted when nothing else is held). So
// a client that sends without reading its replies stalls in its own
// socket buffer, and what a connection holds is bounded by MaxFrame plus
// the replies of the calls running.
const maxInFlight = 16

// budget counts what a connection's requests in flight hold.
type budget struct {
	mu    sync.Mutex
	cond  sync.Cond
	calls int
	bytes int
}

func newBudget() *budget {
	b := &budget{}
	b.cond.L = &b.mu
	return b
}

// acquire waits until one more call of n bytes fits.
func (b *budget) acquire(n int) {
	b.mu.Lock()
	for b.calls >= maxInFlight || (b.bytes > 0 && b.bytes+n > MaxFrame) {
		b.cond.Wait()
	}
	b.calls++
	b.bytes += n
	b.mu.Unlock()
}

// resize changes what a call holds from its request's n bytes to its
// reply's m. It does not wait: the reply is made already, and what the
// reader admits next accounts for it.
func (b *budget) resize(n, m int) {
	b.mu.Lock()
	b.bytes += m - n
	b.cond.Broadcast()
	b.mu.Unlock()
}

func (b *budget) release(n int) {
	b.mu.Lock()
	b.calls--
	b.bytes -= n
	b.cond.Broadcast()
	b.mu.Unlock()
}

// peer is one client connection.
type peer struct {
	m   *served
	nc  net.Conn
	wmu sync.Mutex

	smu      sync.RWMutex
	sessions map[pkcs11.SessionHandle]*tokenquirk.ObjectLock // each with its token's object lock
	calls    sync.WaitGroup
}

func (s *Server) refuse(err error) {
	if s.Refused != nil {
		s.Refused(err)
	}
}

// write sends one frame; a failed write ends the connection.
func (p *peer) write(e *encoder) {
	b, err := e.frame()
	if err != nil {
		p.m.srv.refuse(err)
		p.nc.Close()
		return
	}
	p.wmu.Lock()
	_, err = p.nc.Write(b)
	p.wmu.Unlock()
	if err != nil {
		p.nc.Close()
	}
}

// handshake reads the hello and answers it, within DialTimeout.
func (p *peer) handshake(r io.Reader) error {
	_ = p.nc.SetDeadline(time.Now().Add(DialTimeout))
	b, err := readFrame(r)
	if err != nil {
		return fmt.Errorf("read hello: %w", err)
	}
	var h hello
	d := &decoder{b: b}
	h.decode(d)
	if h.Magic != magic || h.Version != ProtocolVersion {
		err := fmt.Errorf("client speaks %q protocol version %d; this server %q version %d", h.Magic, h.Version, magic, ProtocolVersion)
		e := newFrame()
		(&welcome{Version: ProtocolVersion, Err: err.Error()}).encode(e)
		p.write(e)
		return err
	}
	if err := d.end(); err != nil {
		return fmt.Errorf("read hello: %w", err)
	}
	e := newFrame()
	(&welcome{Version: ProtocolVersion}).encode(e)
	p.write(e)
	return p.nc.SetDeadline(time.Time{})
}

// serveConn serves one connection until it ends or ctx does, then
// closes the sessions it left open.
func (m *served) serveConn(ctx context.Context, nc net.Conn) {
	defer nc.Close()
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	defer stop()
	p := &peer{m: m, nc: nc, sessions: make(map[pkcs11.SessionHandle]*tokenquirk.ObjectLock)}
	r := bufio.NewReader(nc)
	if err := p.handshake(r); err != nil {
		if !errors.Is(err, io.EOF) {
			m.srv.refuse(err)
		}
		return
	}
	b := newBudget()
	// Requests run on workers that outlive them (at most maxInFlight, as
	// the budget admits no more), so a call does not grow a new stack.
	type job struct {
		body []byte
		n    int
	}
	jobs := make(chan job)
	work := func(j job) {
		for ok := true; ok; j, ok = <-jobs {
			e := p.answer(j.body)
			size := len(e.b)
			b.resize(j.n, size)
			p.write(e)
			b.release(size)
			p.calls.Done()
		}
	}
	for {
		n, err := readHeader(r)
		if err != nil {
			if !errors.Is(err, io.EOF) && ctx.Err() == nil {
				m.srv.refuse(err)
			}
			break
		}
		b.acquire(n)
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			b.release(n)
			break
		}
		p.calls.Add(1)
		select {
		case jobs <- job{body, n}:
		default: // every worker is busy
			go work(job{body, n})
		}
	}
	close(jobs)
	nc.Close()
	p.calls.Wait()
	p.smu.Lock()
	defer p.smu.Unlock()
	for sh := range p.sessions {
		_ = m.ctx.CloseSession(sh)
	}
	p.sessions = nil
}

// answer decodes and runs one request and returns its reply frame.
func (p *peer) answer(body []byte) *encoder {
	defer clear(body) // a PIN, if any
	d := &decoder{b: body}
	r := &response{ID: uint64(d.uint())}
	o := op(d.uint())
	var out []reflect.Value
	err := d.err
	if err == nil {
		out, err = p.exec(o, d)
	}
	if err != nil {
		r.RV, r.Err, out = codeOf(err), "", nil
		var pe pkcs11.Error
		if !errors.As(err, &pe) || err != error(pe) {
			// Say why, as the client adds the code itself.
			r.Err = strings.TrimSuffix(err.Error(), ": "+pkcs11.Error(r.RV).Error())
		}
	}
	e := newFrame()
	r.encode(e)
	for _, v := range out {
		e.value(v)
	}
	if n := len(e.b) - frameHeader; n > MaxFrame {
		e = newFrame()
		(&response{ID: r.ID, RV: pkcs11.CKR_DEVICE_MEMORY,
			Err: fmt.Sprintf("reply of %d bytes exceeds the %d-byte frame bound", n, MaxFrame)}).encode(e)
	}
	return e
}

// codeOf is the CKR code of err: its own, or CKR_GENERAL_ERROR.
func codeOf(err error) uint {
	var pe pkcs11.Error
	if errors.As(err, &pe) {
		return uint(pe)
	}
	return pkcs11.CKR_GENERAL_ERROR
}

// checkPeer lets in the server's own uid and root (or Server.AllowUID).
func (s *Server) checkPeer(nc net.Conn) error {
	cred, err := peerCred(nc)
	if err != nil {
		return err
	}
	allow := s.AllowUID
	if allow == nil {
		own := uint32(os.Getuid())
		allow = func(uid uint32) bool { return uid == own || uid == 0 }
	}
	if !allow(cred.Uid) {
		return fmt.Errorf("refused connection from pid %d uid %d: uid not allowed", cred.Pid, cred.Uid)
	}
	return nil
}

// peerCred returns the credentials (SO_PEERCRED) of nc's peer: the
// process that connected, or the one that listened.
func peerCred(nc net.Conn) (*unix.Ucred, error) {
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		return nil, fmt.Errorf("connection to %s is not a Unix socket connection", nc.RemoteAddr())
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if cerr != nil {
		return nil, fmt.Errorf("read peer credentials: %w", cerr)
	}
	return cred, nil
}

var (
	errSessionInvalid = pkcs11.Error(pkcs11.CKR_SESSION_HANDLE_INVALID)
	errSlotInvalid    = pkcs11.Error(pkcs11.CKR_SLOT_ID_INVALID)
	// errFunctionNotSupported answers a PKCS#11 function a member never
	// needs (C_InitToken, C_SetOperationState, …): not served.
	errFunctionNotSupported = pkcs11.Error(pkcs11.CKR_FUNCTION_NOT_SUPPORTED)
)

// session checks that sh is a session of this connection and returns it
// with its token's object lock.
func (p *peer) session(sh uint) (pkcs11.SessionHandle, *tokenquirk.ObjectLock, error) {
	h := pkcs11.SessionHandle(sh)
	p.smu.RLock()
	l, ok := p.sessions[h]
	p.smu.RUnlock()
	if !ok {
		return 0, nil, errSessionInvalid
	}
	return h, l, nil
}

// slotServed reports whether slot id is served (Server.TokenLabel).
func (m *served) slotServed(id uint) error {
	if m.srv.TokenLabel == "" {
		return nil
	}
	ti, err := m.ctx.GetTokenInfo(id)
	if err != nil {
		var pe pkcs11.Error
		if errors.As(err, &pe) && pe == pkcs11.CKR_TOKEN_NOT_PRESENT {
			return errSlotInvalid
		}
		return err
	}
	if strings.TrimRight(ti.Label, " \x00") != m.srv.TokenLabel {
		return errSlotInvalid
	}
	return nil
}

// exec reads the arguments of o's call from d and runs it: a PKCS#11
// function on the module (its method of *pkcs11.Ctx, functions), after
// the checks and the bookkeeping of the few that need them, or one of
// hagroup's own (own).
func (p *peer) exec(o op, d *decoder) ([]reflect.Value, error) {
	f, err := o.function()
	if err != nil {
		return nil, err
	}
	ts, in := f.args(d)
	if err := d.end(); err != nil {
		return nil, fmt.Errorf("request: %v: %w", err, errArgumentsBad)
	}
	var (
		m       = p.m
		slot    = len(ts) > 0 && ts[0].Kind() == reflect.Uint && ts[0] != typeSession
		objects *tokenquirk.ObjectLock
	)
	switch {
	case len(ts) > 0 && ts[0] == typeSession:
		sh := pkcs11.SessionHandle(in[0].Uint())
		if _, objects, err = p.session(uint(sh)); err != nil {
			return nil, err
		}
		// The client's deadline bounds the wait; the server has none of its own.
		hold, err := objects.Acquire(context.Background(), objectAccess(o))
		if err != nil {
			return nil, err
		}
		defer hold.Release()
		if hold.RereadFirst() {
			unlock, err := m.rereadObjects(sh)
			if err != nil {
				return nil, err
			}
			defer unlock()
		}
		if o == opLogin {
			unlock, err := m.lockLogin(sh)
			if err != nil {
				return nil, err
			}
			defer unlock()
		}
	case slot:
		if err := m.slotServed(uint(in[0].Uint())); err != nil {
			return nil, err
		}
		if o == opOpenSession {
			if objects, err = m.objectLock(uint(in[0].Uint())); err != nil {
				return nil, err
			}
		}
	}
	switch o {
	case opCloseSession:
		p.smu.Lock()
		delete(p.sessions, pkcs11.SessionHandle(in[0].Uint()))
		p.smu.Unlock()
	case opFindObjects:
		// A search may return fewer than asked; the reply must fit.
		in[1].SetInt(min(in[1].Int(), MaxHandles))
	case opGenerateRandom:
		if n := in[1].Int(); n > MaxRandom {
			return nil, fmt.Errorf("C_GenerateRandom of %d bytes exceeds the bound of %d: %w", n, MaxRandom, errArgumentsBad)
		}
	case opUnwrapKey:
		if err := WrappedKeyMissing(in[3].Bytes()); err != nil {
			return nil, err
		}
	}
	out, err := m.call(f, ts, in)
	if err != nil {
		return nil, err
	}
	switch o {
	case opGetSlotList:
		var ids []uint
		for _, id := range out[0].Interface().([]uint) {
			if m.slotServed(id) == nil {
				ids = append(ids, id)
			}
		}
		out[0] = reflect.ValueOf(ids)
	case opOpenSession:
		h := pkcs11.SessionHandle(out[0].Uint())
		p.smu.Lock()
		defer p.smu.Unlock()
		if p.sessions == nil {
			_ = m.ctx.CloseSession(h)
			return nil, errSessionInvalid
		}
		p.sessions[h] = objects
	}
	return out, nil
}

// args reads f's arguments from d, each by its type in f's signature
// (ts), a mechanism as the wire has it (call rebuilds it).
func (f function) args(d *decoder) (ts []reflect.Type, in []reflect.Value) {
	ts, _ = f.signature()
	in = make([]reflect.Value, len(ts))
	for i, t := range ts {
		if t == typeMechs {
			t = reflect.TypeFor[[]*mech]()
		}
		in[i] = reflect.New(t).Elem()
		d.value(in[i])
	}
	return ts, in
}

// call runs f on the module with the arguments in (of types ts), each
// mechanism rebuilt from the wire (mechIn), and returns its results.
func (m *served) call(f function, ts []reflect.Type, in []reflect.Value) ([]reflect.Value, error) {
	recv := reflect.ValueOf(m.ctx)
	if reflect.TypeOf(f.run).In(0) != recv.Type() {
		recv = reflect.ValueOf(m) // hagroup's own
	}
	in = append([]reflect.Value{recv}, in...)
	for i, t := range ts {
		if t != typeMechs {
			continue
		}
		ws := in[i+1].Interface().([]*mech)
		if len(ws) != 1 { // miekg would panic
			return nil, fmt.Errorf("%d mechanisms, not one: %w", len(ws), errArgumentsBad)
		}
		ms, free, err := mechIn(ws[0])
		if err != nil {
			return nil, err
		}
		defer free()
		in[i+1] = reflect.ValueOf(ms)
	}
	out := reflect.ValueOf(f.run).Call(in)
	err, _ := out[len(out)-1].Interface().(error)
	return out[:len(out)-1], err
}

// createObjectNested creates an object whose template also holds
// attribute arrays (hagroup's own call).
func (m *served) createObjectNested(sh pkcs11.SessionHandle, tmpl []*pkcs11.Attribute, nested []nestedAttr) (pkcs11.ObjectHandle, error) {
	if m.fl == nil {
		return 0, fmt.Errorf("nested templates need the module's function list: %v", m.flErr)
	}
	byType := make(map[uint][]*pkcs11.Attribute, len(nested))
	for _, n := range nested {
		byType[n.Type] = n.Attrs
	}
	return p11raw.CreateObjectNested(m.fl, sh, tmpl, byType)
}

// getNestedAttribute reads the attribute array held by attribute typ of h
// (hagroup's own call).
func (m *served) getNestedAttribute(sh pkcs11.SessionHandle, h pkcs11.ObjectHandle, typ uint) ([]*pkcs11.Attribute, error) {
	if m.fl == nil {
		return nil, fmt.Errorf("nested templates need the module's function list: %v", m.flErr)
	}
	return p11raw.GetNestedAttribute(m.fl, sh, h, typ)
}
