package remote

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/pkcs11"
)

// DialTimeout bounds connecting to the server and the protocol handshake
// in Initialize.
const DialTimeout = 10 * time.Second

// Client is a PKCS#11 context on a token served by another process: the
// method set of miekg's *pkcs11.Ctx that pkg/slot uses, plus
// CreateObjectNested and GetNestedAttribute. Initialize connects, Finalize
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
	pending map[uint64]chan *response
	next    uint64
	broken  error // set once: every later call fails
}

// handshake sends the hello and reads the welcome, within DialTimeout.
func handshake(nc net.Conn) (*conn, error) {
	if err := nc.SetDeadline(time.Now().Add(DialTimeout)); err != nil {
		return nil, err
	}
	cn := &conn{nc: nc, r: bufio.NewReader(nc), pending: make(map[uint64]chan *response)}
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
// response that breaks a bound ends the connection.
func (cn *conn) read() {
	for {
		b, err := readFrame(cn.r)
		if err != nil {
			cn.fail(err)
			return
		}
		r := new(response)
		d := &decoder{b: b}
		r.decode(d)
		if err := d.end(); err != nil {
			cn.fail(fmt.Errorf("response: %w", err))
			return
		}
		cn.pmu.Lock()
		ch, ok := cn.pending[r.ID]
		delete(cn.pending, r.ID)
		cn.pmu.Unlock()
		if ok {
			ch <- r
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
	cn.pending = map[uint64]chan *response{}
	cn.pmu.Unlock()
	cn.nc.Close()
	for _, ch := range pending {
		close(ch)
	}
}

// lost is the error of a call refused because the connection is already
// broken: not sent.
func (cn *conn) lost() error {
	cn.pmu.Lock()
	defer cn.pmu.Unlock()
	return fmt.Errorf("connection to the token server lost: %v: %w: %w", cn.broken, ErrNotSent, errDevice)
}

// call sends req and waits for its response. A request too big for a
// frame fails with CKR_ARGUMENTS_BAD and is not sent.
func (c *Client) call(req *request) (*response, error) {
	defer clear(req.PIN)
	cn := c.cur.Load()
	if cn == nil {
		return nil, fmt.Errorf("%w: %w", ErrNotSent, errNotInitialized)
	}
	if !encodable(req) {
		return nil, fmt.Errorf("a nil attribute cannot be sent: %w", errArgumentsBad)
	}
	if req.Mech != nil && req.Mech.refused != nil {
		return nil, req.Mech.refused
	}
	ch := make(chan *response, 1)
	cn.pmu.Lock()
	if cn.broken != nil {
		cn.pmu.Unlock()
		return nil, cn.lost()
	}
	cn.next++
	req.ID = cn.next
	cn.pmu.Unlock()
	e := newFrame()
	req.encode(e)
	frame, err := e.frame()
	if err != nil {
		clear(e.b) // the PIN, if any
		return nil, fmt.Errorf("token server at %s: request: %v: %w", c.sock, err, errArgumentsBad)
	}
	cn.pmu.Lock()
	if cn.broken != nil {
		cn.pmu.Unlock()
		return nil, cn.lost()
	}
	cn.pending[req.ID] = ch
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
	if r.RV != pkcs11.CKR_OK {
		if r.Err != "" {
			return nil, fmt.Errorf("token server: %s: %w", r.Err, pkcs11.Error(r.RV))
		}
		return nil, pkcs11.Error(r.RV)
	}
	return r, nil
}

// GetInfo returns the served module's information.
func (c *Client) GetInfo() (pkcs11.Info, error) {
	r, err := c.call(&request{Op: opGetInfo})
	if err != nil || r.Info == nil {
		return pkcs11.Info{}, orProtocol(err)
	}
	return *r.Info, nil
}

// GetSlotList lists the served slots.
func (c *Client) GetSlotList(tokenPresent bool) ([]uint, error) {
	n := uint(0)
	if tokenPresent {
		n = 1
	}
	r, err := c.call(&request{Op: opGetSlotList, N: n})
	if err != nil {
		return nil, err
	}
	return r.Handles, nil
}

// GetSlotInfo describes a slot.
func (c *Client) GetSlotInfo(slotID uint) (pkcs11.SlotInfo, error) {
	r, err := c.call(&request{Op: opGetSlotInfo, Slot: slotID})
	if err != nil || r.SlotInfo == nil {
		return pkcs11.SlotInfo{}, orProtocol(err)
	}
	return *r.SlotInfo, nil
}

// GetTokenInfo describes a token.
func (c *Client) GetTokenInfo(slotID uint) (pkcs11.TokenInfo, error) {
	r, err := c.call(&request{Op: opGetTokenInfo, Slot: slotID})
	if err != nil || r.TokenInfo == nil {
		return pkcs11.TokenInfo{}, orProtocol(err)
	}
	return *r.TokenInfo, nil
}

// GetMechanismList lists a token's mechanisms.
func (c *Client) GetMechanismList(slotID uint) ([]*pkcs11.Mechanism, error) {
	r, err := c.call(&request{Op: opGetMechanismList, Slot: slotID})
	if err != nil {
		return nil, err
	}
	out := make([]*pkcs11.Mechanism, len(r.Handles))
	for i, t := range r.Handles {
		out[i] = pkcs11.NewMechanism(t, nil)
	}
	return out, nil
}

// GetMechanismInfo describes one mechanism of a token.
func (c *Client) GetMechanismInfo(slotID uint, m []*pkcs11.Mechanism) (pkcs11.MechanismInfo, error) {
	r, err := c.call(&request{Op: opGetMechanismInfo, Slot: slotID, Mech: mechOut(m)})
	if err != nil || r.MechInfo == nil {
		return pkcs11.MechanismInfo{}, orProtocol(err)
	}
	return *r.MechInfo, nil
}

// OpenSession opens a session.
func (c *Client) OpenSession(slotID uint, flags uint) (pkcs11.SessionHandle, error) {
	r, err := c.call(&request{Op: opOpenSession, Slot: slotID, N: flags})
	if err != nil {
		return 0, err
	}
	return pkcs11.SessionHandle(r.Handle), nil
}

// CloseSession closes a session.
func (c *Client) CloseSession(sh pkcs11.SessionHandle) error {
	_, err := c.call(&request{Op: opCloseSession, Session: uint(sh)})
	return err
}

// GetSessionInfo describes a session.
func (c *Client) GetSessionInfo(sh pkcs11.SessionHandle) (pkcs11.SessionInfo, error) {
	r, err := c.call(&request{Op: opGetSessionInfo, Session: uint(sh)})
	if err != nil || r.SessionInfo == nil {
		return pkcs11.SessionInfo{}, orProtocol(err)
	}
	return *r.SessionInfo, nil
}

// Login logs a user in; the PIN travels only over the socket.
func (c *Client) Login(sh pkcs11.SessionHandle, userType uint, pin string) error {
	_, err := c.call(&request{Op: opLogin, Session: uint(sh), N: userType, PIN: []byte(pin)})
	return err
}

// Logout logs out.
func (c *Client) Logout(sh pkcs11.SessionHandle) error {
	_, err := c.call(&request{Op: opLogout, Session: uint(sh)})
	return err
}

// CreateObject creates an object.
func (c *Client) CreateObject(sh pkcs11.SessionHandle, temp []*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	return c.handle(&request{Op: opCreateObject, Session: uint(sh), Attrs: temp})
}

// CreateObjectNested creates an object whose template also holds attribute
// arrays (CKA_UNWRAP_TEMPLATE, …), one per entry of nested.
func (c *Client) CreateObjectNested(sh pkcs11.SessionHandle, tmpl []*pkcs11.Attribute, nested map[uint][]*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	req := &request{Op: opCreateObjectNested, Session: uint(sh), Attrs: tmpl}
	for t, a := range nested {
		req.Nested = append(req.Nested, nestedAttr{Type: t, Attrs: a})
	}
	return c.handle(req)
}

// CopyObject copies an object.
func (c *Client) CopyObject(sh pkcs11.SessionHandle, o pkcs11.ObjectHandle, temp []*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	return c.handle(&request{Op: opCopyObject, Session: uint(sh), Object: uint(o), Attrs: temp})
}

// DestroyObject destroys an object.
func (c *Client) DestroyObject(sh pkcs11.SessionHandle, oh pkcs11.ObjectHandle) error {
	_, err := c.call(&request{Op: opDestroyObject, Session: uint(sh), Object: uint(oh)})
	return err
}

// GetAttributeValue reads the attributes of a (their values are ignored).
func (c *Client) GetAttributeValue(sh pkcs11.SessionHandle, o pkcs11.ObjectHandle, a []*pkcs11.Attribute) ([]*pkcs11.Attribute, error) {
	q := make([]*pkcs11.Attribute, len(a))
	for i, at := range a {
		q[i] = &pkcs11.Attribute{Type: at.Type}
	}
	r, err := c.call(&request{Op: opGetAttributeValue, Session: uint(sh), Object: uint(o), Attrs: q})
	if err != nil {
		return nil, err
	}
	if len(r.Attrs) != len(a) {
		return nil, protocolError("GetAttributeValue answered %d attributes for %d", len(r.Attrs), len(a))
	}
	return r.Attrs, nil
}

// GetNestedAttribute reads the attribute array held by attribute typ of h.
func (c *Client) GetNestedAttribute(sh pkcs11.SessionHandle, h pkcs11.ObjectHandle, typ uint) ([]*pkcs11.Attribute, error) {
	r, err := c.call(&request{Op: opGetNestedAttribute, Session: uint(sh), Object: uint(h), N: typ})
	if err != nil {
		return nil, err
	}
	return r.Attrs, nil
}

// SetAttributeValue sets attributes of an object.
func (c *Client) SetAttributeValue(sh pkcs11.SessionHandle, o pkcs11.ObjectHandle, a []*pkcs11.Attribute) error {
	_, err := c.call(&request{Op: opSetAttributeValue, Session: uint(sh), Object: uint(o), Attrs: a})
	return err
}

// FindObjectsInit starts a search.
func (c *Client) FindObjectsInit(sh pkcs11.SessionHandle, temp []*pkcs11.Attribute) error {
	_, err := c.call(&request{Op: opFindObjectsInit, Session: uint(sh), Attrs: temp})
	return err
}

// FindObjects continues a search.
func (c *Client) FindObjects(sh pkcs11.SessionHandle, max int) ([]pkcs11.ObjectHandle, bool, error) {
	if max < 0 {
		return nil, false, pkcs11.Error(pkcs11.CKR_ARGUMENTS_BAD)
	}
	r, err := c.call(&request{Op: opFindObjects, Session: uint(sh), N: uint(max)})
	if err != nil {
		return nil, false, err
	}
	out := make([]pkcs11.ObjectHandle, len(r.Handles))
	for i, h := range r.Handles {
		out[i] = pkcs11.ObjectHandle(h)
	}
	return out, r.More, nil
}

// FindObjectsFinal ends a search.
func (c *Client) FindObjectsFinal(sh pkcs11.SessionHandle) error {
	_, err := c.call(&request{Op: opFindObjectsFinal, Session: uint(sh)})
	return err
}

// GenerateKey generates a secret key.
func (c *Client) GenerateKey(sh pkcs11.SessionHandle, m []*pkcs11.Mechanism, temp []*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	return c.handle(&request{Op: opGenerateKey, Session: uint(sh), Mech: mechOut(m), Attrs: temp})
}

// GenerateKeyPair generates a key pair.
func (c *Client) GenerateKeyPair(sh pkcs11.SessionHandle, m []*pkcs11.Mechanism, public, private []*pkcs11.Attribute) (pkcs11.ObjectHandle, pkcs11.ObjectHandle, error) {
	r, err := c.call(&request{Op: opGenerateKeyPair, Session: uint(sh), Mech: mechOut(m), Attrs: public, Attrs2: private})
	if err != nil {
		return 0, 0, err
	}
	return pkcs11.ObjectHandle(r.Handle), pkcs11.ObjectHandle(r.Handle2), nil
}

// WrapKey wraps key under wrappingkey.
func (c *Client) WrapKey(sh pkcs11.SessionHandle, m []*pkcs11.Mechanism, wrappingkey, key pkcs11.ObjectHandle) ([]byte, error) {
	return c.data(&request{Op: opWrapKey, Session: uint(sh), Mech: mechOut(m), Object: uint(wrappingkey), Object2: uint(key)})
}

// UnwrapKey unwraps a key.
func (c *Client) UnwrapKey(sh pkcs11.SessionHandle, m []*pkcs11.Mechanism, unwrappingkey pkcs11.ObjectHandle, wrappedkey []byte, a []*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	return c.handle(&request{Op: opUnwrapKey, Session: uint(sh), Mech: mechOut(m), Object: uint(unwrappingkey), Data: wrappedkey, Attrs: a})
}

// DeriveKey derives a key.
func (c *Client) DeriveKey(sh pkcs11.SessionHandle, m []*pkcs11.Mechanism, basekey pkcs11.ObjectHandle, a []*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	return c.handle(&request{Op: opDeriveKey, Session: uint(sh), Mech: mechOut(m), Object: uint(basekey), Attrs: a})
}

// GenerateRandom returns length random bytes.
func (c *Client) GenerateRandom(sh pkcs11.SessionHandle, length int) ([]byte, error) {
	if length < 0 {
		return nil, pkcs11.Error(pkcs11.CKR_ARGUMENTS_BAD)
	}
	return c.data(&request{Op: opGenerateRandom, Session: uint(sh), N: uint(length)})
}

func (c *Client) init(o op, sh pkcs11.SessionHandle, m []*pkcs11.Mechanism, key pkcs11.ObjectHandle) error {
	_, err := c.call(&request{Op: o, Session: uint(sh), Mech: mechOut(m), Object: uint(key)})
	return err
}

func (c *Client) none(o op, sh pkcs11.SessionHandle, data, data2 []byte) error {
	_, err := c.call(&request{Op: o, Session: uint(sh), Data: data, Data2: data2})
	return err
}

func (c *Client) data(req *request) ([]byte, error) {
	r, err := c.call(req)
	if err != nil {
		return nil, err
	}
	return r.Data, nil
}

func (c *Client) handle(req *request) (pkcs11.ObjectHandle, error) {
	r, err := c.call(req)
	if err != nil {
		return 0, err
	}
	return pkcs11.ObjectHandle(r.Handle), nil
}

func (c *Client) sdata(o op, sh pkcs11.SessionHandle, data []byte) ([]byte, error) {
	return c.data(&request{Op: o, Session: uint(sh), Data: data})
}

// SignInit starts a signature.
func (c *Client) SignInit(sh pkcs11.SessionHandle, m []*pkcs11.Mechanism, o pkcs11.ObjectHandle) error {
	return c.init(opSignInit, sh, m, o)
}

// Sign signs in one part.
func (c *Client) Sign(sh pkcs11.SessionHandle, message []byte) ([]byte, error) {
	return c.sdata(opSign, sh, message)
}

// SignUpdate continues a signature.
func (c *Client) SignUpdate(sh pkcs11.SessionHandle, message []byte) error {
	return c.none(opSignUpdate, sh, message, nil)
}

// SignFinal finishes a signature.
func (c *Client) SignFinal(sh pkcs11.SessionHandle) ([]byte, error) {
	return c.sdata(opSignFinal, sh, nil)
}

// VerifyInit starts a verification.
func (c *Client) VerifyInit(sh pkcs11.SessionHandle, m []*pkcs11.Mechanism, key pkcs11.ObjectHandle) error {
	return c.init(opVerifyInit, sh, m, key)
}

// Verify verifies in one part.
func (c *Client) Verify(sh pkcs11.SessionHandle, data []byte, signature []byte) error {
	return c.none(opVerify, sh, data, signature)
}

// VerifyUpdate continues a verification.
func (c *Client) VerifyUpdate(sh pkcs11.SessionHandle, part []byte) error {
	return c.none(opVerifyUpdate, sh, part, nil)
}

// VerifyFinal finishes a verification.
func (c *Client) VerifyFinal(sh pkcs11.SessionHandle, signature []byte) error {
	return c.none(opVerifyFinal, sh, nil, signature)
}

// EncryptInit starts an encryption.
func (c *Client) EncryptInit(sh pkcs11.SessionHandle, m []*pkcs11.Mechanism, o pkcs11.ObjectHandle) error {
	return c.init(opEncryptInit, sh, m, o)
}

// Encrypt encrypts in one part.
func (c *Client) Encrypt(sh pkcs11.SessionHandle, message []byte) ([]byte, error) {
	return c.sdata(opEncrypt, sh, message)
}

// EncryptUpdate continues an encryption.
func (c *Client) EncryptUpdate(sh pkcs11.SessionHandle, plain []byte) ([]byte, error) {
	return c.sdata(opEncryptUpdate, sh, plain)
}

// EncryptFinal finishes an encryption.
func (c *Client) EncryptFinal(sh pkcs11.SessionHandle) ([]byte, error) {
	return c.sdata(opEncryptFinal, sh, nil)
}

// DecryptInit starts a decryption.
func (c *Client) DecryptInit(sh pkcs11.SessionHandle, m []*pkcs11.Mechanism, o pkcs11.ObjectHandle) error {
	return c.init(opDecryptInit, sh, m, o)
}

// Decrypt decrypts in one part.
func (c *Client) Decrypt(sh pkcs11.SessionHandle, cipher []byte) ([]byte, error) {
	return c.sdata(opDecrypt, sh, cipher)
}

// DecryptUpdate continues a decryption.
func (c *Client) DecryptUpdate(sh pkcs11.SessionHandle, cipher []byte) ([]byte, error) {
	return c.sdata(opDecryptUpdate, sh, cipher)
}

// DecryptFinal finishes a decryption.
func (c *Client) DecryptFinal(sh pkcs11.SessionHandle) ([]byte, error) {
	return c.sdata(opDecryptFinal, sh, nil)
}

// DigestInit starts a digest.
func (c *Client) DigestInit(sh pkcs11.SessionHandle, m []*pkcs11.Mechanism) error {
	return c.init(opDigestInit, sh, m, 0)
}

// Digest digests in one part.
func (c *Client) Digest(sh pkcs11.SessionHandle, message []byte) ([]byte, error) {
	return c.sdata(opDigest, sh, message)
}

// DigestUpdate continues a digest.
func (c *Client) DigestUpdate(sh pkcs11.SessionHandle, message []byte) error {
	return c.none(opDigestUpdate, sh, message, nil)
}

// DigestFinal finishes a digest.
func (c *Client) DigestFinal(sh pkcs11.SessionHandle) ([]byte, error) {
	return c.sdata(opDigestFinal, sh, nil)
}

// DigestKey feeds the value of key to the digest.
func (c *Client) DigestKey(sh pkcs11.SessionHandle, key pkcs11.ObjectHandle) error {
	_, err := c.call(&request{Op: opDigestKey, Session: uint(sh), Object: uint(key)})
	return err
}

// protocolError is a response that does not fit its request: the
// connection cannot be trusted; reported as CKR_DEVICE_ERROR.
func protocolError(format string, args ...any) error {
	return fmt.Errorf("token server protocol: "+format+": %w", append(args, errDevice)...)
}

// orProtocol returns err, or a protocol error when a successful response
// lacks its payload.
func orProtocol(err error) error {
	if err != nil {
		return err
	}
	return protocolError("response without its result")
}

// encodable reports whether req has no nil attribute (the module would
// refuse one; the wire cannot carry it).
func encodable(req *request) bool {
	ok := func(as []*pkcs11.Attribute) bool {
		for _, a := range as {
			if a == nil {
				return false
			}
		}
		return true
	}
	if !ok(req.Attrs) || !ok(req.Attrs2) {
		return false
	}
	for _, n := range req.Nested {
		if !ok(n.Attrs) {
			return false
		}
	}
	return true
}
