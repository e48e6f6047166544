package object

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// NoKeyType is Identity.KeyType for objects that have no CKA_KEY_TYPE
// (certificates, data objects).
const NoKeyType = ^uint(0)

// Identity is what makes two objects on different members "the same
// object": CKA_CLASS + CKA_KEY_TYPE + CKA_ID + CKA_LABEL. Handles differ
// per member and per login; the identity does not.
type Identity struct {
	Class   uint   // CKA_CLASS
	KeyType uint   // CKA_KEY_TYPE, NoKeyType when the class has none
	ID      []byte // CKA_ID, empty when unset
	Label   string // CKA_LABEL, empty when unset
}

// Key returns a string that is equal for two identities exactly when they
// are equal, for use as a map key.
func (id Identity) Key() string {
	// The label goes last: the hex fields contain no '/', so the
	// encoding is unambiguous whatever the label holds.
	return strconv.FormatUint(uint64(id.Class), 16) + "/" +
		strconv.FormatUint(uint64(id.KeyType), 16) + "/" +
		hex.EncodeToString(id.ID) + "/" + id.Label
}

// Equal reports whether id and o name the same object.
func (id Identity) Equal(o Identity) bool { return id.Key() == o.Key() }

// String describes the identity for messages: class, key type, hex ID and
// quoted label, e.g. `private key EC id=0a01 label="signer"`.
func (id Identity) String() string {
	s := ClassName(id.Class)
	if id.KeyType != NoKeyType {
		s += " " + KeyTypeName(id.KeyType)
	}
	return fmt.Sprintf("%s id=%s label=%q", s, hexOrNone(id.ID), id.Label)
}

// Template returns the FindObjects template matching id exactly. CKA_ID
// is left out for classes without it (data objects): a token matches no
// object on an attribute the object lacks.
func (id Identity) Template() []*pkcs11.Attribute {
	t := []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, id.Class),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, []byte(id.Label)),
	}
	if hasID(id.Class) || len(id.ID) > 0 {
		t = append(t, pkcs11.NewAttribute(pkcs11.CKA_ID, NonNil(id.ID)))
	}
	if id.KeyType != NoKeyType {
		t = append(t, pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, id.KeyType))
	}
	return t
}

// hasID reports whether objects of class carry CKA_ID.
func hasID(class uint) bool {
	switch class {
	case pkcs11.CKO_CERTIFICATE, pkcs11.CKO_PUBLIC_KEY, pkcs11.CKO_PRIVATE_KEY, pkcs11.CKO_SECRET_KEY:
		return true
	}
	return false
}

// NonNil is b, or an empty slice for nil.
func NonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

func hexOrNone(b []byte) string {
	if len(b) == 0 {
		return "none"
	}
	return hex.EncodeToString(b)
}

// FormatFingerprint renders a fingerprint for messages ("none" when nil).
func FormatFingerprint(fp []byte) string { return hexOrNone(fp) }

// Object is one object on one member as List and ReadObject see it.
type Object struct {
	Identity
	Handle pkcs11.ObjectHandle // valid on that member until its next logout
	// Fingerprint is the SHA-256 of the public key (for public keys and
	// private halves), the key check value (secret keys) or the SHA-256 of
	// CKA_VALUE (certificates, data objects). Nil when the member cannot
	// say (see ErrNoFingerprint); such objects cannot be told apart from a
	// different object under the same identity.
	Fingerprint []byte
	Token       bool // CKA_TOKEN
	Private     bool // CKA_PRIVATE
}

// ClassName names a CKO_ class for messages.
func ClassName(c uint) string {
	switch c {
	case pkcs11.CKO_DATA:
		return "data"
	case pkcs11.CKO_CERTIFICATE:
		return "certificate"
	case pkcs11.CKO_PUBLIC_KEY:
		return "public key"
	case pkcs11.CKO_PRIVATE_KEY:
		return "private key"
	case pkcs11.CKO_SECRET_KEY:
		return "secret key"
	}
	return fmt.Sprintf("class 0x%x", c)
}

// KeyTypeName names a CKK_ key type for messages.
func KeyTypeName(k uint) string {
	switch k {
	case pkcs11.CKK_RSA:
		return "RSA"
	case pkcs11.CKK_DSA:
		return "DSA"
	case pkcs11.CKK_DH:
		return "DH"
	case pkcs11.CKK_EC:
		return "EC"
	case slot.CKKECEdwards:
		return "EC_EDWARDS"
	case slot.CKKECMontgomery:
		return "EC_MONTGOMERY"
	case pkcs11.CKK_GENERIC_SECRET:
		return "GENERIC_SECRET"
	case pkcs11.CKK_AES:
		return "AES"
	case pkcs11.CKK_DES3:
		return "DES3"
	case pkcs11.CKK_DES:
		return "DES"
	case pkcs11.CKK_DES2:
		return "DES2"
	}
	return fmt.Sprintf("key type 0x%x", k)
}

// The labels of the group's own objects start with these (see Hidden).
const (
	DomainLabelPrefix = "hagroup-domain:"
	StateLabelPrefix  = "hagroup-state:"
)

// Hidden reports whether an object of this class and label belongs to the
// group itself — its domain key, or group state — and so is never shown
// to an application, copied or deleted by a plan.
func Hidden(class uint, label string) bool {
	switch class {
	case pkcs11.CKO_SECRET_KEY:
		return strings.HasPrefix(label, DomainLabelPrefix) || strings.HasPrefix(label, StateLabelPrefix)
	case pkcs11.CKO_DATA:
		return strings.HasPrefix(label, StateLabelPrefix)
	}
	return false
}

// ErrConflict is wrapped by errors saying that two members hold different
// objects under one identity (the duplicate-label hazard). It is reported,
// never resolved by guessing. Use errors.As with *ConflictError for the
// details.
var ErrConflict = errors.New("conflict")

// ConflictError says member Member holds Identity with fingerprint Have
// where the source has Want.
type ConflictError struct {
	Identity Identity
	Member   string
	Want     []byte // the source's fingerprint
	Have     []byte // the fingerprint on Member
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("member %s: %s: %v: it holds fingerprint %s, the source has %s",
		e.Member, e.Identity, ErrConflict, FormatFingerprint(e.Have), FormatFingerprint(e.Want))
}

// Unwrap makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Unwrap() error { return ErrConflict }
