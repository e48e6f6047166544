package main

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// library is the initialized module: the slots it lists and the sessions
// the application has open. It speaks Go types only; abi.go converts to and
// from C. Every method is safe for concurrent use; calls on one session are
// serialised.
type library struct {
	ctx    context.Context // cancelled by C_Finalize: in-flight calls give up
	cancel context.CancelFunc
	log    *eventLog
	slots  []*slotEntry // in C_GetSlotList order
	byID   map[uint]*slotEntry
	closer func() error // releases the backends after the tokens are closed
	// callBound is how long a forked child's client waits for a call
	// (helper.go).
	callBound time.Duration

	// changes counts the calls that may change what a read-ahead read
	// (heldRead): C_SetAttributeValue, C_CopyObject, C_DestroyObject,
	// C_Login, C_Logout and a session's close, by any session.
	changes atomic.Uint64

	mu       sync.RWMutex
	sessions map[uint]*appSession
	next     uint
}

// slotEntry is one listed slot. The login is its token's (token.LoggedIn)
// and a session's validity its backend's (session.Check): the library
// keeps neither.
type slotEntry struct {
	id  uint
	tok token

	mu     sync.Mutex        // serialises C_Login and C_Logout; guards the mechanisms
	mechs  map[uint]struct{} // nil until read
	mechL  []uint            // mechs in the token's order
	mechOK bool
}

// appSession is one application session.
type appSession struct {
	handle uint
	slot   *slotEntry
	rw     bool
	be     session

	mu      sync.Mutex // one call at a time
	closed  bool
	finding bool
	found   []uint
	calls   uint64    // calls made on the session (opSession)
	lengths *heldRead // what the last length query read
	ahead   *heldRead // the last read-ahead (readAhead)
}

// heldRead is what a C_GetAttributeValue read, kept for the session's next
// call: each member call is a round trip through hsmserve. After a length
// query, the next call, if it reads the same attributes of the same
// object, is answered with it (the values then agree with the lengths the
// application was given). A read-ahead answers any of its attributes of
// the same object while the session makes no other call, the process
// changes no object nor its login (library.changes) and it is younger than
// aheadAge (DESIGN.md, "Reads ahead").
type heldRead struct {
	call  uint64
	obj   uint
	types []uint
	got   []slot.Attribute
	gen   uint64 // library.changes before the read
	at    time.Time
}

// aheadAge bounds how stale a read-ahead may be to a change made outside
// the process.
const aheadAge = 50 * time.Millisecond

// getAttributes reads types of obj for C_GetAttributeValue; lengths says
// the application asked for some lengths (see heldRead).
func (l *library) getAttributes(s *appSession, obj uint, types []uint, lengths bool) ([]slot.Attribute, error) {
	last, a := s.lengths, s.ahead
	s.lengths, s.ahead = nil, nil
	if a != nil && a.call+1 == s.calls && a.obj == obj && a.gen == l.changes.Load() && time.Since(a.at) < aheadAge {
		a.call, s.ahead = s.calls, a
	} else {
		a = nil
	}
	if last != nil && last.call+1 == s.calls && last.obj == obj && slices.Equal(last.types, types) {
		return last.got, nil
	}
	got, ok := pick(a, types)
	var err error
	if !ok {
		got, err = l.readAhead(s, obj, types)
	}
	if err == nil && lengths {
		s.lengths = &heldRead{call: s.calls, obj: obj, types: types, got: got}
	}
	return got, err
}

// readAhead reads types of obj. When they are all among what listing
// tools read of obj's class (listed), it reads all of those in the one
// member call and keeps them in s.ahead for the reads that follow.
func (l *library) readAhead(s *appSession, obj uint, types []uint) ([]slot.Attribute, error) {
	be, ok := s.be.(identified)
	if !ok {
		return s.be.GetAttributes(l.ctx, obj, types)
	}
	id, ok := be.identity(obj)
	set := listed(id)
	if !ok || slices.ContainsFunc(types, func(t uint) bool { return !slices.Contains(set, t) }) {
		return s.be.GetAttributes(l.ctx, obj, types)
	}
	a := &heldRead{call: s.calls, obj: obj, types: set, gen: l.changes.Load(), at: time.Now()}
	var err error
	if a.got, err = s.be.GetAttributes(l.ctx, obj, set); err != nil {
		// Failed as a whole: the application's read alone answers.
		return s.be.GetAttributes(l.ctx, obj, types)
	}
	s.ahead = a
	got, _ := pick(a, types)
	return got, nil
}

