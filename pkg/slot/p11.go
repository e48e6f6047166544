package slot

import (
	"fmt"
	"os"
	"unsafe"

	"github.com/hagroup/hagroup/internal/p11raw"
	"github.com/hagroup/hagroup/pkg/remote"
	"github.com/miekg/pkcs11"
)

// p11 is the module seam: the PKCS#11 calls this package makes. An
// in-process module is a *pkcs11.Ctx (miekg) plus the nested-template calls
// of internal/p11raw (miekgModule); a token served by another process
// (module path remote.Scheme…) is a *remote.Client.
type p11 interface {
	ctxCalls
	CreateObjectNested(sh pkcs11.SessionHandle, tmpl []*pkcs11.Attribute, nested map[uint][]*pkcs11.Attribute) (pkcs11.ObjectHandle, error)
	GetNestedAttribute(sh pkcs11.SessionHandle, h pkcs11.ObjectHandle, typ uint) ([]*pkcs11.Attribute, error)
}

// ctxCalls is the method set of *pkcs11.Ctx this package uses.
type ctxCalls interface {
	Initialize(opts ...pkcs11.InitializeOption) error
	Finalize() error
	Destroy()
	GetInfo() (pkcs11.Info, error)
	GetSlotList(tokenPresent bool) ([]uint, error)
	GetSlotInfo(slotID uint) (pkcs11.SlotInfo, error)
	GetTokenInfo(slotID uint) (pkcs11.TokenInfo, error)
	GetMechanismList(slotID uint) ([]*pkcs11.Mechanism, error)
	GetMechanismInfo(slotID uint, m []*pkcs11.Mechanism) (pkcs11.MechanismInfo, error)

	OpenSession(slotID uint, flags uint) (pkcs11.SessionHandle, error)
	CloseSession(sh pkcs11.SessionHandle) error
	GetSessionInfo(sh pkcs11.SessionHandle) (pkcs11.SessionInfo, error)
	Login(sh pkcs11.SessionHandle, userType uint, pin string) error
	Logout(sh pkcs11.SessionHandle) error

	CreateObject(sh pkcs11.SessionHandle, temp []*pkcs11.Attribute) (pkcs11.ObjectHandle, error)
	CopyObject(sh pkcs11.SessionHandle, o pkcs11.ObjectHandle, temp []*pkcs11.Attribute) (pkcs11.ObjectHandle, error)
	DestroyObject(sh pkcs11.SessionHandle, oh pkcs11.ObjectHandle) error
	GetAttributeValue(sh pkcs11.SessionHandle, o pkcs11.ObjectHandle, a []*pkcs11.Attribute) ([]*pkcs11.Attribute, error)
	SetAttributeValue(sh pkcs11.SessionHandle, o pkcs11.ObjectHandle, a []*pkcs11.Attribute) error
	FindObjectsInit(sh pkcs11.SessionHandle, temp []*pkcs11.Attribute) error
	FindObjects(sh pkcs11.SessionHandle, max int) ([]pkcs11.ObjectHandle, bool, error)
	FindObjectsFinal(sh pkcs11.SessionHandle) error

	GenerateKey(sh pkcs11.SessionHandle, m []*pkcs11.Mechanism, temp []*pkcs11.Attribute) (pkcs11.ObjectHandle, error)
	GenerateKeyPair(sh pkcs11.SessionHandle, m []*pkcs11.Mechanism, public, private []*pkcs11.Attribute) (pkcs11.ObjectHandle, pkcs11.ObjectHandle, error)
	WrapKey(sh pkcs11.SessionHandle, m []*pkcs11.Mechanism, wrappingkey, key pkcs11.ObjectHandle) ([]byte, error)
	UnwrapKey(sh pkcs11.SessionHandle, m []*pkcs11.Mechanism, unwrappingkey pkcs11.ObjectHandle, wrappedkey []byte, a []*pkcs11.Attribute) (pkcs11.ObjectHandle, error)
	DeriveKey(sh pkcs11.SessionHandle, m []*pkcs11.Mechanism, basekey pkcs11.ObjectHandle, a []*pkcs11.Attribute) (pkcs11.ObjectHandle, error)
	GenerateRandom(sh pkcs11.SessionHandle, length int) ([]byte, error)

	SignInit(sh pkcs11.SessionHandle, m []*pkcs11.Mechanism, o pkcs11.ObjectHandle) error
	Sign(sh pkcs11.SessionHandle, message []byte) ([]byte, error)
	SignUpdate(sh pkcs11.SessionHandle, message []byte) error
	SignFinal(sh pkcs11.SessionHandle) ([]byte, error)
	VerifyInit(sh pkcs11.SessionHandle, m []*pkcs11.Mechanism, key pkcs11.ObjectHandle) error
	Verify(sh pkcs11.SessionHandle, data []byte, signature []byte) error
	VerifyUpdate(sh pkcs11.SessionHandle, part []byte) error
	VerifyFinal(sh pkcs11.SessionHandle, signature []byte) error
	EncryptInit(sh pkcs11.SessionHandle, m []*pkcs11.Mechanism, o pkcs11.ObjectHandle) error
	Encrypt(sh pkcs11.SessionHandle, message []byte) ([]byte, error)
	EncryptUpdate(sh pkcs11.SessionHandle, plain []byte) ([]byte, error)
	EncryptFinal(sh pkcs11.SessionHandle) ([]byte, error)
	DecryptInit(sh pkcs11.SessionHandle, m []*pkcs11.Mechanism, o pkcs11.ObjectHandle) error
	Decrypt(sh pkcs11.SessionHandle, cipher []byte) ([]byte, error)
	DecryptUpdate(sh pkcs11.SessionHandle, cipher []byte) ([]byte, error)
	DecryptFinal(sh pkcs11.SessionHandle) ([]byte, error)
	DigestInit(sh pkcs11.SessionHandle, m []*pkcs11.Mechanism) error
	Digest(sh pkcs11.SessionHandle, message []byte) ([]byte, error)
	DigestUpdate(sh pkcs11.SessionHandle, message []byte) error
	DigestFinal(sh pkcs11.SessionHandle) ([]byte, error)
}

