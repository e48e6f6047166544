package remote

import (
	"errors"
	"fmt"
	"reflect"
	"unsafe"

	"github.com/hagroup/hagroup/internal/mechparam"
	"github.com/miekg/pkcs11"
)

// The protocol: frames over one Unix stream connection per client
// context, each a 4-byte big-endian length and that many bytes (at most
// MaxFrame) holding one message, value by value (codec.go). The client
// opens with a hello and the server answers with a welcome; from then on
// the client sends requests (a call's arguments, as its function's
// signature has them) and the server answers each with a response
// carrying the request's ID, in any order (the server runs a bounded
// number of requests concurrently), so one connection carries every
// concurrent call of its context.

// ProtocolVersion is the version of the request/response protocol. A server
// refuses a client of another version with a welcome naming both.
// Version 1 was encoding/gob, unbounded; version 2 did not tell an empty
// byte string from none; version 3 carried no C_DigestKey; version 4
// carried four mechanism parameters with pointers, by hand, and numbered
// its ops by hand; version 5 carried every argument and result of every
// function in one set of fields.
const ProtocolVersion = 6

// magic opens every connection.
const magic = "hagroup-remote"

type hello struct {
	Magic   string
	Version int
}

type welcome struct {
	Version int
	Err     string // the server refuses the connection
}

// op is a call: a PKCS#11 function, numbered from pkcs11f.h by rpcgen
// (ops_gen.go), or one of hagroup's own after them.
type op uint8

// function is a call as hsmserve serves it: its name, and the method that
// runs it (of miekg's *pkcs11.Ctx for a PKCS#11 function; nil: not
// served). The method's signature is the call's wire: a request carries
// the call's ID, its op and its arguments, and a response the ID, the CKR
// code, why it failed, and on success the results, each value by its type
// in that signature (codec.go's value), in order.
type function struct {
	name string
	run  any
}

// hagroup's own calls: a template that holds attribute arrays, and one
// attribute array read (internal/p11raw).
const (
	opCreateObjectNested = opFunctions + iota
	opGetNestedAttribute
	opCount
)

var own = [opCount - opFunctions]function{
	{"C_CreateObject with attribute arrays", (*served).createObjectNested},
	{"C_GetAttributeValue of an attribute array", (*served).getNestedAttribute},
}

// function returns o's call, or why it is not served.
func (o op) function() (function, error) {
	switch {
	case o > opInvalid && o < opFunctions && functions[o].run != nil:
		return functions[o], nil
	case o > opInvalid && o < opFunctions:
		return function{}, fmt.Errorf("%v is not served: %w", o, errFunctionNotSupported)
	case o >= opFunctions && o < opCount:
		return own[o-opFunctions], nil
	}
	return function{}, fmt.Errorf("unknown operation %d (protocol version %d)", uint8(o), ProtocolVersion)
}

// String names o for an error: its PKCS#11 function, or hagroup's call.
func (o op) String() string {
	switch {
	case o > opInvalid && o < opFunctions:
		return functions[o].name
	case o >= opFunctions && o < opCount:
		return own[o-opFunctions].name
	}
	return fmt.Sprintf("operation %d", uint8(o))
}

var (
	typeSession = reflect.TypeFor[pkcs11.SessionHandle]()
	typeMechs   = reflect.TypeFor[[]*pkcs11.Mechanism]()
)

// nestedAttr is one attribute whose value is an attribute array.
type nestedAttr struct {
	Type  uint
	Attrs []*pkcs11.Attribute
}

// response opens the answer to the request with the same ID; the
// results follow on success.
type response struct {
	ID  uint64
	RV  uint   // CKR code; 0 is CKR_OK
	Err string // a failure with no CKR code of its own (RV is then CKR_GENERAL_ERROR)
}

// mech is a mechanism on the wire: its type and its parameter in one of
// three forms. A parameter that holds no pointer (as internal/mechparam
// knows them: the layouts rpcgen writes from pkcs11t.h) crosses as its
// bytes; one that holds pointers as a mechparam.Value (the structure and
// what each pointer points at), rebuilt by the server in C memory; such a
// structure given with a length that is not its size as that length
// alone, and the module gets zeroes of it: it answers the wrong length as
// it would in process, and nothing is read behind a length that may lie.
type mech struct {
	Type   uint
	Form   paramForm
	Param  []byte           // paramBytes
	Length uint             // paramLength
	Value  *mechparam.Value // paramStruct
	// refused is why the client does not send it (never on the wire).
	refused error
}

type paramForm uint8

const (
	paramBytes paramForm = iota
	paramStruct
	paramLength
	paramForms
)

// maxParamLength bounds a structure's length crossing alone (paramLength):
// the largest structure is some hundred bytes, and the server allocates
// zeroes of it.
const maxParamLength = 1 << 16

// maxParamDepth bounds how deep a parameter's structures nest (RSA-AES
// key wrap's OAEP parameters are one level down).
const maxParamDepth = 2

var errParamInvalid = pkcs11.Error(pkcs11.CKR_MECHANISM_PARAM_INVALID)

// mechOut converts a mechanism of a miekg call for the wire.
func mechOut(m *pkcs11.Mechanism) *mech {
	w := &mech{Type: m.Mechanism}
	l := mechparam.For(m.Mechanism)
	g := generatorOf(m)
	switch {
	case g != nil:
		w.Form = paramStruct
		w.Value, w.refused = generatorValue(l, g)
	case l == nil || len(m.Parameter) == 0:
		w.Param = m.Parameter
	case l.Refused != "":
		w.refused = fmt.Errorf("mechanism 0x%x: its parameter %s cannot cross to the token server: %s: %w", m.Mechanism, l.Name, l.Refused, errParamInvalid)
	case len(m.Parameter) != l.Size:
		w.Form, w.Length = paramLength, uint(len(m.Parameter))
	default:
		w.Form = paramStruct
		v, err := mechparam.FromRaw(l, m.Parameter, MaxFrame)
		if err != nil {
			err = fmt.Errorf("mechanism 0x%x: %v: %w", m.Mechanism, err, errArgumentsBad)
		}
		w.Value, w.refused = v, err
	}
	return w
}

