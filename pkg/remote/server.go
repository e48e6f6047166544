package remote

import (
	"bufio"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/hagroup/hagroup/internal/p11raw"
	"github.com/miekg/pkcs11"
	"golang.org/x/sys/unix"
)

// Server serves the tokens of one PKCS#11 module to Clients over Unix
// stream connections. The module is loaded and initialised once, in the
// server's process; each connection gets its own sessions, closed when the
// connection ends. Login state is the token's, shared by every connection
// (as it is by every application of one PKCS#11 module).
type Server struct {
	// Module is the path of the PKCS#11 module to serve.
	Module string
	// TokenLabel, when set, serves only the slot whose token has this
	// label; other slots do not exist for clients.
	TokenLabel string
	// AllowUID, when set, decides which peer uids may connect; by default
	// the server's own uid and root.
	AllowUID func(uid uint32) bool
	// Refused, when set, is told about each connection refused (its peer
	// uid is not allowed, or it speaks another protocol). Never given a PIN.
	Refused func(err error)
}

// Serve serves module on l until ctx ends (then it returns nil) or l fails.
func Serve(ctx context.Context, l net.Listener, module string) error {
	return (&Server{Module: module}).Serve(ctx, l)
}

// Listen listens on a Unix socket at path, mode 0600. A socket file left
// by a server that died is replaced; a socket that answers is not.
func Listen(path string) (net.Listener, error) {
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

// closeWait bounds how long Serve waits for calls in flight at shutdown
// before finalizing the module under them.
const closeWait = 5 * time.Second

// Serve loads and initialises the module, then serves l until ctx ends
// (returning nil) or accepting fails. It closes l.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	mc := pkcs11.New(s.Module)
	if mc == nil {
		if _, err := os.Stat(s.Module); err != nil {
			return fmt.Errorf("load PKCS#11 module: %w", err)
		}
		return fmt.Errorf("load PKCS#11 module %s: dlopen failed or no C_GetFunctionList", s.Module)
	}
	// A module already initialised in this process (by pkg/slot, say) is
	// served as it is and never finalized here.
	foreign := false
	if err := mc.Initialize(); err != nil {
		if !errors.Is(err, pkcs11.Error(pkcs11.CKR_CRYPTOKI_ALREADY_INITIALIZED)) {
			mc.Destroy()
			return fmt.Errorf("initialise PKCS#11 module %s: %w", s.Module, err)
		}
		foreign = true
	}
	fl, flErr := p11raw.FunctionList(mc, s.Module)
	m := &served{srv: s, ctx: mc, fl: fl, flErr: flErr}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	conns := make(map[net.Conn]struct{})
	var mu sync.Mutex
	go func() {
		<-ctx.Done()
		l.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
	}()
	var err error
	for {
		c, aerr := l.Accept()
		if aerr != nil {
			if ctx.Err() == nil {
				err = fmt.Errorf("accept on %s: %w", l.Addr(), aerr)
			}
			break
		}
		mu.Lock()
		conns[c] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.serveConn(c)
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
		}()
	}
	cancel()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		if !foreign {
			_ = mc.Finalize()
			mc.Destroy()
		}
	case <-time.After(closeWait):
		// Calls hang in the module: leave it be; the process is exiting.
	}
	return err
}

// served is the module being served.
type served struct {
	srv   *Server
	ctx   *pkcs11.Ctx
	fl    unsafe.Pointer
	flErr error
	// objects keeps calls that write token objects apart from calls that
	// read them. The server calls the module from many threads of one
	// process, and SoftHSM 2.6 does not keep two threads apart on one
	// object file (fcntl locks work between processes only): a search or
	// read that refreshes an object while another thread writes it can
	// leave it without CKA_CLASS for good, and the write then fails with
	// CKR_GENERAL_ERROR. Cryptographic calls take no lock.
	objects sync.RWMutex
}

