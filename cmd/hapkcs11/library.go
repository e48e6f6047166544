package main

import (
	"bytes"
	"context"
	"slices"
	"sync"

	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
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

	mu       sync.RWMutex
	sessions map[uint]*appSession
	next     uint
}

// userNone marks a token nobody is logged in to.
const userNone = ^uint(0)

// slotEntry is one listed slot and the application's login state on it.
type slotEntry struct {
	id  uint
	tok token

	mu     sync.Mutex
	user   uint              // CKU_USER, CKU_SO or userNone
	nsess  int               // open sessions
	nro    int               // open read-only sessions
	keys   map[uint]keyInfo  // checked keys, dropped on any change
	mechs  map[uint]struct{} // nil until read
	mechL  []uint            // mechs in the token's order
	mechOK bool
	seen   uint64 // the token's Lost count that user reflects (sessionLoser)
}

// lost returns how many times the token lost every session and its login
// (a virtual slot whose group went down in activeBasic); 0 for others.
func (e *slotEntry) lost() uint64 {
	if lo, ok := e.tok.(sessionLoser); ok {
		return lo.Lost()
	}
	return 0
}

// current forgets the login when the token lost it since it was recorded.
// Called with e.mu held, before any read of user or keys.
func (e *slotEntry) current() {
	if n := e.lost(); n != e.seen {
		e.user = userNone
		e.keys = nil
		e.seen = n
	}
}

// keyInfo is what an *Init call checks of a key: that it is a key and may
// be used for the operation.
type keyInfo struct {
	class uint
	perm  [nOps]bool
}

// appSession is one application session.
type appSession struct {
	handle uint
	slot   *slotEntry
	rw     bool
	be     session
	epoch  uint64 // slot.lost() when opened: stale after the token lost its sessions
	// ctx is the library's context with the session's slot.Affinity: its
	// calls keep to the member sessions (and their threads) it used last.
	ctx context.Context

	mu      sync.Mutex // one call at a time
	closed  bool
	finding bool
	found   []uint
	ops     [nOps]*operation
}

// opKind names the cryptographic operation families, one active per
// session each.
type opKind int

const (
	opEncrypt opKind = iota
	opDecrypt
	opDigest
	opSign
	opVerify
	nOps
)

// opPerm is the key attribute that permits each operation.
var opPerm = [nOps]uint{pkcs11.CKA_ENCRYPT, pkcs11.CKA_DECRYPT, 0, pkcs11.CKA_SIGN, pkcs11.CKA_VERIFY}

// step says which call produced an output the application has not taken
// yet (it asked for the length, or its buffer was too small).
type step int

const (
	stepSingle step = iota + 1
	stepUpdate
	stepFinal
)

// operation is one active *Init…*Final operation. Until the first Update
// nothing reaches the backend, so a single-part call can go to any member;
// an Update pins it (multi = true).
type operation struct {
	mech  *pkcs11.Mechanism
	key   uint
	multi bool

	held     []byte // output computed but not yet delivered
	heldIn   []byte // the input it was computed from
	heldStep step   // the call that computed held; 0: nothing held (held may be empty)
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
	s.mu.Lock()
	s.current()
	so := s.user == pkcs11.CKU_SO
	s.mu.Unlock()
	epoch := s.lost()
	if so && !rw {
		return 0, ckErr(pkcs11.CKR_SESSION_READ_WRITE_SO_EXISTS)
	}
	be, err := s.tok.OpenSession(l.ctx)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	s.nsess++
	if !rw {
		s.nro++
	}
	s.mu.Unlock()
	l.mu.Lock()
	l.next++
	h := l.next
	l.sessions[h] = &appSession{handle: h, slot: s, rw: rw, be: be, epoch: epoch,
		ctx: slot.WithAffinity(l.ctx, new(slot.Affinity))}
	l.mu.Unlock()
	return h, nil
}

// session returns an open session, locked; the caller unlocks it.
func (l *library) session(h uint) (*appSession, error) {
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
	if s.epoch != s.slot.lost() {
		// Opened before the group went down in activeBasic: the engine
		// lost it, so the application's handle is gone too.
		s.mu.Unlock()
		l.dropLost(s.slot)
		return nil, ckErr(pkcs11.CKR_SESSION_HANDLE_INVALID)
	}
	return s, nil
}

