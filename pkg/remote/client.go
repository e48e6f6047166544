package remote

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/pkcs11"
)

// DialTimeout bounds connecting to the server and the protocol handshake
// in Initialize.
const DialTimeout = 10 * time.Second

// Client is a PKCS#11 context on a token served by another process: the
// method set of miekg's *pkcs11.Ctx for every function hsmserve serves
// (most written by rpcgen, client_gen.go), plus CreateObjectNested and
// GetNestedAttribute. Initialize connects, Finalize
// disconnects (the server closes the sessions of the connection).
//
// Before it sends a byte, Initialize checks who serves the socket
// (SO_PEERCRED): root or the expected uid (NewClient's serverUID), so that
// a process of another user bound at the socket's path receives nothing,
// no PIN above all.
//
// Calls run concurrently over one connection. When the connection is lost
// (the server died), every pending and later call fails at once with
// CKR_DEVICE_ERROR until Finalize and Initialize connect again, as a lost
// p11-kit connection does. A server that stops answering (stopped, hung in
// its module) makes calls wait: the caller's own deadline bounds them
// (pkg/slot abandons them at Spec.CommandTimeout), and Finalize releases
// them. Safe for concurrent use.
type Client struct {
	sock      string
	serverUID uint32
	cur       atomic.Pointer[conn]
	mu        sync.Mutex // serialises Initialize and Finalize
}

// NewClient returns an unconnected client for module path (see Scheme).
// serverUID is the uid the server must run as (root is accepted too);
// nil means this process's own uid.
func NewClient(path string, serverUID *uint32) (*Client, error) {
	sock, err := ParseModulePath(path)
	if err != nil {
		return nil, err
	}
	uid := uint32(os.Getuid())
	if serverUID != nil {
		uid = *serverUID
	}
	return &Client{sock: sock, serverUID: uid}, nil
}

var (
	errDevice         = pkcs11.Error(pkcs11.CKR_DEVICE_ERROR)
	errNotInitialized = pkcs11.Error(pkcs11.CKR_CRYPTOKI_NOT_INITIALIZED)
)

// ErrNotSent is wrapped by the error of a call whose request never reached
// the server: not connected, the connection already lost, or lost before a
// byte of the request was written. Such a call cannot have done anything
// on the token, so a caller may make it elsewhere; a call that was sent
// and got no answer (CKR_DEVICE_ERROR without ErrNotSent) may have.
var ErrNotSent = errors.New("request not sent to the token server")

// Initialize connects to the server. Options are ignored (the server's
// module is initialised by the server). A server that cannot be reached,
// or runs as another user, gives an error wrapping CKR_DEVICE_ERROR.
func (c *Client) Initialize(...pkcs11.InitializeOption) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur.Load() != nil {
		return pkcs11.Error(pkcs11.CKR_CRYPTOKI_ALREADY_INITIALIZED)
	}
	nc, err := net.DialTimeout("unix", c.sock, DialTimeout)
	if err != nil {
		return fmt.Errorf("connect to token server: %v: %w: %w", err, ErrNotSent, errDevice)
	}
	if err := c.checkServer(nc); err != nil {
		nc.Close()
		return fmt.Errorf("%v: %w", err, errDevice)
	}
	cn, err := handshake(nc)
	if err != nil {
		nc.Close()
		return fmt.Errorf("token server at %s: %v: %w", c.sock, err, errDevice)
	}
	c.cur.Store(cn)
	go cn.read()
	return nil
}

// checkServer lets the client talk only to a server running as root or
// as the expected uid.
func (c *Client) checkServer(nc net.Conn) error {
	cred, err := peerCred(nc)
	if err != nil {
		return fmt.Errorf("token server at %s: %v", c.sock, err)
	}
	if cred.Uid != 0 && cred.Uid != c.serverUID {
		want := "root"
		if c.serverUID != 0 {
			want = fmt.Sprintf("uid %d or root", c.serverUID)
		}
		return fmt.Errorf("token server at %s runs as uid %d (pid %d), not %s: refusing to send it anything", c.sock, cred.Uid, cred.Pid, want)
	}
	return nil
}

// Finalize disconnects; pending calls fail with CKR_DEVICE_ERROR.
func (c *Client) Finalize() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	cn := c.cur.Swap(nil)
	if cn == nil {
		return errNotInitialized
	}
	cn.fail(errors.New("finalized"))
	return nil
}

// Destroy disconnects if connected.
func (c *Client) Destroy() { _ = c.Finalize() }

