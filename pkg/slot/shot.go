package slot

import (
	"github.com/hagroup/hagroup/internal/handoff"
	"github.com/hagroup/hagroup/internal/p11raw"
	"github.com/hagroup/hagroup/internal/tokenquirk"
	"github.com/miekg/pkcs11"
)

// The single-part calls (an Init and its single-part call in one crossing
// of cgo) are the hot path of a signer, and they reach the module one way:
// their arguments are copied into the session's C memory (p11raw.Shot),
// which C makes the call from and the output is taken from. Under handoff
// the worker makes it in C without coming back to Go (handoff.Cell.Serve),
// so that a call its caller gave up on reads and writes no Go memory;
// under inline, or with an Interceptor to run first, Go makes the same
// Shot on the goroutine of the call (sess.single). Only what a Shot cannot
// carry (a served token, a mechanism parameter miekg builds from a Go
// value) goes through miekg.

// Kind is an operation family (C_SignInit … C_Sign). It is the one
// encoding of an operation's kind from the PKCS#11 module's entry points
// through the engine (pkg/group/opstate names it) down to the module call.
type Kind int

// The operation families.
const (
	KindSign Kind = iota
	KindVerify
	KindEncrypt
	KindDecrypt
	KindDigest
	NumKinds // how many there are
)

// kinds is what each Kind is at the module: its calls (the single-part
// one first) and its Init's place in the function list.
var kinds = [NumKinds]struct {
	op, init, update, final Op
	raw                     p11raw.Kind
}{
	KindSign:    {OpSign, OpSignInit, OpSignUpdate, OpSignFinal, p11raw.Sign},
	KindVerify:  {OpVerify, OpVerifyInit, OpVerifyUpdate, OpVerifyFinal, p11raw.Verify},
	KindEncrypt: {OpEncrypt, OpEncryptInit, OpEncryptUpdate, OpEncryptFinal, p11raw.Encrypt},
	KindDecrypt: {OpDecrypt, OpDecryptInit, OpDecryptUpdate, OpDecryptFinal, p11raw.Decrypt},
	KindDigest:  {OpDigest, OpDigestInit, OpDigestUpdate, OpDigestFinal, p11raw.Digest},
}

// String returns the PKCS#11 name of the family ("Sign"), its
// single-part call's.
func (k Kind) String() string { return string(kinds[k].op) }

// InitName returns the name of k's Init ("SignInit").
func (k Kind) InitName() string { return string(kinds[k].init) }

// UpdateName returns the name of k's Update ("SignUpdate").
func (k Kind) UpdateName() string { return string(kinds[k].update) }

// FinalName returns the name of k's Final ("SignFinal").
func (k Kind) FinalName() string { return string(kinds[k].final) }

// shotArgs is a one-shot call and, once answered, its output.
type shotArgs struct {
	k       Kind
	m       *pkcs11.Mechanism
	key     pkcs11.ObjectHandle
	in, sig []byte
	out     []byte
}

// setShot copies a into the session's C memory for C to make, and reports
// whether it can.
func (x *sess) setShot(a *shotArgs) bool {
	mm, ok := x.ctx.(*miekgModule)
	if !ok || mm.fl == nil || !p11raw.PlainMechanism(a.m) {
		return false
	}
	hint := x.outHint
	if t := x.owner.Token(); tokenquirk.TruncatesToShortBuffer(t.Manufacturer, t.Model) {
		hint = 0 // the first buffer is then p11raw's ample default
	}
	x.shot.Set(mm.fl, kinds[a.k].raw, x.h, a.m, a.key, a.in, a.sig, hint)
	return true
}

// shootsInC says whether a session's worker can make its one-shots in C:
// on a module loaded in this process, with no Interceptor to run first.
// Every call of any other session is made in Go.
func shootsInC(s *Slot, c p11) bool {
	mm, ok := c.(*miekgModule)
	return ok && mm.fl != nil && s.spec.Interceptor == nil
}

// newPair is the meeting point of a session's caller and worker: a
// handoff.Cell, unless every call is made in Go and its callers are
// goroutines (a GoCell: a call made in Go may take milliseconds, and a
// goroutine waiting that long in C holds its thread and lets the runtime
// take its P away; docs/BENCHMARKS.md, "Waits made in Go").
func newPair(s *Slot, cShots bool) handoff.Pair {
	if cShots || s.spec.ThreadCallers {
		return new(handoff.Cell)
	}
	return handoff.NewGoCell()
}

// single makes one-shot a on the goroutine of the call: from the Shot
// runWith set up, or through miekg.
func (x *sess) single(a *shotArgs) (err error) {
	if x.inC {
		x.shot.Call()
		a.out, err = x.shotResult()
		return err
	}
	if err = x.initOp(a.k, a.m, a.key); err == nil {
		a.out, err = x.singleOp(a.k, a.in, a.sig)
	}
	return err
}

// shotResult is the answered Shot's output.
func (x *sess) shotResult() ([]byte, error) {
	out, err := x.shot.Result()
	if len(out) > 0 {
		x.outHint = len(out) // the next output of the session is likely as long
	}
	return out, err
}

// The calls of family k through miekg, for what a Shot cannot carry and
// for a dedicated session's multi-part operations: the single-part call
// and Final take the signature a verification checks, and each returns
// its output (nil where the family has none).

func (x *sess) initOp(k Kind, m *pkcs11.Mechanism, key pkcs11.ObjectHandle) error {
	switch k {
	case KindSign:
		return x.ctx.SignInit(x.h, mechs(m), key)
	case KindVerify:
		return x.ctx.VerifyInit(x.h, mechs(m), key)
	case KindEncrypt:
		return x.ctx.EncryptInit(x.h, mechs(m), key)
	case KindDecrypt:
		return x.ctx.DecryptInit(x.h, mechs(m), key)
	}
	return x.ctx.DigestInit(x.h, mechs(m))
}

func (x *sess) singleOp(k Kind, in, sig []byte) ([]byte, error) {
	switch k {
	case KindSign:
		return x.ctx.Sign(x.h, in)
	case KindVerify:
		return nil, x.ctx.Verify(x.h, in, sig)
	case KindEncrypt:
		return x.ctx.Encrypt(x.h, in)
	case KindDecrypt:
		return x.ctx.Decrypt(x.h, in)
	}
	return x.ctx.Digest(x.h, in)
}

func (x *sess) updateOp(k Kind, in []byte) ([]byte, error) {
	switch k {
	case KindSign:
		return nil, x.ctx.SignUpdate(x.h, in)
	case KindVerify:
		return nil, x.ctx.VerifyUpdate(x.h, in)
	case KindEncrypt:
		return x.ctx.EncryptUpdate(x.h, in)
	case KindDecrypt:
		return x.ctx.DecryptUpdate(x.h, in)
	}
	return nil, x.ctx.DigestUpdate(x.h, in)
}

func (x *sess) finalOp(k Kind, sig []byte) ([]byte, error) {
	switch k {
	case KindSign:
		return x.ctx.SignFinal(x.h)
	case KindVerify:
		return nil, x.ctx.VerifyFinal(x.h, sig)
	case KindEncrypt:
		return x.ctx.EncryptFinal(x.h)
	case KindDecrypt:
		return x.ctx.DecryptFinal(x.h)
	}
	return x.ctx.DigestFinal(x.h)
}