var (
	_ ctxCalls = (*pkcs11.Ctx)(nil)
	_ p11      = (*miekgModule)(nil)
	_ p11      = (*remote.Client)(nil)
)

// miekgModule is an in-process module: miekg's context and the module's
// function list for the nested-template calls.
type miekgModule struct {
	*pkcs11.Ctx
	fl    unsafe.Pointer // CK_FUNCTION_LIST of Ctx; nil when flErr
	flErr error
}

// CreateObjectNested calls C_CreateObject with tmpl plus one attribute
// array per entry of nested.
func (m *miekgModule) CreateObjectNested(sh pkcs11.SessionHandle, tmpl []*pkcs11.Attribute, nested map[uint][]*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	if m.fl == nil {
		return 0, fmt.Errorf("%w: nested templates need the module's function list: %v", ErrInvalidSpec, m.flErr)
	}
	return p11raw.CreateObjectNested(m.fl, sh, tmpl, nested)
}

// GetNestedAttribute reads the attribute array held by attribute typ of h.
func (m *miekgModule) GetNestedAttribute(sh pkcs11.SessionHandle, h pkcs11.ObjectHandle, typ uint) ([]*pkcs11.Attribute, error) {
	if m.fl == nil {
		return nil, fmt.Errorf("%w: nested templates need the module's function list: %v", ErrInvalidSpec, m.flErr)
	}
	return p11raw.GetNestedAttribute(m.fl, sh, h, typ)
}

// loadModule loads the module of path, not initialised yet. id identifies
// the module instance (its function list) so that one loaded twice under
// different paths is shared; nil when unknown (remote tokens, or a module
// whose function list could not be read). serverUID is for remote tokens
// (remote.NewClient).
func loadModule(path string, serverUID *uint32) (c p11, id unsafe.Pointer, err error) {
	if remote.IsModulePath(path) {
		rc, err := remote.NewClient(path, serverUID)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %v", ErrInvalidSpec, err)
		}
		return rc, nil, nil
	}
	mc := pkcs11.New(path)
	if mc == nil {
		if _, err := os.Stat(path); err != nil {
			return nil, nil, fmt.Errorf("load PKCS#11 module: %w", err)
		}
		return nil, nil, fmt.Errorf("load PKCS#11 module %s: dlopen failed or no C_GetFunctionList", path)
	}
	fl, flErr := p11raw.FunctionList(mc, path)
	return &miekgModule{Ctx: mc, fl: fl, flErr: flErr}, fl, nil
}
