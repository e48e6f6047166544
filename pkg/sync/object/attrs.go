package object

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// Store is the part of *slot.Slot and *slot.Session this package uses, so
// that session objects can be read and made through a dedicated session.
type Store interface {
	FindObjects(ctx context.Context, tmpl []*pkcs11.Attribute) ([]pkcs11.ObjectHandle, error)
	GetAttributes(ctx context.Context, h pkcs11.ObjectHandle, types []uint) ([]slot.Attribute, error)
	CreateObject(ctx context.Context, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error)
	DestroyObject(ctx context.Context, h pkcs11.ObjectHandle) error
	SetAttributes(ctx context.Context, h pkcs11.ObjectHandle, attrs []*pkcs11.Attribute) error
	WrapKey(ctx context.Context, m *pkcs11.Mechanism, wrapping, key pkcs11.ObjectHandle) ([]byte, error)
	UnwrapKey(ctx context.Context, m *pkcs11.Mechanism, unwrapping pkcs11.ObjectHandle, blob []byte, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error)
	Encrypt(ctx context.Context, m *pkcs11.Mechanism, key pkcs11.ObjectHandle, data []byte) ([]byte, error)
	Sign(ctx context.Context, m *pkcs11.Mechanism, key pkcs11.ObjectHandle, data []byte) ([]byte, error)
}

var (
	_ Store = (*slot.Slot)(nil)
	_ Store = (*slot.Session)(nil)
)

// Attrs is the result of one GetAttributes call, by type. Only attributes
// the token returned with CKR_OK are present.
type Attrs map[uint][]byte

// ReadAttrs reads types of h in one GetAttributes call.
func ReadAttrs(ctx context.Context, s Store, h pkcs11.ObjectHandle, types []uint) (Attrs, error) {
	got, err := s.GetAttributes(ctx, h, types)
	if err != nil {
		return nil, err
	}
	a := make(Attrs, len(got))
	for _, g := range got {
		if g.Status == pkcs11.CKR_OK {
			a[g.Type] = NonNil(g.Value)
		}
	}
	return a, nil
}

func (a Attrs) Has(t uint) bool { _, ok := a[t]; return ok }

// nonEmpty reports whether t is present with a non-empty value.
func (a Attrs) NonEmpty(t uint) bool { return len(a[t]) > 0 }

// ulong decodes a CK_ULONG attribute.
func (a Attrs) Ulong(t uint) (uint, bool) {
	v, ok := a[t]
	if !ok {
		return 0, false
	}
	switch len(v) {
	case 8:
		return uint(binary.NativeEndian.Uint64(v)), true
	case 4:
		return uint(binary.NativeEndian.Uint32(v)), true
	}
	return 0, false
}

// boolean decodes a CK_BBOOL attribute; absent reads as false.
func (a Attrs) Boolean(t uint) bool {
	v := a[t]
	return len(v) > 0 && v[0] != 0
}

// attribute returns t as a template attribute with its raw value.
func (a Attrs) Attribute(t uint) *pkcs11.Attribute {
	return &pkcs11.Attribute{Type: t, Value: a[t]}
}

// BoolAttr is a boolean attribute of type t.
func BoolAttr(t uint, v bool) *pkcs11.Attribute { return pkcs11.NewAttribute(t, v) }

// Attributes every object class shares that a copy carries over.
var commonCopy = []uint{
	pkcs11.CKA_TOKEN, pkcs11.CKA_PRIVATE, pkcs11.CKA_LABEL, pkcs11.CKA_MODIFIABLE,
	pkcs11.CKA_COPYABLE, pkcs11.CKA_DESTROYABLE,
}

// Attributes every key shares that a copy carries over.
var keyCopy = append(append([]uint{}, commonCopy...),
	pkcs11.CKA_ID, pkcs11.CKA_START_DATE, pkcs11.CKA_END_DATE, pkcs11.CKA_DERIVE,
	pkcs11.CKA_ALLOWED_MECHANISMS)

// UnwrapTypes lists, per class, the source attributes put into an unwrap
// template (besides CKA_CLASS and CKA_KEY_TYPE). Key material is absent:
// it comes from the blob, and SoftHSM answers CKR_ATTRIBUTE_READ_ONLY to
// CKA_EC_PARAMS or CKA_PUBLIC_EXPONENT in an unwrap template.
var UnwrapTypes = map[uint][]uint{
	pkcs11.CKO_PRIVATE_KEY: append(append([]uint{}, keyCopy...),
		pkcs11.CKA_SUBJECT, pkcs11.CKA_SENSITIVE, pkcs11.CKA_EXTRACTABLE,
		pkcs11.CKA_DECRYPT, pkcs11.CKA_SIGN, pkcs11.CKA_SIGN_RECOVER, pkcs11.CKA_UNWRAP,
		pkcs11.CKA_ALWAYS_AUTHENTICATE, pkcs11.CKA_WRAP_WITH_TRUSTED, pkcs11.CKA_PUBLIC_KEY_INFO),
	pkcs11.CKO_SECRET_KEY: append(append([]uint{}, keyCopy...),
		pkcs11.CKA_SENSITIVE, pkcs11.CKA_EXTRACTABLE,
		pkcs11.CKA_ENCRYPT, pkcs11.CKA_DECRYPT, pkcs11.CKA_SIGN, pkcs11.CKA_VERIFY,
		pkcs11.CKA_WRAP, pkcs11.CKA_UNWRAP, pkcs11.CKA_WRAP_WITH_TRUSTED),
}