// objectLock takes the lock o needs on m.objects and returns its
// release.
func (m *served) objectLock(o op) func() {
	switch o {
	case opCreateObject, opCreateObjectNested, opCopyObject, opDestroyObject, opSetAttributeValue,
		opGenerateKey, opGenerateKeyPair, opUnwrapKey, opDeriveKey:
		m.objects.Lock()
		return m.objects.Unlock
	case opFindObjectsInit, opFindObjects, opGetAttributeValue, opGetNestedAttribute:
		m.objects.RLock()
		return m.objects.RUnlock
	}
	return func() {}
}

// peer is one client connection.
type peer struct {
	m   *served
	nc  net.Conn
	wmu sync.Mutex
	enc *gob.Encoder

	smu      sync.RWMutex
	sessions map[pkcs11.SessionHandle]struct{}
	calls    sync.WaitGroup
}

func (m *served) refuse(err error) {
	if m.srv.Refused != nil {
		m.srv.Refused(err)
	}
}

// serveConn serves one connection until it ends, then closes the
// sessions it left open.
func (m *served) serveConn(nc net.Conn) {
	defer nc.Close()
	if err := m.checkPeer(nc); err != nil {
		m.refuse(err)
		return
	}
	p := &peer{m: m, nc: nc, enc: gob.NewEncoder(nc), sessions: make(map[pkcs11.SessionHandle]struct{})}
	dec := gob.NewDecoder(bufio.NewReader(nc))
	_ = nc.SetDeadline(time.Now().Add(DialTimeout))
	var h hello
	if err := dec.Decode(&h); err != nil {
		m.refuse(fmt.Errorf("read hello: %w", err))
		return
	}
	if h.Magic != magic || h.Version != ProtocolVersion {
		err := fmt.Errorf("client speaks %q protocol version %d; this server %q version %d", h.Magic, h.Version, magic, ProtocolVersion)
		_ = p.enc.Encode(welcome{Version: ProtocolVersion, Err: err.Error()})
		m.refuse(err)
		return
	}
	if err := p.enc.Encode(welcome{Version: ProtocolVersion}); err != nil {
		return
	}
	_ = nc.SetDeadline(time.Time{})
	for {
		req := new(request)
		if err := dec.Decode(req); err != nil {
			break
		}
		p.calls.Add(1)
		go func() {
			defer p.calls.Done()
			r := p.exec(req)
			r.ID = req.ID
			p.wmu.Lock()
			err := p.enc.Encode(r)
			p.wmu.Unlock()
			if err != nil {
				nc.Close()
			}
		}()
	}
	nc.Close()
	p.calls.Wait()
	p.smu.Lock()
	defer p.smu.Unlock()
	for sh := range p.sessions {
		_ = m.ctx.CloseSession(sh)
	}
	p.sessions = nil
}

// checkPeer lets in the server's own uid and root (or Server.AllowUID).
func (m *served) checkPeer(nc net.Conn) error {
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		return fmt.Errorf("connection from %s is not a Unix socket connection", nc.RemoteAddr())
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("read peer credentials: %w", cerr)
	}
	allow := m.srv.AllowUID
	if allow == nil {
		own := uint32(os.Getuid())
		allow = func(uid uint32) bool { return uid == own || uid == 0 }
	}
	if !allow(cred.Uid) {
		return fmt.Errorf("refused connection from pid %d uid %d: uid not allowed", cred.Pid, cred.Uid)
	}
	return nil
}

var (
	errSessionInvalid = pkcs11.Error(pkcs11.CKR_SESSION_HANDLE_INVALID)
	errSlotInvalid    = pkcs11.Error(pkcs11.CKR_SLOT_ID_INVALID)
)

