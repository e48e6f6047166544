package remote

import (
	"bufio"
	"fmt"
	"reflect"

	"github.com/miekg/pkcs11"
)

// What the attacker's tests (remote_test) need to speak the protocol by
// hand.

// Ops numbers the calls the tests make.
var Ops = map[string]uint{"GetSlotList": uint(opGetSlotList), "OpenSession": uint(opOpenSession),
	"CreateObject": uint(opCreateObject), "DeriveKey": uint(opDeriveKey), "GenerateRandom": uint(opGenerateRandom),
	"GetAttributeValue": uint(opGetAttributeValue), "SetOperationState": uint(opSetOperationState),
	"Login": uint(opLogin), "past the last": uint(opCount)}

// ReadFrame reads one frame.
var ReadFrame = readFrame

// Hello is the body of the client's hello.
func Hello() []byte {
	e := &encoder{}
	(&hello{Magic: magic, Version: ProtocolVersion}).encode(e)
	return e.b
}

// Request is the body of a request: the arguments of o's function, each
// by its type, from these values (a slot first, any other number n, no
// bytes); mechWire, when not nil, is the one mechanism as it is, lies and
// all. An op that is not served gets no arguments.
func Request(id uint64, o, slot, session, object, n uint, mechWire []byte, attrs []*pkcs11.Attribute) []byte {
	e := &encoder{}
	e.uint(uint(id))
	e.uint(o)
	f, err := op(o).function()
	if err != nil {
		return e.b
	}
	ts, _ := f.signature()
	for i, t := range ts {
		switch {
		case t == typeMechs && mechWire != nil:
			e.uint(1)
			e.b = append(e.b, mechWire...)
		case t == typeSession:
			e.uint(session)
		case t == reflect.TypeFor[pkcs11.ObjectHandle]():
			e.uint(object)
		case t == reflect.TypeFor[[]*pkcs11.Attribute]():
			e.attrs(attrs)
		case t.Kind() == reflect.Uint && i == 0:
			e.uint(slot)
		case t.Kind() == reflect.Uint || t.Kind() == reflect.Int:
			e.uint(n)
		case t.Kind() == reflect.Bool:
			e.bool(n != 0)
		default: // an empty list or byte string
			e.uint(0)
		}
	}
	return e.b
}

// Login is the body of a C_Login of the user.
func Login(id uint64, session uint, pin string) []byte {
	e := &encoder{}
	for _, v := range []any{uint(id), opLogin, pkcs11.SessionHandle(session), uint(pkcs11.CKU_USER), pin} {
		e.value(reflect.ValueOf(v))
	}
	return e.b
}

// MechWire is the encoding of m as the client sends it; an error when the
// client refuses to.
func MechWire(m *pkcs11.Mechanism) ([]byte, error) {
	w := mechOut(m)
	if w.refused != nil {
		return nil, w.refused
	}
	e := &encoder{}
	w.encode(e)
	return e.b, nil
}

// Reply is a response as the attacker reads it: the CKR code, why, and
// the results of its function, by type.
type Reply struct {
	RV      uint
	Err     string
	Handle  uint
	Handles []uint
	Attrs   []*pkcs11.Attribute
}

// ReadReply reads one reply to a request of op o.
func ReadReply(r *bufio.Reader, o uint) (*Reply, error) {
	b, err := readFrame(r)
	if err != nil {
		return nil, err
	}
	var head response
	d := &decoder{b: b}
	head.decode(d)
	rep := &Reply{RV: head.RV, Err: head.Err}
	if f, err := op(o).function(); err == nil && d.err == nil && head.RV == pkcs11.CKR_OK {
		_, ts := f.signature()
		for _, t := range ts {
			v := reflect.New(t).Elem()
			d.value(v)
			switch x := v.Interface().(type) {
			case pkcs11.ObjectHandle, pkcs11.SessionHandle:
				rep.Handle = uint(v.Uint())
			case []uint:
				rep.Handles = x
			case []*pkcs11.Attribute:
				rep.Attrs = x
			}
		}
	}
	if err := d.end(); err != nil {
		return nil, fmt.Errorf("reply: %w", err)
	}
	return rep, nil
}
