package slot

import (
	"errors"

	"github.com/hagroup/hagroup/internal/p11raw"
	"github.com/miekg/pkcs11"
)

// The raw operations, run on a session's worker goroutine. Slot and Session
// methods wrap them with a session and a deadline.

// findBatch is how many handles one C_FindObjects call asks for.
const findBatch = 256

func mechs(m *pkcs11.Mechanism) []*pkcs11.Mechanism { return []*pkcs11.Mechanism{m} }

func (x *sess) findObjects(tmpl []*pkcs11.Attribute) ([]pkcs11.ObjectHandle, error) {
	if err := x.ctx.FindObjectsInit(x.h, tmpl); err != nil {
		return nil, err
	}
	var out []pkcs11.ObjectHandle
	for {
		hs, _, err := x.ctx.FindObjects(x.h, findBatch)
		if err != nil {
			_ = x.ctx.FindObjectsFinal(x.h)
			return nil, err
		}
		out = append(out, hs...)
		if len(hs) < findBatch {
			break
		}
	}
	if err := x.ctx.FindObjectsFinal(x.h); err != nil {
		return nil, err
	}
	return out, nil
}

// getAttributes reads types in one call; when the token refuses some of
// them (sensitive, or not an attribute of the object) it reads them one by
// one so that every attribute gets its own status.
func (x *sess) getAttributes(h pkcs11.ObjectHandle, types []uint) ([]Attribute, error) {
	out := make([]Attribute, len(types))
	if len(types) == 0 {
		return out, nil
	}
	got, err := x.readAttributes(h, types)
	if err == nil {
		for i, v := range got {
			out[i] = Attribute{Type: types[i], Value: v, Status: pkcs11.CKR_OK}
		}
		return out, nil
	}
	if !perAttribute(err) {
		return nil, err
	}
	for i, t := range types {
		out[i].Type = t
		got, err := x.readAttributes(h, []uint{t})
		switch {
		case err == nil:
			out[i].Value, out[i].Status = got[0], pkcs11.CKR_OK
		case perAttribute(err):
			out[i].Status = uint(err.(pkcs11.Error))
		default:
			return nil, err
		}
	}
	return out, nil
}

// readAttributes returns the values of types, each read attribute costing
// the token one call in an in-process module (internal/p11raw), where
// miekg makes two (lengths, then values): an identity, a fingerprint, an
// application's C_GetAttributeValue cost what they cost on a bare token.
// A served token, or a value longer than p11raw.AttrRoom, is read miekg's
// way.
func (x *sess) readAttributes(h pkcs11.ObjectHandle, types []uint) ([][]byte, error) {
	if mm, ok := x.ctx.(*miekgModule); ok && mm.fl != nil {
		vals, rv := p11raw.GetAttributes(mm.fl, x.h, h, types)
		switch rv {
		case pkcs11.CKR_OK:
			return vals, nil
		case pkcs11.CKR_BUFFER_TOO_SMALL:
		default:
			return nil, pkcs11.Error(rv)
		}
	}
	q := make([]*pkcs11.Attribute, len(types))
	for i, t := range types {
		q[i] = &pkcs11.Attribute{Type: t}
	}
	got, err := x.ctx.GetAttributeValue(x.h, h, q)
	if err != nil {
		return nil, err
	}
	vals := make([][]byte, len(got))
	for i, a := range got {
		vals[i] = a.Value
	}
	return vals, nil
}

// perAttribute reports whether err is a status of single attributes rather
// than of the call.
func perAttribute(err error) bool {
	var pe pkcs11.Error
	return errors.As(err, &pe) && (pe == pkcs11.CKR_ATTRIBUTE_SENSITIVE || pe == pkcs11.CKR_ATTRIBUTE_TYPE_INVALID)
}

func (x *sess) createObjectNested(tmpl []*pkcs11.Attribute, nested map[uint][]*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	return x.ctx.CreateObjectNested(x.h, tmpl, nested)
}

func (x *sess) getNestedAttribute(h pkcs11.ObjectHandle, typ uint) ([]*pkcs11.Attribute, error) {
	return x.ctx.GetNestedAttribute(x.h, h, typ)
}

// checkMech refuses a nil mechanism before it reaches cgo.
func checkMech(member string, op Op, m *pkcs11.Mechanism) error {
	if m == nil {
		return invalid(member, op, "no mechanism")
	}
	return nil
}