// conn is one connection and its pending calls.
type conn struct {
	nc  net.Conn
	r   *bufio.Reader
	wmu sync.Mutex

	pmu     sync.Mutex
	pending map[uint64]pendingCall
	next    uint64
	broken  error // set once: every later call fails
}

// pendingCall is a call waiting for its reply.
type pendingCall struct {
	op op
	ch chan reply
}

// reply is a response and the results of its call.
type reply struct {
	head response
	out  []reflect.Value
}

// handshake sends the hello and reads the welcome, within DialTimeout.
func handshake(nc net.Conn) (*conn, error) {
	if err := nc.SetDeadline(time.Now().Add(DialTimeout)); err != nil {
		return nil, err
	}
	cn := &conn{nc: nc, r: bufio.NewReader(nc), pending: make(map[uint64]pendingCall)}
	e := newFrame()
	(&hello{Magic: magic, Version: ProtocolVersion}).encode(e)
	if err := cn.write(e); err != nil {
		return nil, fmt.Errorf("send hello: %w", err)
	}
	b, err := readFrame(cn.r)
	if err != nil {
		return nil, fmt.Errorf("read welcome: %w", err)
	}
	var w welcome
	d := &decoder{b: b}
	w.decode(d)
	if err := d.end(); err != nil {
		return nil, fmt.Errorf("read welcome: %w", err)
	}
	if w.Err != "" {
		return nil, fmt.Errorf("refused: %s", w.Err)
	}
	if w.Version != ProtocolVersion {
		return nil, fmt.Errorf("server speaks protocol version %d, this client %d", w.Version, ProtocolVersion)
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return cn, nil
}

// write sends one frame.
func (cn *conn) write(e *encoder) error {
	b, err := e.frame()
	if err != nil {
		return err
	}
	cn.wmu.Lock()
	defer cn.wmu.Unlock()
	_, err = cn.nc.Write(b)
	return err
}

// read delivers responses until the connection fails. A frame or a
// response that breaks a bound, or answers no call, ends the connection.
func (cn *conn) read() {
	for {
		b, err := readFrame(cn.r)
		if err != nil {
			cn.fail(err)
			return
		}
		var r reply
		d := &decoder{b: b}
		r.head.decode(d)
		cn.pmu.Lock()
		pc, ok := cn.pending[r.head.ID]
		delete(cn.pending, r.head.ID)
		cn.pmu.Unlock()
		if ok && d.err == nil && r.head.RV == pkcs11.CKR_OK {
			f, _ := pc.op.function() // the client sent it
			_, ts := f.signature()
			for _, t := range ts {
				r.out = append(r.out, reflect.New(t).Elem())
				d.value(r.out[len(r.out)-1])
			}
		}
		if err := d.end(); err != nil {
			if ok {
				close(pc.ch)
			}
			cn.fail(fmt.Errorf("response: %w", err))
			return
		}
		if ok {
			pc.ch <- r
		}
	}
}

// fail marks the connection broken, closes it and fails every pending call.
func (cn *conn) fail(err error) {
	cn.pmu.Lock()
	if cn.broken == nil {
		cn.broken = err
	}
	pending := cn.pending
	cn.pending = map[uint64]pendingCall{}
	cn.pmu.Unlock()
	cn.nc.Close()
	for _, pc := range pending {
		close(pc.ch)
	}
}

// lost is the error of a call refused because the connection is already
// broken: not sent.
func (cn *conn) lost() error {
	cn.pmu.Lock()
	defer cn.pmu.Unlock()
	return fmt.Errorf("connection to the token server lost: %v: %w: %w", cn.broken, ErrNotSent, errDevice)
}

// call sends o's request with args (as the arguments of o's function, by
// their types) and waits for its results. A request the wire cannot carry
// (a nil attribute, a parameter that cannot cross, more than a frame)
// fails, with CKR_ARGUMENTS_BAD when nothing else says why, and is not
// sent.
func (c *Client) call(o op, args []any) ([]reflect.Value, error) {
	cn := c.cur.Load()
	if cn == nil {
		return nil, fmt.Errorf("%w: %w", ErrNotSent, errNotInitialized)
	}
	ch := make(chan reply, 1)
	cn.pmu.Lock()
	if cn.broken != nil {
		cn.pmu.Unlock()
		return nil, cn.lost()
	}
	cn.next++
	id := cn.next
	cn.pmu.Unlock()
	e := newFrame()
	e.uint(uint(id))
	e.uint(uint(o))
	for _, a := range args {
		e.value(reflect.ValueOf(a))
	}
	frame, err := e.frame()
	if e.err != nil || err != nil {
		clear(e.b) // the PIN, if any
		if e.err != nil {
			return nil, e.err
		}
		return nil, fmt.Errorf("token server at %s: request: %v: %w", c.sock, err, errArgumentsBad)
	}
	cn.pmu.Lock()
	if cn.broken != nil {
		cn.pmu.Unlock()
		return nil, cn.lost()
	}
	cn.pending[id] = pendingCall{o, ch}
	cn.pmu.Unlock()

	cn.wmu.Lock()
	n, err := cn.nc.Write(frame)
	cn.wmu.Unlock()
	clear(frame)
	if err != nil {
		cn.fail(err)
		if n == 0 {
			return nil, fmt.Errorf("token server at %s: %v: %w: %w", c.sock, err, ErrNotSent, errDevice)
		}
	}
	r, ok := <-ch
	if !ok {
		return nil, errDevice
	}
	if r.head.RV != pkcs11.CKR_OK {
		if r.head.Err != "" {
			return nil, fmt.Errorf("token server: %s: %w", r.head.Err, pkcs11.Error(r.head.RV))
		}
		return nil, pkcs11.Error(r.head.RV)
	}
	return r.out, nil
}

// none calls o with args (client_gen.go).
func (c *Client) none(o op, args ...any) error {
	_, err := c.call(o, args)
	return err
}

// result calls o with args and returns its one result (client_gen.go).
func result[T any](c *Client, o op, args ...any) (T, error) {
	out, err := c.call(o, args)
	if err != nil {
		var zero T
		return zero, err
	}
	return out[0].Interface().(T), nil
}

// CreateObjectNested creates an object whose template also holds attribute
// arrays (CKA_UNWRAP_TEMPLATE, …), one per entry of nested.
func (c *Client) CreateObjectNested(sh pkcs11.SessionHandle, tmpl []*pkcs11.Attribute, nested map[uint][]*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	var ns []nestedAttr
	for t, a := range nested {
		ns = append(ns, nestedAttr{Type: t, Attrs: a})
	}
	return result[pkcs11.ObjectHandle](c, opCreateObjectNested, sh, tmpl, ns)
}

// GetNestedAttribute reads the attribute array held by attribute typ of h.
func (c *Client) GetNestedAttribute(sh pkcs11.SessionHandle, h pkcs11.ObjectHandle, typ uint) ([]*pkcs11.Attribute, error) {
	return result[[]*pkcs11.Attribute](c, opGetNestedAttribute, sh, h, typ)
}

// GetAttributeValue reads the attributes of a (their values are ignored).
func (c *Client) GetAttributeValue(sh pkcs11.SessionHandle, o pkcs11.ObjectHandle, a []*pkcs11.Attribute) ([]*pkcs11.Attribute, error) {
	q := make([]*pkcs11.Attribute, len(a))
	for i, at := range a {
		q[i] = &pkcs11.Attribute{Type: at.Type}
	}
	got, err := result[[]*pkcs11.Attribute](c, opGetAttributeValue, sh, o, q)
	if err == nil && len(got) != len(a) {
		return nil, protocolError("GetAttributeValue answered %d attributes for %d", len(got), len(a))
	}
	return got, err
}

// FindObjects continues a search.
func (c *Client) FindObjects(sh pkcs11.SessionHandle, max int) ([]pkcs11.ObjectHandle, bool, error) {
	out, err := c.call(opFindObjects, []any{sh, max})
	if err != nil {
		return nil, false, err
	}
	return out[0].Interface().([]pkcs11.ObjectHandle), out[1].Bool(), nil
}

// GenerateKeyPair generates a key pair.
func (c *Client) GenerateKeyPair(sh pkcs11.SessionHandle, m []*pkcs11.Mechanism, public, private []*pkcs11.Attribute) (pkcs11.ObjectHandle, pkcs11.ObjectHandle, error) {
	out, err := c.call(opGenerateKeyPair, []any{sh, m, public, private})
	if err != nil {
		return 0, 0, err
	}
	return pkcs11.ObjectHandle(out[0].Uint()), pkcs11.ObjectHandle(out[1].Uint()), nil
}

// protocolError is a response that does not fit its request: the
// connection cannot be trusted; reported as CKR_DEVICE_ERROR.
func protocolError(format string, args ...any) error {
	return fmt.Errorf("token server protocol: "+format+": %w", append(args, errDevice)...)
}