// CopyTypes lists the attributes copied when an object is created from
// the source's attributes. CKA_TRUSTED is never copied: only the SO may
// set it. Nested templates (CKA_WRAP_TEMPLATE…) are not copied. A public
// key's list names only the material its key type has: an attribute the
// object lacks makes the token refuse the whole read, and pkg/slot then
// asks once per attribute (docs/BENCHMARKS.md, "SoftHSM costs the code is
// shaped by").
func CopyTypes(class, keyType uint) ([]uint, error) {
	switch class {
	case pkcs11.CKO_PUBLIC_KEY:
		t := append(append([]uint{pkcs11.CKA_CLASS, pkcs11.CKA_KEY_TYPE}, keyCopy...),
			pkcs11.CKA_SUBJECT, pkcs11.CKA_ENCRYPT, pkcs11.CKA_VERIFY, pkcs11.CKA_VERIFY_RECOVER,
			pkcs11.CKA_WRAP, pkcs11.CKA_PUBLIC_KEY_INFO)
		switch keyType {
		case pkcs11.CKK_RSA:
			return append(t, pkcs11.CKA_MODULUS, pkcs11.CKA_PUBLIC_EXPONENT), nil
		case pkcs11.CKK_EC, slot.CKKECEdwards, slot.CKKECMontgomery:
			return append(t, pkcs11.CKA_EC_PARAMS, pkcs11.CKA_EC_POINT), nil
		case pkcs11.CKK_DH:
			return append(t, pkcs11.CKA_PRIME, pkcs11.CKA_BASE, pkcs11.CKA_VALUE), nil
		case pkcs11.CKK_DSA:
			return append(t, pkcs11.CKA_PRIME, pkcs11.CKA_SUBPRIME, pkcs11.CKA_BASE, pkcs11.CKA_VALUE), nil
		}
		return append(t, pkcs11.CKA_MODULUS, pkcs11.CKA_PUBLIC_EXPONENT,
			pkcs11.CKA_EC_PARAMS, pkcs11.CKA_EC_POINT,
			pkcs11.CKA_PRIME, pkcs11.CKA_SUBPRIME, pkcs11.CKA_BASE, pkcs11.CKA_VALUE), nil
	case pkcs11.CKO_CERTIFICATE:
		return append(append([]uint{pkcs11.CKA_CLASS, pkcs11.CKA_CERTIFICATE_TYPE, pkcs11.CKA_ID}, commonCopy...),
			pkcs11.CKA_SUBJECT, pkcs11.CKA_ISSUER, pkcs11.CKA_SERIAL_NUMBER, pkcs11.CKA_VALUE,
			pkcs11.CKA_CERTIFICATE_CATEGORY, pkcs11.CKA_START_DATE, pkcs11.CKA_END_DATE,
			pkcs11.CKA_URL, pkcs11.CKA_HASH_OF_SUBJECT_PUBLIC_KEY, pkcs11.CKA_HASH_OF_ISSUER_PUBLIC_KEY,
			pkcs11.CKA_JAVA_MIDP_SECURITY_DOMAIN), nil
	case pkcs11.CKO_DATA:
		return append(append([]uint{pkcs11.CKA_CLASS}, commonCopy...),
			pkcs11.CKA_APPLICATION, pkcs11.CKA_OBJECT_ID, pkcs11.CKA_VALUE), nil
	}
	return nil, fmt.Errorf("objects of class %s cannot be replicated", ClassName(class))
}

// KeepEmpty attributes are copied even when empty: an empty CKA_VALUE is
// still the object's value.
var KeepEmpty = map[uint]bool{pkcs11.CKA_VALUE: true}

// IsGone reports whether err says the object no longer exists.
func IsGone(err error) bool {
	return err != nil && slot.CodeOf(err) == pkcs11.CKR_OBJECT_HANDLE_INVALID
}

// MechanismAllowed reports whether a's CKA_ALLOWED_MECHANISMS, if any, names mech.
func MechanismAllowed(a Attrs, mech uint) bool {
	v := a[pkcs11.CKA_ALLOWED_MECHANISMS]
	if len(v) == 0 {
		return true
	}
	for i := 0; i+8 <= len(v); i += 8 {
		if uint(binary.NativeEndian.Uint64(v[i:])) == mech {
			return true
		}
	}
	return false
}

// Override returns tmpl with every attribute of forced replacing or
// joining those of the same type.
func Override(tmpl, forced []*pkcs11.Attribute) []*pkcs11.Attribute {
	out := make([]*pkcs11.Attribute, 0, len(tmpl)+len(forced))
	isForced := map[uint]bool{}
	for _, f := range forced {
		isForced[f.Type] = true
	}
	for _, a := range tmpl {
		if !isForced[a.Type] {
			out = append(out, a)
		}
	}
	return append(out, forced...)
}

// cleanupTimeout bounds the removal of a half-made object after a
// failure, which must run even when the caller's context has expired.
const cleanupTimeout = 15 * time.Second

// BoundedContext is a context for such a removal, and its cancel.
type BoundedContext struct {
	Ctx    context.Context
	Cancel context.CancelFunc
}

// CleanupContext bounds a removal by cleanupTimeout, whether ctx has
// expired or not.
func CleanupContext(ctx context.Context) BoundedContext {
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	return BoundedContext{c, cancel}
}

// Discard destroys a throwaway object (a transit or trial key), even
// when ctx has expired. A failure leaves a session object that goes with
// its session.
func Discard(ctx context.Context, s Store, t pkcs11.ObjectHandle) {
	c := CleanupContext(ctx)
	defer c.Cancel()
	_ = s.DestroyObject(c.Ctx, t)
}
