package remote

import (
	"bufio"
	"fmt"

	"github.com/miekg/pkcs11"
)

// What the attacker's tests (remote_test) need to speak the protocol by
// hand.

// Ops numbers the calls the tests make.
var Ops = map[string]uint{"GetSlotList": uint(opGetSlotList), "OpenSession": uint(opOpenSession),
	"CreateObject": uint(opCreateObject), "DeriveKey": uint(opDeriveKey), "GenerateRandom": uint(opGenerateRandom),
	"GetAttributeValue": uint(opGetAttributeValue), "SetOperationState": uint(opSetOperationState), "past the last": uint(opCount)}

// ReadFrame reads one frame.
var ReadFrame = readFrame

// Hello is the body of the client's hello.
func Hello() []byte {
	e := &encoder{}
	(&hello{Magic: magic, Version: ProtocolVersion}).encode(e)
	return e.b
}

// Request is the body of a request; mechWire, when not nil, is put in
// place of the mechanism as it is, lies and all.
func Request(id uint64, o, slot, session, object, n uint, mechWire []byte, attrs []*pkcs11.Attribute) []byte {
	e := &encoder{}
	(&request{ID: id, Op: op(o), Slot: slot, Session: session, Object: object, N: n, Attrs: attrs}).encode(e)
	if mechWire == nil {
		return e.b
	}
	// The mechanism's absence is the one byte after the head and the five
	// numbers.
	head := &encoder{}
	head.uint(uint(id))
	head.uint(o)
	for _, v := range []uint{slot, session, object, 0, n} {
		head.uint(v)
	}
	at := len(head.b)
	return append(append(append(e.b[:at:at], 1), mechWire...), e.b[at+1:]...)
}

// Login is the body of a C_Login of the user.
func Login(id uint64, session uint, pin string) []byte {
	e := &encoder{}
	(&request{ID: id, Op: opLogin, Session: session, N: pkcs11.CKU_USER, PIN: []byte(pin)}).encode(e)
	return e.b
}

// MechWire is the encoding of m as the client sends it; an error when the
// client refuses to.
func MechWire(m *pkcs11.Mechanism) ([]byte, error) {
	w := mechOut([]*pkcs11.Mechanism{m})
	if w.refused != nil {
		return nil, w.refused
	}
	e := &encoder{}
	w.encode(e)
	return e.b, nil
}

// Reply is a response as the attacker reads it.
type Reply struct {
	RV      uint
	Err     string
	Handle  uint
	Handles []uint
	Attrs   []*pkcs11.Attribute
}

// ReadReply reads one reply.
func ReadReply(r *bufio.Reader) (*Reply, error) {
	b, err := readFrame(r)
	if err != nil {
		return nil, err
	}
	var q response
	d := &decoder{b: b}
	q.decode(d)
	if err := d.end(); err != nil {
		return nil, fmt.Errorf("reply: %w", err)
	}
	return &Reply{RV: q.RV, Err: q.Err, Handle: q.Handle, Handles: q.Handles, Attrs: q.Attrs}, nil
}
