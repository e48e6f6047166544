package slot_test

// The contract other packages build on (pkg/slot's exported API): a
// change of any of these signatures fails the build of the tests.

import (
	"context"

	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

var (
	_ func(context.Context, slot.Spec) (*slot.Slot, error)               = slot.Open
	_ func(context.Context, slot.ModuleRef) ([]slot.TokenSummary, error) = slot.ListModuleTokens
	_ func(error) slot.Class                                             = slot.ClassOf
	_ func(error) uint                                                   = slot.CodeOf
)

type single interface {
	FindObjects(ctx context.Context, tmpl []*pkcs11.Attribute) ([]pkcs11.ObjectHandle, error)
	GetAttributes(ctx context.Context, h pkcs11.ObjectHandle, types []uint) ([]slot.Attribute, error)
	SetAttributes(ctx context.Context, h pkcs11.ObjectHandle, attrs []*pkcs11.Attribute) error
	CreateObject(ctx context.Context, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error)
	CreateObjectNested(ctx context.Context, tmpl []*pkcs11.Attribute, nested map[uint][]*pkcs11.Attribute) (pkcs11.ObjectHandle, error)
	CopyObject(ctx context.Context, h pkcs11.ObjectHandle, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error)
	DestroyObject(ctx context.Context, h pkcs11.ObjectHandle) error
	GenerateKey(ctx context.Context, m *pkcs11.Mechanism, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error)
	GenerateKeyPair(ctx context.Context, m *pkcs11.Mechanism, pub, priv []*pkcs11.Attribute) (pkcs11.ObjectHandle, pkcs11.ObjectHandle, error)
	WrapKey(ctx context.Context, m *pkcs11.Mechanism, wrapping, key pkcs11.ObjectHandle) ([]byte, error)
	UnwrapKey(ctx context.Context, m *pkcs11.Mechanism, unwrapping pkcs11.ObjectHandle, blob []byte, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error)
	DeriveKey(ctx context.Context, m *pkcs11.Mechanism, base pkcs11.ObjectHandle, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error)
	Sign(ctx context.Context, m *pkcs11.Mechanism, key pkcs11.ObjectHandle, data []byte) ([]byte, error)
	Verify(ctx context.Context, m *pkcs11.Mechanism, key pkcs11.ObjectHandle, data, sig []byte) error
	Encrypt(ctx context.Context, m *pkcs11.Mechanism, key pkcs11.ObjectHandle, data []byte) ([]byte, error)
	Decrypt(ctx context.Context, m *pkcs11.Mechanism, key pkcs11.ObjectHandle, data []byte) ([]byte, error)
	Digest(ctx context.Context, m *pkcs11.Mechanism, data []byte) ([]byte, error)
	GenerateRandom(ctx context.Context, n int) ([]byte, error)
}

type slotAPI interface {
	single
	Name() string
	SlotID() uint
	OwnsContext() bool
	LoggedIn() bool
	TokenInfo(ctx context.Context) (pkcs11.TokenInfo, error)
	Mechanisms(ctx context.Context) ([]uint, error)
	MechanismInfo(ctx context.Context, mech uint) (pkcs11.MechanismInfo, error)
	Login(ctx context.Context, userType uint, pin secret.PIN) error
	Logout(ctx context.Context) error
	Reinit(ctx context.Context) error
	Close() error
	OpenSession(ctx context.Context) (*slot.Session, error)
}

type sessionAPI interface {
	single
	Init(ctx context.Context, k slot.Kind, m *pkcs11.Mechanism, key pkcs11.ObjectHandle) error
	Initialized(ctx context.Context, k slot.Kind, in, sig []byte) ([]byte, error)
	Update(ctx context.Context, k slot.Kind, in []byte) ([]byte, error)
	Final(ctx context.Context, k slot.Kind, sig []byte) ([]byte, error)
	DigestKey(ctx context.Context, key pkcs11.ObjectHandle) error
	Close() error
}

var (
	_ slotAPI    = (*slot.Slot)(nil)
	_ sessionAPI = (*slot.Session)(nil)
)