// session checks that sh is a session of this connection.
func (p *peer) session(sh uint) (pkcs11.SessionHandle, error) {
	h := pkcs11.SessionHandle(sh)
	p.smu.RLock()
	_, ok := p.sessions[h]
	p.smu.RUnlock()
	if !ok {
		return 0, errSessionInvalid
	}
	return h, nil
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

// exec runs one request on the module.
func (p *peer) exec(q *request) *response {
	r := &response{}
	if err := p.run(q, r); err != nil {
		var pe pkcs11.Error
		if errors.As(err, &pe) {
			r.RV = uint(pe)
		} else {
			r.RV = pkcs11.CKR_GENERAL_ERROR
			r.Err = err.Error()
		}
		// A failed call returns nothing else.
		*r = response{RV: r.RV, Err: r.Err}
	}
	return r
}

func (p *peer) run(q *request, r *response) error {
	m := p.m
	c := m.ctx
	switch q.Op {
	case opGetInfo:
		v, err := c.GetInfo()
		r.Info = &v
		return err
	case opGetSlotList:
		ids, err := c.GetSlotList(q.N != 0)
		if err != nil {
			return err
		}
		for _, id := range ids {
			if m.slotServed(id) == nil {
				r.Handles = append(r.Handles, id)
			}
		}
		return nil
	case opGetSlotInfo, opGetTokenInfo, opGetMechanismList, opGetMechanismInfo, opOpenSession:
		if err := m.slotServed(q.Slot); err != nil {
			return err
		}
		return p.runSlot(q, r)
	}
	if q.Op == opInvalid || q.Op >= opCount {
		return fmt.Errorf("unknown operation %d (protocol version %d)", q.Op, ProtocolVersion)
	}
	sh, err := p.session(q.Session)
	if err != nil {
		return err
	}
	ms, err := mechIn(q.Mech)
	if err != nil {
		return err
	}
	defer freeMech(ms)
	defer m.objectLock(q.Op)()
	obj := pkcs11.ObjectHandle(q.Object)
	switch q.Op {
	case opCloseSession:
		p.smu.Lock()
		delete(p.sessions, sh)
		p.smu.Unlock()
		return c.CloseSession(sh)
	case opGetSessionInfo:
		v, err := c.GetSessionInfo(sh)
		r.SessionInfo = &v
		return err
	case opLogin:
		pin := string(q.PIN)
		clear(q.PIN)
		return c.Login(sh, q.N, pin)
	case opLogout:
		return c.Logout(sh)
	case opCreateObject:
		h, err := c.CreateObject(sh, q.Attrs)
		r.Handle = uint(h)
		return err
	case opCreateObjectNested:
		if m.fl == nil {
			return fmt.Errorf("nested templates need the module's function list: %v", m.flErr)
		}
		nested := make(map[uint][]*pkcs11.Attribute, len(q.Nested))
		for _, n := range q.Nested {
			nested[n.Type] = n.Attrs
		}
		h, err := p11raw.CreateObjectNested(m.fl, sh, q.Attrs, nested)
		r.Handle = uint(h)
		return err
	case opCopyObject:
		h, err := c.CopyObject(sh, obj, q.Attrs)
		r.Handle = uint(h)
		return err
	case opDestroyObject:
		return c.DestroyObject(sh, obj)
	case opGetAttributeValue:
		v, err := c.GetAttributeValue(sh, obj, q.Attrs)
		r.Attrs = v
		return err
	case opGetNestedAttribute:
		if m.fl == nil {
			return fmt.Errorf("nested templates need the module's function list: %v", m.flErr)
		}
		v, err := p11raw.GetNestedAttribute(m.fl, sh, obj, q.N)
		r.Attrs = v
		return err
	case opSetAttributeValue:
		return c.SetAttributeValue(sh, obj, q.Attrs)
	case opFindObjectsInit:
		return c.FindObjectsInit(sh, q.Attrs)
	case opFindObjects:
		hs, more, err := c.FindObjects(sh, int(q.N))
		r.Handles = make([]uint, len(hs))
		for i, h := range hs {
			r.Handles[i] = uint(h)
		}
		r.More = more
		return err
	case opFindObjectsFinal:
		return c.FindObjectsFinal(sh)
	case opGenerateKey:
		h, err := c.GenerateKey(sh, ms, q.Attrs)
		r.Handle = uint(h)
		return err
	case opGenerateKeyPair:
		a, b, err := c.GenerateKeyPair(sh, ms, q.Attrs, q.Attrs2)
		r.Handle, r.Handle2 = uint(a), uint(b)
		return err
	case opWrapKey:
		v, err := c.WrapKey(sh, ms, obj, pkcs11.ObjectHandle(q.Object2))
		r.Data = v
		return err
	case opUnwrapKey:
		h, err := c.UnwrapKey(sh, ms, obj, q.Data, q.Attrs)
		r.Handle = uint(h)
		return err
	case opDeriveKey:
		h, err := c.DeriveKey(sh, ms, obj, q.Attrs)
		r.Handle = uint(h)
		return err
	case opGenerateRandom:
		v, err := c.GenerateRandom(sh, int(q.N))
		r.Data = v
		return err
	case opSignInit:
		return c.SignInit(sh, ms, obj)
	case opSign:
		v, err := c.Sign(sh, q.Data)
		r.Data = v
		return err
	case opSignUpdate:
		return c.SignUpdate(sh, q.Data)
	case opSignFinal:
		v, err := c.SignFinal(sh)
		r.Data = v
		return err
	case opVerifyInit:
		return c.VerifyInit(sh, ms, obj)
	case opVerify:
		return c.Verify(sh, q.Data, q.Data2)
	case opVerifyUpdate:
		return c.VerifyUpdate(sh, q.Data)
	case opVerifyFinal:
		return c.VerifyFinal(sh, q.Data2)
	case opEncryptInit:
		return c.EncryptInit(sh, ms, obj)
	case opEncrypt:
		v, err := c.Encrypt(sh, q.Data)
		r.Data = v
		return err
	case opEncryptUpdate:
		v, err := c.EncryptUpdate(sh, q.Data)
		r.Data = v
		return err
	case opEncryptFinal:
		v, err := c.EncryptFinal(sh)
		r.Data = v
		return err
	case opDecryptInit:
		return c.DecryptInit(sh, ms, obj)
	case opDecrypt:
		v, err := c.Decrypt(sh, q.Data)
		r.Data = v
		return err
	case opDecryptUpdate:
		v, err := c.DecryptUpdate(sh, q.Data)
		r.Data = v
		return err
	case opDecryptFinal:
		v, err := c.DecryptFinal(sh)
		r.Data = v
		return err
	case opDigestInit:
		return c.DigestInit(sh, ms)
	case opDigest:
		v, err := c.Digest(sh, q.Data)
		r.Data = v
		return err
	case opDigestUpdate:
		return c.DigestUpdate(sh, q.Data)
	case opDigestFinal:
		v, err := c.DigestFinal(sh)
		r.Data = v
		return err
	}
	return fmt.Errorf("operation %d is not served", q.Op)
}

// runSlot runs the calls on a slot (already checked to be served).
func (p *peer) runSlot(q *request, r *response) error {
	c := p.m.ctx
	switch q.Op {
	case opGetSlotInfo:
		v, err := c.GetSlotInfo(q.Slot)
		r.SlotInfo = &v
		return err
	case opGetTokenInfo:
		v, err := c.GetTokenInfo(q.Slot)
		r.TokenInfo = &v
		return err
	case opGetMechanismList:
		ms, err := c.GetMechanismList(q.Slot)
		for _, mm := range ms {
			r.Handles = append(r.Handles, mm.Mechanism)
		}
		return err
	case opGetMechanismInfo:
		ms, err := mechIn(q.Mech)
		if err != nil {
			return err
		}
		if ms == nil {
			return pkcs11.Error(pkcs11.CKR_ARGUMENTS_BAD)
		}
		v, err := c.GetMechanismInfo(q.Slot, ms)
		r.MechInfo = &v
		return err
	case opOpenSession:
		h, err := c.OpenSession(q.Slot, q.N)
		if err != nil {
			return err
		}
		p.smu.Lock()
		if p.sessions == nil {
			p.smu.Unlock()
			_ = c.CloseSession(h)
			return errSessionInvalid
		}
		p.sessions[h] = struct{}{}
		p.smu.Unlock()
		r.Handle = uint(h)
		return nil
	}
	return fmt.Errorf("operation %d is not served", q.Op)
}
