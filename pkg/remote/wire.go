package remote

import (
	"reflect"
	"unsafe"

	"github.com/hagroup/hagroup/internal/p11raw"
	"github.com/miekg/pkcs11"
)

// The protocol: frames over one Unix stream connection per client
// context, each a 4-byte big-endian length and that many bytes (at most
// MaxFrame) holding one message, field by field (codec.go). The client
// opens with a hello and the server answers with a welcome; from then on
// the client sends requests and the server answers each with a response
// carrying the request's ID, in any order (the server runs a bounded
// number of requests concurrently), so one connection carries every
// concurrent call of its context.

// ProtocolVersion is the version of the request/response protocol. A server
// refuses a client of another version with a welcome naming both.
// Version 1 was encoding/gob, unbounded; version 2 did not tell an empty
// byte string from none; version 3 carried no C_DigestKey.
const ProtocolVersion = 4

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

// op is a PKCS#11 call.
type op uint8

const (
	opInvalid op = iota
	opGetInfo
	opGetSlotList
	opGetSlotInfo
	opGetTokenInfo
	opGetMechanismList
	opGetMechanismInfo
	opOpenSession
	opCloseSession
	opGetSessionInfo
	opLogin
	opLogout
	opCreateObject
	opCreateObjectNested
	opCopyObject
	opDestroyObject
	opGetAttributeValue
	opGetNestedAttribute
	opSetAttributeValue
	opFindObjectsInit
	opFindObjects
	opFindObjectsFinal
	opGenerateKey
	opGenerateKeyPair
	opWrapKey
	opUnwrapKey
	opDeriveKey
	opGenerateRandom
	opSignInit
	opSign
	opSignUpdate
	opSignFinal
	opVerifyInit
	opVerify
	opVerifyUpdate
	opVerifyFinal
	opEncryptInit
	opEncrypt
	opEncryptUpdate
	opEncryptFinal
	opDecryptInit
	opDecrypt
	opDecryptUpdate
	opDecryptFinal
	opDigestInit
	opDigest
	opDigestUpdate
	opDigestFinal
	opDigestKey
	opCount
)

// request is one call. Fields unused by an op stay zero.
type request struct {
	ID      uint64
	Op      op
	Slot    uint
	Session uint
	Object  uint // object or key handle
	Object2 uint // second key handle (WrapKey: the key wrapped)
	N       uint // flags, user type, token present, count, length, attribute type
	Mech    *mech
	Attrs   []*pkcs11.Attribute
	Attrs2  []*pkcs11.Attribute // GenerateKeyPair: the private template
	Nested  []nestedAttr
	Data    []byte
	Data2   []byte
	PIN     []byte
}

// nestedAttr is one attribute whose value is an attribute array.
type nestedAttr struct {
	Type  uint
	Attrs []*pkcs11.Attribute
}

// response answers the request with the same ID.
type response struct {
	ID      uint64
	RV      uint   // CKR code; 0 is CKR_OK
	Err     string // a failure with no CKR code of its own (RV is then CKR_GENERAL_ERROR)
	Handle  uint
	Handle2 uint
	Handles []uint
	More    bool
	Data    []byte
	Attrs   []*pkcs11.Attribute

	Info        *pkcs11.Info
	SlotInfo    *pkcs11.SlotInfo
	TokenInfo   *pkcs11.TokenInfo
	MechInfo    *pkcs11.MechanismInfo
	SessionInfo *pkcs11.SessionInfo
}

// mech is a mechanism on the wire: its type and parameter bytes as they
// are (pkcs11.Mechanism.Parameter), or, for the parameters miekg builds
// from Go values because they hold pointers, those values.
type mech struct {
	Type    uint
	Param   []byte
	OAEP    *pkcs11.OAEPParams
	ECDH    *pkcs11.ECDH1DeriveParams
	KeyWrap *pkcs11.RSAAESKeyWrapParams
	GCM     *gcmParams
}

type gcmParams struct {
	IV, AAD []byte
	TagBits int
}

// mechOut converts the one mechanism of a miekg call for the wire.
func mechOut(ms []*pkcs11.Mechanism) *mech {
	if len(ms) != 1 || ms[0] == nil {
		return nil
	}
	m := ms[0]
	w := &mech{Type: m.Mechanism, Param: m.Parameter}
	switch g := generatorOf(m).(type) {
	case nil:
		if len(m.Parameter) > 0 && pointerParams[m.Mechanism] {
			flattenRaw(w)
		}
	case *pkcs11.OAEPParams:
		w.OAEP = g
	case *pkcs11.ECDH1DeriveParams:
		w.ECDH = g
	case *pkcs11.RSAAESKeyWrapParams:
		w.KeyWrap = g
	case *pkcs11.GCMParams:
		w.GCM = &gcmParams{
			IV:      unexported[[]byte](g, "iv"),
			AAD:     unexported[[]byte](g, "aad"),
			TagBits: unexported[int](g, "tagSize"),
		}
	}
	return w
}