// pick answers types from a, if a holds them all.
func pick(a *heldRead, types []uint) ([]slot.Attribute, bool) {
	if a == nil {
		return nil, false
	}
	out := make([]slot.Attribute, len(types))
	for i, t := range types {
		j := slices.Index(a.types, t)
		if j < 0 {
			return nil, false
		}
		out[i] = a.got[j]
	}
	return out, true
}

// identified is a session whose engine knows an object's identity
// without a member call (a group's).
type identified interface {
	identity(h uint) (object.Identity, bool)
}

// listed is what pkcs11-tool -O and p11tool --list-all read of an object
// of id's class, one attribute a call, that a member alone answers
// (pkg/group answers the class, key type, CKA_TOKEN and a key's
// protection attributes itself) and that is not secret: never CKA_VALUE
// nor a private key's components. What a token may refuse for some
// objects of the class is left out (CKA_UNIQUE_ID, a DES key's
// CKA_VALUE_LEN): pkg/slot reads each attribute of a read a token refused
// in part on its own.
func listed(id object.Identity) []uint {
	common := []uint{pkcs11.CKA_LABEL, pkcs11.CKA_ID, pkcs11.CKA_PRIVATE}
	switch id.Class {
	case pkcs11.CKO_SECRET_KEY:
		set := append(common, pkcs11.CKA_ENCRYPT, pkcs11.CKA_DECRYPT, pkcs11.CKA_SIGN, pkcs11.CKA_VERIFY,
			pkcs11.CKA_WRAP, pkcs11.CKA_UNWRAP, pkcs11.CKA_DERIVE, pkcs11.CKA_SENSITIVE, pkcs11.CKA_TRUSTED)
		if id.KeyType == pkcs11.CKK_AES || id.KeyType == pkcs11.CKK_GENERIC_SECRET {
			set = append(set, pkcs11.CKA_VALUE_LEN)
		}
		return set
	case pkcs11.CKO_PRIVATE_KEY:
		return append(common, pkcs11.CKA_DECRYPT, pkcs11.CKA_SIGN, pkcs11.CKA_UNWRAP, pkcs11.CKA_DERIVE,
			pkcs11.CKA_ALWAYS_AUTHENTICATE, pkcs11.CKA_SENSITIVE, pkcs11.CKA_ALLOWED_MECHANISMS)
	case pkcs11.CKO_PUBLIC_KEY:
		set := append(common, pkcs11.CKA_ENCRYPT, pkcs11.CKA_VERIFY, pkcs11.CKA_VERIFY_RECOVER, pkcs11.CKA_WRAP,
			pkcs11.CKA_DERIVE, pkcs11.CKA_TRUSTED)
		switch id.KeyType {
		case pkcs11.CKK_RSA:
			set = append(set, pkcs11.CKA_MODULUS_BITS, pkcs11.CKA_MODULUS, pkcs11.CKA_PUBLIC_EXPONENT)
		case pkcs11.CKK_EC:
			set = append(set, pkcs11.CKA_EC_POINT, pkcs11.CKA_EC_PARAMS)
		}
		return set
	case pkcs11.CKO_CERTIFICATE:
		return append(common, pkcs11.CKA_CERTIFICATE_TYPE, pkcs11.CKA_SUBJECT, pkcs11.CKA_SERIAL_NUMBER,
			pkcs11.CKA_TRUSTED, pkcs11.CKA_CERTIFICATE_CATEGORY)
	case pkcs11.CKO_DATA:
		return []uint{pkcs11.CKA_LABEL, pkcs11.CKA_PRIVATE, pkcs11.CKA_APPLICATION, pkcs11.CKA_OBJECT_ID, pkcs11.CKA_MODIFIABLE}
	}
	return nil
}