// dropLost removes the sessions of slot e that its token lost (every member
// of the group failed in activeBasic), and with them the login, without
// asking the token to log out: the engine already forgot both. It runs from
// the token's OnLost callback and when a stale session is used.
func (l *library) dropLost(e *slotEntry) {
	n := e.lost()
	l.mu.Lock()
	var stale []*appSession
	for h, s := range l.sessions {
		if s.slot == e && s.epoch != n {
			stale = append(stale, s)
			delete(l.sessions, h)
		}
	}
	l.mu.Unlock()
	for _, s := range stale {
		s.mu.Lock()
		s.closed = true
		if err := s.be.Close(); err != nil {
			l.log.debug("closing a session lost with its group", "slot", e.id, "err", err)
		}
		s.mu.Unlock()
		e.mu.Lock()
		e.nsess--
		if !s.rw {
			e.nro--
		}
		e.mu.Unlock()
	}
	e.mu.Lock()
	e.current()
	e.mu.Unlock()
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
	s.mu.Lock()
	s.closed = true
	err := s.be.Close()
	s.mu.Unlock()
	e := s.slot
	e.mu.Lock()
	e.current()
	e.nsess--
	if !s.rw {
		e.nro--
	}
	last := e.nsess == 0 && e.user != userNone
	if last {
		e.user = userNone
		e.keys = nil
	}
	e.mu.Unlock()
	if last {
		if lerr := e.tok.Logout(l.ctx); lerr != nil && err == nil {
			l.log.debug("logout after the last session closed", "slot", e.id, "err", lerr)
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
	s.slot.mu.Lock()
	s.slot.current()
	user := s.slot.user
	s.slot.mu.Unlock()
	flags = pkcs11.CKF_SERIAL_SESSION
	switch {
	case user == pkcs11.CKU_SO:
		state = pkcs11.CKS_RW_SO_FUNCTIONS
	case user == pkcs11.CKU_USER && s.rw:
		state = pkcs11.CKS_RW_USER_FUNCTIONS
	case user == pkcs11.CKU_USER:
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
	e.current()
	switch {
	case e.user == userType:
		return ckErr(pkcs11.CKR_USER_ALREADY_LOGGED_IN)
	case e.user != userNone:
		return ckErr(pkcs11.CKR_USER_ANOTHER_ALREADY_LOGGED_IN)
	case userType == pkcs11.CKU_SO && e.nro > 0:
		return ckErr(pkcs11.CKR_SESSION_READ_ONLY_EXISTS)
	}
	if err := e.tok.Login(l.ctx, userType, pin); err != nil {
		return err
	}
	e.user = userType
	e.keys = nil
	return nil
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
	e.current()
	if e.user == userNone {
		return ckErr(pkcs11.CKR_USER_NOT_LOGGED_IN)
	}
	err = e.tok.Logout(l.ctx)
	e.user = userNone
	e.keys = nil
	return err
}

// forget drops what the slot remembers of its keys (after any change).
func (e *slotEntry) forget() {
	e.mu.Lock()
	e.keys = nil
	e.mu.Unlock()
}

// checkKey reports a bad key handle or CKR_KEY_FUNCTION_NOT_PERMITTED
// at *Init time, as a module does, rather than at the first data call.
func (l *library) checkKey(s *appSession, key uint, kind opKind) error {
	e := s.slot
	e.mu.Lock()
	ki, ok := e.keys[key]
	e.mu.Unlock()
	if !ok {
		attrs, err := s.be.GetAttributes(s.ctx, key, []uint{pkcs11.CKA_CLASS,
			pkcs11.CKA_ENCRYPT, pkcs11.CKA_DECRYPT, pkcs11.CKA_SIGN, pkcs11.CKA_VERIFY})
		if err != nil {
			return err // a handle naming nothing: CKR_OBJECT_HANDLE_INVALID, as SoftHSM's C_*Init
		}
		for _, a := range attrs {
			if a.Status != pkcs11.CKR_OK {
				continue
			}
			switch a.Type {
			case pkcs11.CKA_CLASS:
				ki.class = ulong(a.Value)
			default:
				for k, p := range opPerm {
					if p == a.Type && p != 0 {
						ki.perm[k] = len(a.Value) > 0 && a.Value[0] != 0
					}
				}
			}
		}
		e.mu.Lock()
		if e.keys == nil {
			e.keys = map[uint]keyInfo{}
		}
		e.keys[key] = ki
		e.mu.Unlock()
	}
	switch ki.class {
	case pkcs11.CKO_SECRET_KEY, pkcs11.CKO_PRIVATE_KEY, pkcs11.CKO_PUBLIC_KEY:
	default:
		return ckErr(pkcs11.CKR_KEY_HANDLE_INVALID)
	}
	if !ki.perm[kind] {
		return ckErr(pkcs11.CKR_KEY_FUNCTION_NOT_PERMITTED)
	}
	return nil
}

// opInit starts an operation; a nil mechanism ends the active one.
func (l *library) opInit(h uint, kind opKind, m *pkcs11.Mechanism, key uint) error {
	s, err := l.session(h)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	if m == nil {
		if s.ops[kind] == nil {
			return ckErr(pkcs11.CKR_OPERATION_NOT_INITIALIZED)
		}
		l.abort(s, kind)
		return nil
	}
	if s.ops[kind] != nil {
		return ckErr(pkcs11.CKR_OPERATION_ACTIVE)
	}
	mechs, _, err := s.slot.mechanisms(l.ctx)
	if err != nil {
		return err
	}
	if _, ok := mechs[m.Mechanism]; !ok {
		return ckErr(pkcs11.CKR_MECHANISM_INVALID)
	}
	if kind != opDigest {
		if err := l.checkKey(s, key, kind); err != nil {
			return err
		}
	}
	s.ops[kind] = &operation{mech: m, key: key}
	return nil
}

// abort ends an operation; one already pinned to a member is finished
// there and its result dropped.
func (l *library) abort(s *appSession, kind opKind) {
	op := s.ops[kind]
	s.ops[kind] = nil
	if op == nil || !op.multi {
		return
	}
	var err error
	switch kind {
	case opEncrypt:
		_, err = s.be.EncryptFinal(s.ctx)
	case opDecrypt:
		_, err = s.be.DecryptFinal(s.ctx)
	case opDigest:
		_, err = s.be.DigestFinal(s.ctx)
	case opSign:
		_, err = s.be.SignFinal(s.ctx)
	case opVerify:
		err = s.be.VerifyFinal(s.ctx, nil)
	}
	_ = err // the operation is being thrown away; its outcome is moot
}

// output is where a call's output goes: the C buffer convention lives in
// abi.go behind put, which reports CKR_BUFFER_TOO_SMALL or, for a length
// query (NULL buffer), delivered=false with no error.
type output interface {
	put(b []byte) (delivered bool, err error)
}

// deliver hands out to the application, keeping it for the next call when
// the application only asked for its length or gave too small a buffer.
func (s *appSession) deliver(kind opKind, op *operation, st step, in, out []byte, dst output) error {
	delivered, err := dst.put(out)
	if !delivered {
		op.held, op.heldIn, op.heldStep = out, in, st
		return err
	}
	op.held, op.heldIn, op.heldStep = nil, nil, 0
	if st != stepUpdate {
		s.ops[kind] = nil
	}
	return nil
}

// active returns the session's operation of kind, or
// CKR_OPERATION_NOT_INITIALIZED.
func (s *appSession) active(kind opKind) (*operation, error) {
	op := s.ops[kind]
	if op == nil {
		return nil, ckErr(pkcs11.CKR_OPERATION_NOT_INITIALIZED)
	}
	return op, nil
}

// single runs a single-part C_Encrypt, C_Decrypt, C_Digest or C_Sign.
func (l *library) single(h uint, kind opKind, in []byte, dst output) error {
	s, err := l.session(h)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	op, err := s.active(kind)
	if err != nil {
		return err
	}
	if op.multi {
		// Any failed C_Sign (C_Encrypt …) ends the operation.
		l.abort(s, kind)
		return ckErr(pkcs11.CKR_OPERATION_ACTIVE)
	}
	out := op.held
	if op.heldStep != stepSingle || !bytes.Equal(op.heldIn, in) {
		switch kind {
		case opEncrypt:
			out, err = s.be.Encrypt(s.ctx, op.mech, op.key, in)
		case opDecrypt:
			out, err = s.be.Decrypt(s.ctx, op.mech, op.key, in)
		case opDigest:
			out, err = s.be.Digest(s.ctx, op.mech, in)
		case opSign:
			out, err = s.be.Sign(s.ctx, op.mech, op.key, in)
		}
		if err != nil {
			s.ops[kind] = nil
			return err
		}
	}
	return s.deliver(kind, op, stepSingle, in, out, dst)
}

// verify runs a single-part C_Verify.
func (l *library) verify(h uint, data, sig []byte) error {
	s, err := l.session(h)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	op, err := s.active(opVerify)
	if err != nil {
		return err
	}
	if op.multi {
		l.abort(s, opVerify)
		return ckErr(pkcs11.CKR_OPERATION_ACTIVE)
	}
	s.ops[opVerify] = nil
	return s.be.Verify(s.ctx, op.mech, op.key, data, sig)
}

// pin sends an operation's Init to the backend at its first Update or
// Final.
func (l *library) pin(s *appSession, kind opKind, op *operation) error {
	if op.multi {
		return nil
	}
	var err error
	switch kind {
	case opEncrypt:
		err = s.be.EncryptInit(s.ctx, op.mech, op.key)
	case opDecrypt:
		err = s.be.DecryptInit(s.ctx, op.mech, op.key)
	case opDigest:
		err = s.be.DigestInit(s.ctx, op.mech)
	case opSign:
		err = s.be.SignInit(s.ctx, op.mech, op.key)
	case opVerify:
		err = s.be.VerifyInit(s.ctx, op.mech, op.key)
	}
	if err != nil {
		s.ops[kind] = nil
		return err
	}
	op.multi = true
	return nil
}

// update runs C_*Update; dst is nil for digest, sign and verify.
func (l *library) update(h uint, kind opKind, in []byte, dst output) error {
	s, err := l.session(h)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	op, err := s.active(kind)
	if err != nil {
		return err
	}
	if err := l.pin(s, kind, op); err != nil {
		return err
	}
	var out []byte
	switch kind {
	case opEncrypt, opDecrypt:
		if op.heldStep == stepUpdate && bytes.Equal(op.heldIn, in) {
			out = op.held
			break
		}
		if kind == opEncrypt {
			out, err = s.be.EncryptUpdate(s.ctx, in)
		} else {
			out, err = s.be.DecryptUpdate(s.ctx, in)
		}
	case opDigest:
		err = s.be.DigestUpdate(s.ctx, in)
	case opSign:
		err = s.be.SignUpdate(s.ctx, in)
	case opVerify:
		err = s.be.VerifyUpdate(s.ctx, in)
	}
	if err != nil {
		s.ops[kind] = nil
		return err
	}
	if dst == nil {
		return nil
	}
	return s.deliver(kind, op, stepUpdate, in, out, dst)
}

// digestKey runs C_DigestKey: like C_DigestUpdate, on the member the
// digest runs on.
func (l *library) digestKey(h, key uint) error {
	s, err := l.session(h)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	op, err := s.active(opDigest)
	if err != nil {
		return err
	}
	if err := l.pin(s, opDigest, op); err != nil {
		return err
	}
	err = s.be.DigestKey(s.ctx, key)
	if err != nil && codeOf(err) != pkcs11.CKR_KEY_HANDLE_INVALID {
		s.ops[opDigest] = nil
	}
	return err
}

// final runs C_EncryptFinal, C_DecryptFinal, C_DigestFinal or C_SignFinal.
func (l *library) final(h uint, kind opKind, dst output) error {
	s, err := l.session(h)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	op, err := s.active(kind)
	if err != nil {
		return err
	}
	if err := l.pin(s, kind, op); err != nil {
		return err
	}
	out := op.held
	if op.heldStep != stepFinal {
		switch kind {
		case opEncrypt:
			out, err = s.be.EncryptFinal(s.ctx)
		case opDecrypt:
			out, err = s.be.DecryptFinal(s.ctx)
		case opDigest:
			out, err = s.be.DigestFinal(s.ctx)
		case opSign:
			out, err = s.be.SignFinal(s.ctx)
		}
		if err != nil {
			s.ops[kind] = nil
			return err
		}
	}
	return s.deliver(kind, op, stepFinal, nil, out, dst)
}

func (l *library) verifyFinal(h uint, sig []byte) error {
	s, err := l.session(h)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	op, err := s.active(opVerify)
	if err != nil {
		return err
	}
	if err := l.pin(s, opVerify, op); err != nil {
		return err
	}
	s.ops[opVerify] = nil
	return s.be.VerifyFinal(s.ctx, sig)
}

// findInit, findNext and findFinal keep one search per session; the
// backend answers the whole search at once.
func (l *library) findInit(h uint, tmpl []*pkcs11.Attribute) error {
	s, err := l.session(h)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	if s.finding {
		return ckErr(pkcs11.CKR_OPERATION_ACTIVE)
	}
	found, err := s.be.FindObjects(s.ctx, tmpl)
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
	attrs, err := s.be.GetAttributes(s.ctx, h, []uint{pkcs11.CKA_TOKEN})
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

// ulong reads a little-endian CK_ULONG attribute value.
func ulong(b []byte) uint {
	var v uint
	for i := len(b) - 1; i >= 0; i-- {
		v = v<<8 | uint(b[i])
	}
	return v
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