// pointerParams are the mechanisms whose parameter structure holds
// pointers: given as raw bytes, they mean something only in the
// application's process. The client sends the ones it can decode as
// values (flattenRaw); the server refuses the raw bytes of all of them
// (CKR_MECHANISM_PARAM_INVALID) rather than hand its module pointers into
// nowhere.
var pointerParams = map[uint]bool{
	pkcs11.CKM_RSA_PKCS_OAEP:             true,
	pkcs11.CKM_AES_GCM:                   true,
	pkcs11.CKM_AES_CCM:                   true,
	pkcs11.CKM_ECDH1_DERIVE:              true,
	pkcs11.CKM_ECDH1_COFACTOR_DERIVE:     true,
	pkcs11.CKM_RSA_AES_KEY_WRAP:          true,
	pkcs11.CKM_AES_ECB_ENCRYPT_DATA:      true,
	pkcs11.CKM_AES_CBC_ENCRYPT_DATA:      true,
	pkcs11.CKM_DES_ECB_ENCRYPT_DATA:      true,
	pkcs11.CKM_DES_CBC_ENCRYPT_DATA:      true,
	pkcs11.CKM_DES3_ECB_ENCRYPT_DATA:     true,
	pkcs11.CKM_DES3_CBC_ENCRYPT_DATA:     true,
	pkcs11.CKM_CONCATENATE_BASE_AND_DATA: true,
	pkcs11.CKM_CONCATENATE_DATA_AND_BASE: true,
	pkcs11.CKM_XOR_BASE_AND_DATA:         true,
	pkcs11.CKM_ECMQV_DERIVE:              true,
	pkcs11.CKM_X9_42_DH_DERIVE:           true,
}

// flattenRaw replaces the raw parameter bytes of w by the values they
// point at, for the structures it knows; others stay raw (and are refused
// by the server).
func flattenRaw(w *mech) {
	switch w.Type {
	case pkcs11.CKM_RSA_PKCS_OAEP:
		if o, ok := p11raw.OAEPFromRaw(w.Param); ok {
			w.OAEP, w.Param = o, nil
		}
	case pkcs11.CKM_AES_GCM:
		if iv, aad, tag, ok := p11raw.GCMFromRaw(w.Param); ok {
			w.GCM, w.Param = &gcmParams{IV: iv, AAD: aad, TagBits: tag}, nil
		}
	case pkcs11.CKM_ECDH1_DERIVE, pkcs11.CKM_ECDH1_COFACTOR_DERIVE:
		if e, ok := p11raw.ECDH1FromRaw(w.Param); ok {
			w.ECDH, w.Param = e, nil
		}
	}
}

// errParamPointers refuses raw parameters holding another process's
// pointers.
var errParamPointers = pkcs11.Error(pkcs11.CKR_MECHANISM_PARAM_INVALID)

// mechIn rebuilds a mechanism from the wire; nil when there is none.
func mechIn(w *mech) ([]*pkcs11.Mechanism, error) {
	if w == nil {
		return nil, nil
	}
	if len(w.Param) > 0 && pointerParams[w.Type] {
		return nil, errParamPointers
	}
	var m *pkcs11.Mechanism
	switch {
	case w.OAEP != nil:
		m = pkcs11.NewMechanism(w.Type, w.OAEP)
	case w.ECDH != nil:
		m = pkcs11.NewMechanism(w.Type, w.ECDH)
	case w.KeyWrap != nil:
		m = pkcs11.NewMechanism(w.Type, w.KeyWrap)
	case w.GCM != nil:
		m = pkcs11.NewMechanism(w.Type, pkcs11.NewGCMParams(w.GCM.IV, w.GCM.AAD, w.GCM.TagBits))
	default:
		m = &pkcs11.Mechanism{Mechanism: w.Type, Parameter: w.Param}
	}
	return []*pkcs11.Mechanism{m}, nil
}

// freeMech releases the C memory miekg keeps for GCM parameters.
func freeMech(ms []*pkcs11.Mechanism) {
	if len(ms) == 1 {
		if g, ok := generatorOf(ms[0]).(*pkcs11.GCMParams); ok {
			g.Free()
		}
	}
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