// ckErr is an error with a CKR code; slot.CodeOf reads it.
func ckErr(code uint) error { return pkcs11.Error(code) }

// getSlotList returns the IDs of the listed slots (with a token only, when
// present is set).
func (l *library) getSlotList(present bool) []uint {
	ids := make([]uint, 0, len(l.slots))
	for _, s := range l.slots {
		if present && !s.tok.SlotInfo().Present {
			continue
		}
		ids = append(ids, s.id)
	}
	return ids
}

func (l *library) slot(id uint) (*slotEntry, error) {
	s, ok := l.byID[id]
	if !ok {
		return nil, ckErr(pkcs11.CKR_SLOT_ID_INVALID)
	}
	return s, nil
}

// token returns a slot's token, or CKR_TOKEN_NOT_PRESENT.
func (l *library) token(id uint) (*slotEntry, error) {
	s, err := l.slot(id)
	if err != nil {
		return nil, err
	}
	if !s.tok.SlotInfo().Present {
		return nil, ckErr(pkcs11.CKR_TOKEN_NOT_PRESENT)
	}
	return s, nil
}

// mechanisms returns the token's mechanisms as a set and in the token's
// order, read once.
func (s *slotEntry) mechanisms(ctx context.Context) (map[uint]struct{}, []uint, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mechOK {
		return s.mechs, s.mechL, nil
	}
	list, err := s.tok.Mechanisms(ctx)
	if err != nil {
		return nil, nil, err
	}
	s.mechs = make(map[uint]struct{}, len(list))
	for _, m := range list {
		s.mechs[m] = struct{}{}
	}
	s.mechL = list
	s.mechOK = true
	return s.mechs, s.mechL, nil
}

// mechanismList lists the token's mechanisms in its own order.
func (l *library) mechanismList(id uint) ([]uint, error) {
	s, err := l.token(id)
	if err != nil {
		return nil, err
	}
	_, list, err := s.mechanisms(l.ctx)
	if err != nil {
		return nil, err
	}
	return slices.Clone(list), nil
}

func (l *library) openSession(id uint, rw bool) (uint, error) {
	s, err := l.token(id)
	if err != nil {
		return 0, err
	}
	if ut, ok := s.tok.LoggedIn(); ok && ut == pkcs11.CKU_SO && !rw {
		return 0, ckErr(pkcs11.CKR_SESSION_READ_WRITE_SO_EXISTS)
	}
	be, err := s.tok.OpenSession(l.ctx)
	if err != nil {
		return 0, err
	}
	l.mu.Lock()
	l.next++
	h := l.next
	l.sessions[h] = &appSession{handle: h, slot: s, rw: rw, be: be}
	l.mu.Unlock()
	return h, nil
}

// session returns an open session, locked; the caller unlocks it.
func (l *library) session(h uint) (*appSession, error) {
	s, err := l.opSession(h)
	if err != nil {
		return nil, err
	}
	if err := s.be.Check(); err != nil {
		// The engine lost it (every member of the group failed in
		// activeBasic): the application's handle is gone too.
		s.mu.Unlock()
		l.forget(h, s)
		return nil, ckErr(pkcs11.CKR_SESSION_HANDLE_INVALID)
	}
	return s, nil
}

// opSession is session for an operation's call, which the engine's session
// refuses by itself once lost (CKR_SESSION_HANDLE_INVALID): the
// operation's one look at whether the session is lost is the engine's.
func (l *library) opSession(h uint) (*appSession, error) {
	l.mu.RLock()
	s, ok := l.sessions[h]
	l.mu.RUnlock()
	if !ok {
		return nil, ckErr(pkcs11.CKR_SESSION_HANDLE_INVALID)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ckErr(pkcs11.CKR_SESSION_HANDLE_INVALID)
	}
	s.calls++
	return s, nil
}

// forget drops session s (handle h), which its backend lost, without
// logging out: the engine forgot the login with it.
func (l *library) forget(h uint, s *appSession) {
	l.mu.Lock()
	if l.sessions[h] == s {
		delete(l.sessions, h)
	}
	l.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	if err := s.be.Close(); err != nil {
		l.log.debug("closing a session lost with its group", "slot", s.slot.id, "err", err)
	}
}