// generatorValue lays out a parameter miekg builds from a Go value at the
// call (it keeps the value unexported) as the mechanism's layout l.
func generatorValue(l *mechparam.Layout, g any) (*mechparam.Value, error) {
	var want string
	switch g.(type) {
	case *pkcs11.OAEPParams:
		want = "CK_RSA_PKCS_OAEP_PARAMS"
	case *pkcs11.ECDH1DeriveParams:
		want = "CK_ECDH1_DERIVE_PARAMS"
	case *pkcs11.RSAAESKeyWrapParams:
		want = "CK_RSA_AES_KEY_WRAP_PARAMS"
	case *pkcs11.GCMParams:
		want = "CK_GCM_PARAMS"
	}
	if l == nil || l.Name != want {
		return nil, fmt.Errorf("a %T parameter for a mechanism that does not take it: %w", g, errParamInvalid)
	}
	v := mechparam.New(l)
	var err error
	switch g := g.(type) {
	case *pkcs11.OAEPParams:
		err = oaepValue(v, g)
	case *pkcs11.ECDH1DeriveParams:
		err = errors.Join(v.SetWord("kdf", g.KDF),
			v.SetTarget("pSharedData", bytesTarget(g.SharedData)),
			v.SetTarget("pPublicData", mechparam.Target{Bytes: g.PublicKeyData}))
	case *pkcs11.RSAAESKeyWrapParams:
		oaep := mechparam.New(l.Ptrs[0].To)
		err = errors.Join(v.SetWord("ulAESKeyBits", g.AESKeyBits), oaepValue(oaep, &g.OAEPParams),
			v.SetTarget("pOAEPParams", mechparam.Target{Sub: oaep}))
	case *pkcs11.GCMParams:
		iv := unexported[[]byte](g, "iv")
		err = errors.Join(v.SetWord("ulTagBits", uint(unexported[int](g, "tagSize"))),
			v.SetWord("ulIvBits", uint(len(iv))*8),
			v.SetTarget("pIv", bytesTarget(iv)),
			v.SetTarget("pAAD", bytesTarget(unexported[[]byte](g, "aad"))))
	}
	if err != nil {
		return nil, fmt.Errorf("%v: %w", err, errParamInvalid)
	}
	return v, nil
}

func oaepValue(v *mechparam.Value, o *pkcs11.OAEPParams) error {
	return errors.Join(v.SetWord("hashAlg", o.HashAlg), v.SetWord("mgf", o.MGF), v.SetWord("source", o.SourceType),
		v.SetTarget("pSourceData", bytesTarget(o.SourceData)))
}

// bytesTarget points at b, or is NULL when b is empty, as miekg passes it.
func bytesTarget(b []byte) mechparam.Target {
	if len(b) == 0 {
		return mechparam.Target{}
	}
	return mechparam.Target{Bytes: b}
}

// mechIn rebuilds a mechanism from the wire, its parameter in C memory
// when it holds pointers; free releases that memory after the call. A
// mechanism is nil when there is none.
func mechIn(w *mech) (ms []*pkcs11.Mechanism, free func(), err error) {
	free = func() {}
	if w == nil {
		return nil, free, nil
	}
	l := mechparam.For(w.Type)
	m := &pkcs11.Mechanism{Mechanism: w.Type}
	switch w.Form {
	case paramBytes:
		// Raw bytes of a structure with pointers would point nowhere here.
		if len(w.Param) > 0 && l != nil {
			return nil, free, fmt.Errorf("mechanism 0x%x: raw bytes of %s, which holds pointers: %w", w.Type, l.Name, errParamInvalid)
		}
		m.Parameter = w.Param
	case paramStruct:
		if w.Value == nil || w.Value.Layout != l { // the decoder read it by l
			return nil, free, fmt.Errorf("mechanism 0x%x: a parameter of another layout: %w", w.Type, errArgumentsBad)
		}
		if m.Parameter, free, err = mechparam.Build(w.Value); err != nil {
			return nil, func() {}, fmt.Errorf("mechanism 0x%x: %v: %w", w.Type, err, errArgumentsBad)
		}
	case paramLength:
		if l == nil || l.Refused != "" || w.Length == uint(l.Size) || w.Length > maxParamLength {
			return nil, free, fmt.Errorf("mechanism 0x%x: a parameter length of %d for no structure it could lie about: %w", w.Type, w.Length, errArgumentsBad)
		}
		m.Parameter = make([]byte, w.Length)
	}
	return []*pkcs11.Mechanism{m}, free, nil
}

// generatorOf returns the Go parameter value miekg keeps unexported in a
// Mechanism made by NewMechanism with a parameter struct (it is marshalled
// only at call time, as it holds pointers), or nil.
func generatorOf(m *pkcs11.Mechanism) any {
	f := reflect.ValueOf(m).Elem().FieldByName("generator")
	if !f.IsValid() || f.Kind() != reflect.Interface {
		return nil
	}
	return reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Interface()
}

// unexported reads unexported field name of *p (zero when miekg's layout
// changed and the field is gone or of another type).
func unexported[T any](p any, name string) T {
	var zero T
	f := reflect.ValueOf(p).Elem().FieldByName(name)
	if !f.IsValid() || f.Type() != reflect.TypeOf(zero) {
		return zero
	}
	return reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Interface().(T)
}
