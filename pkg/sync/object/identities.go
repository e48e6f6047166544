package object

import (
	"context"
	"slices"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// The cheap side of object identity, for pkg/group's virtual object table:
// what an object is called, read without its key material, and the
// template that finds the token objects of an identity.

// TokenTemplate finds exactly the token objects with identity id.
func TokenTemplate(id Identity) []*pkcs11.Attribute {
	t := []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, id.Class),
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, []byte(id.Label)),
	}
	if id.Class != pkcs11.CKO_DATA { // data objects have no CKA_ID: it would match nothing
		t = append(t, pkcs11.NewAttribute(pkcs11.CKA_ID, NonNil(id.ID)))
	}
	if id.KeyType != NoKeyType {
		t = append(t, pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, id.KeyType))
	}
	return t
}

var nameTypes = []uint{pkcs11.CKA_CLASS, pkcs11.CKA_KEY_TYPE, pkcs11.CKA_ID, pkcs11.CKA_LABEL, pkcs11.CKA_TOKEN}

// ReadIdentity reads the identity and storage flag of h on s, in one
// GetAttributes call. ok is false for an object destroyed meanwhile and
// for the group's own (Hidden), which the application never sees. An
// empty CKA_ID reads as nil.
func ReadIdentity(ctx context.Context, s *slot.Slot, h pkcs11.ObjectHandle) (id Identity, token, ok bool, err error) {
	a, err := ReadAttrs(ctx, s, h, nameTypes)
	if err != nil {
		if slot.ClassOf(err) == slot.ClassRequest {
			return id, false, false, nil // destroyed meanwhile
		}
		return id, false, false, err
	}
	id.Class, _ = a.Ulong(pkcs11.CKA_CLASS)
	if id.KeyType, ok = a.Ulong(pkcs11.CKA_KEY_TYPE); !ok {
		id.KeyType = NoKeyType
	}
	if len(a[pkcs11.CKA_ID]) > 0 {
		id.ID = slices.Clone(a[pkcs11.CKA_ID])
	}
	id.Label = string(a[pkcs11.CKA_LABEL])
	return id, a.Boolean(pkcs11.CKA_TOKEN), !Hidden(id.Class, id.Label), nil
}

// ListIdentities lists the objects on s the current login can see with
// their identity and storage flag only (no key material, no fingerprint):
// one FindObjects and one GetAttributes per object (ReadIdentity). The
// group's own objects are left out.
func ListIdentities(ctx context.Context, s *slot.Slot) ([]Object, error) {
	hs, err := s.FindObjects(ctx, nil)
	if err != nil {
		return nil, err
	}
	out := make([]Object, 0, len(hs))
	for _, h := range hs {
		id, token, ok, err := ReadIdentity(ctx, s, h)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, Object{Identity: id, Handle: h, Token: token})
		}
	}
	return out, nil
}