// live counts the sessions of e that are open and not lost, and the
// read-only ones among them.
func (l *library) live(e *slotEntry) (all, ro int) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	for _, s := range l.sessions {
		if s.slot == e && s.be.Check() == nil {
			all++
			if !s.rw {
				ro++
			}
		}
	}
	return all, ro
}

func (l *library) closeSession(h uint) error {
	l.mu.Lock()
	s, ok := l.sessions[h]
	delete(l.sessions, h)
	l.mu.Unlock()
	if !ok {
		return ckErr(pkcs11.CKR_SESSION_HANDLE_INVALID)
	}
	return l.endSession(s)
}

// endSession closes a session taken out of the table; closing the last
// session of a token logs the application out of it, as the spec says.
func (l *library) endSession(s *appSession) error {
	defer l.changes.Add(1)
	s.mu.Lock()
	s.closed = true
	err := s.be.Close()
	s.mu.Unlock()
	e := s.slot
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, in := e.tok.LoggedIn(); in {
		if n, _ := l.live(e); n == 0 {
			if lerr := e.tok.Logout(l.ctx); lerr != nil {
				l.log.debug("logout after the last session closed", "slot", e.id, "err", lerr)
			}
		}
	}
	return err
}

func (l *library) closeAllSessions(id uint) error {
	if _, err := l.slot(id); err != nil {
		return err
	}
	l.mu.Lock()
	var mine []*appSession
	for h, s := range l.sessions {
		if s.slot.id == id {
			mine = append(mine, s)
			delete(l.sessions, h)
		}
	}
	l.mu.Unlock()
	var first error
	for _, s := range mine {
		if err := l.endSession(s); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// sessionInfo returns the slot, the state (CKS_*) and the flags of a session.
func (l *library) sessionInfo(h uint) (slotID, state, flags uint, err error) {
	s, err := l.session(h)
	if err != nil {
		return 0, 0, 0, err
	}
	defer s.mu.Unlock()
	user, in := s.slot.tok.LoggedIn()
	flags = pkcs11.CKF_SERIAL_SESSION
	switch {
	case in && user == pkcs11.CKU_SO:
		state = pkcs11.CKS_RW_SO_FUNCTIONS
	case in && s.rw:
		state = pkcs11.CKS_RW_USER_FUNCTIONS
	case in:
		state = pkcs11.CKS_RO_USER_FUNCTIONS
	case s.rw:
		state = pkcs11.CKS_RW_PUBLIC_SESSION
	default:
		state = pkcs11.CKS_RO_PUBLIC_SESSION
	}
	if s.rw {
		flags |= pkcs11.CKF_RW_SESSION
	}
	return s.slot.id, state, flags, nil
}

func (l *library) login(h, userType uint, pin secret.PIN) error {
	defer pin.Zero()
	s, err := l.session(h)
	if err != nil {
		return err
	}
	e := s.slot
	s.mu.Unlock()
	if userType != pkcs11.CKU_USER && userType != pkcs11.CKU_SO {
		// CKU_CONTEXT_SPECIFIC would need the operation's own member
		// session; no key made through a group asks for it.
		return ckErr(pkcs11.CKR_USER_TYPE_INVALID)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if ut, in := e.tok.LoggedIn(); in {
		if ut == userType {
			return ckErr(pkcs11.CKR_USER_ALREADY_LOGGED_IN)
		}
		return ckErr(pkcs11.CKR_USER_ANOTHER_ALREADY_LOGGED_IN)
	}
	if _, ro := l.live(e); userType == pkcs11.CKU_SO && ro > 0 {
		return ckErr(pkcs11.CKR_SESSION_READ_ONLY_EXISTS)
	}
	defer l.changes.Add(1)
	return e.tok.Login(l.ctx, userType, pin)
}

func (l *library) logout(h uint) error {
	s, err := l.session(h)
	if err != nil {
		return err
	}
	e := s.slot
	s.mu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, in := e.tok.LoggedIn(); !in {
		return ckErr(pkcs11.CKR_USER_NOT_LOGGED_IN)
	}
	defer l.changes.Add(1)
	return e.tok.Logout(l.ctx)
}

// opInit starts an operation (C_SignInit …); a nil mechanism ends the
// active one. The session's backend (pkg/group) keeps the operation.
func (l *library) opInit(h uint, kind group.OpKind, m *pkcs11.Mechanism, key uint) error {
	s, err := l.opSession(h)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	if m == nil {
		return s.be.Cancel(kind)
	}
	mechs, _, err := s.slot.mechanisms(l.ctx)
	if err != nil {
		return err
	}
	if _, ok := mechs[m.Mechanism]; !ok {
		if withheld, err := s.slot.tok.Withholds(l.ctx, m.Mechanism); err != nil || withheld {
			return ckErr(pkcs11.CKR_MECHANISM_INVALID)
		}
	}
	if s.finding {
		return ckErr(pkcs11.CKR_OPERATION_ACTIVE) // one operation per session, a search included
	}
	return s.be.Init(l.ctx, kind, m, key)
}

// findInit, findNext and findFinal keep one search per session; the
// backend answers the whole search at once.
func (l *library) findInit(h uint, tmpl []*pkcs11.Attribute) error {
	s, err := l.session(h)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	if s.finding || s.be.Active() {
		return ckErr(pkcs11.CKR_OPERATION_ACTIVE)
	}
	found, err := s.be.FindObjects(l.ctx, tmpl)
	if err != nil {
		return err
	}
	s.finding, s.found = true, found
	return nil
}

func (l *library) findNext(h uint, max int) ([]uint, error) {
	s, err := l.session(h)
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if !s.finding {
		return nil, ckErr(pkcs11.CKR_OPERATION_NOT_INITIALIZED)
	}
	n := min(max, len(s.found))
	out := s.found[:n:n]
	s.found = s.found[n:]
	return out, nil
}

func (l *library) findFinal(h uint) error {
	s, err := l.session(h)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	if !s.finding {
		return ckErr(pkcs11.CKR_OPERATION_NOT_INITIALIZED)
	}
	s.finding, s.found = false, nil
	return nil
}

// wantsToken reports whether a template makes a token object.
func wantsToken(tmpl []*pkcs11.Attribute) bool {
	for _, a := range tmpl {
		if a.Type == pkcs11.CKA_TOKEN {
			return len(a.Value) > 0 && a.Value[0] != 0
		}
	}
	return false
}

// writable refuses to change token objects from a read-only session.
func (l *library) writable(s *appSession, tmpl []*pkcs11.Attribute) error {
	if !s.rw && wantsToken(tmpl) {
		return ckErr(pkcs11.CKR_SESSION_READ_ONLY)
	}
	return nil
}

// writableObject refuses to change or destroy a token object from a
// read-only session.
func (l *library) writableObject(s *appSession, h uint) error {
	if s.rw {
		return nil
	}
	attrs, err := s.be.GetAttributes(l.ctx, h, []uint{pkcs11.CKA_TOKEN})
	if err != nil {
		return err
	}
	if len(attrs) == 1 && attrs[0].Status == pkcs11.CKR_OK && len(attrs[0].Value) > 0 && attrs[0].Value[0] != 0 {
		return ckErr(pkcs11.CKR_SESSION_READ_ONLY)
	}
	return nil
}

// withSession runs fn on a locked session.
func (l *library) withSession(h uint, fn func(s *appSession) error) error {
	s, err := l.session(h)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	return fn(s)
}

// changing is withSession for a call that may change what a read-ahead
// read (library.changes).
func (l *library) changing(h uint, fn func(s *appSession) error) error {
	defer l.changes.Add(1)
	return l.withSession(h, fn)
}

// finalize closes every session and token and the backends.
func (l *library) finalize() error {
	l.cancel()
	l.mu.Lock()
	all := l.sessions
	l.sessions = map[uint]*appSession{}
	l.mu.Unlock()
	for _, s := range all {
		s.mu.Lock()
		s.closed = true
		_ = s.be.Close() // the module is going away; the backends close next
		s.mu.Unlock()
	}
	var first error
	for _, e := range l.slots {
		if err := e.tok.Close(); err != nil && first == nil {
			first = err
		}
	}
	if l.closer != nil {
		if err := l.closer(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
