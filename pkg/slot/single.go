package slot

import (
	"context"
	"time"

	"github.com/hagroup/hagroup/pkg/remote"
	"github.com/miekg/pkcs11"
)

// operations are the calls a Slot (on a pooled session per call) and a
// Session (on its dedicated session) share, written once here; both embed
// them. run makes one call, fn or the one-shot a when fn is nil (shot.go):
// Slot.do for a Slot, Session.callWith for a Session.
type operations struct {
	on  *Slot
	run func(ctx context.Context, op Op, t time.Duration, fn func(*sess) error, a *shotArgs) error
}

// call runs fn under the command timeout, or under the key generation
// timeout.
func (o operations) call(ctx context.Context, op Op, keygen bool, fn func(*sess) error) error {
	t := o.on.cmdTimeout
	if keygen {
		t = o.on.keyTimeout
	}
	return o.run(ctx, op, t, fn, nil)
}

func (o operations) member() string { return o.on.spec.Name }

// result runs fn like call and returns what it returned. The result is
// read only once the call returned it, never after an abandoned call: the
// worker of an abandoned call may still write it when the module finally
// answers.
func result[T any](ctx context.Context, o operations, op Op, keygen bool, fn func(*sess) (T, error)) (T, error) {
	var out T
	err := o.call(ctx, op, keygen, func(x *sess) error {
		v, err := fn(x)
		out = v
		return err
	})
	if err != nil {
		var zero T
		return zero, err
	}
	return out, nil
}

// FindObjects returns the handles of every object matching tmpl (on a
// Session, its own session objects included).
func (o operations) FindObjects(ctx context.Context, tmpl []*pkcs11.Attribute) ([]pkcs11.ObjectHandle, error) {
	return result(ctx, o, OpFindObjects, false, func(x *sess) ([]pkcs11.ObjectHandle, error) { return x.findObjects(tmpl) })
}

// GetAttributes reads attributes of h, each with its own status
// (CKR_OK, CKR_ATTRIBUTE_SENSITIVE or CKR_ATTRIBUTE_TYPE_INVALID).
func (o operations) GetAttributes(ctx context.Context, h pkcs11.ObjectHandle, types []uint) ([]Attribute, error) {
	return result(ctx, o, OpGetAttributes, false, func(x *sess) ([]Attribute, error) { return x.getAttributes(h, types) })
}

// GetNestedAttribute reads an attribute whose value is an attribute array
// (CKA_WRAP_TEMPLATE, CKA_UNWRAP_TEMPLATE, CKA_DERIVE_TEMPLATE).
func (o operations) GetNestedAttribute(ctx context.Context, h pkcs11.ObjectHandle, typ uint) ([]*pkcs11.Attribute, error) {
	return result(ctx, o, OpGetAttributes, false, func(x *sess) ([]*pkcs11.Attribute, error) { return x.getNestedAttribute(h, typ) })
}

// SetAttributes sets attributes of h.
func (o operations) SetAttributes(ctx context.Context, h pkcs11.ObjectHandle, attrs []*pkcs11.Attribute) error {
	return o.call(ctx, OpSetAttributes, false, func(x *sess) error {
		return x.ctx.SetAttributeValue(x.h, h, attrs)
	})
}

// CreateObject creates an object.
func (o operations) CreateObject(ctx context.Context, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	return result(ctx, o, OpCreateObject, false, func(x *sess) (pkcs11.ObjectHandle, error) { return x.ctx.CreateObject(x.h, tmpl) })
}

// CreateObjectNested creates an object whose template also holds
// attribute-array attributes: nested maps CKA_WRAP_TEMPLATE,
// CKA_UNWRAP_TEMPLATE or CKA_DERIVE_TEMPLATE to the attributes of the array.
// A session object made by a Slot lives as long as the pooled session it
// was made on: use a Session's for session objects.
func (o operations) CreateObjectNested(ctx context.Context, tmpl []*pkcs11.Attribute, nested map[uint][]*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	if err := checkNested(tmpl, nested); err != nil {
		return 0, invalid(o.member(), OpCreateObject, "%v", err)
	}
	return result(ctx, o, OpCreateObject, false, func(x *sess) (pkcs11.ObjectHandle, error) { return x.createObjectNested(tmpl, nested) })
}

// CopyObject copies h, changing the attributes in tmpl.
func (o operations) CopyObject(ctx context.Context, h pkcs11.ObjectHandle, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	return result(ctx, o, OpCopyObject, false, func(x *sess) (pkcs11.ObjectHandle, error) { return x.ctx.CopyObject(x.h, h, tmpl) })
}

// DestroyObject destroys h.
func (o operations) DestroyObject(ctx context.Context, h pkcs11.ObjectHandle) error {
	return o.call(ctx, OpDestroyObject, false, func(x *sess) error {
		return x.ctx.DestroyObject(x.h, h)
	})
}

// GenerateKey generates a secret key under the key generation timeout.
func (o operations) GenerateKey(ctx context.Context, m *pkcs11.Mechanism, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	if err := checkMech(o.member(), OpGenerateKey, m); err != nil {
		return 0, err
	}
	return result(ctx, o, OpGenerateKey, true, func(x *sess) (pkcs11.ObjectHandle, error) { return x.ctx.GenerateKey(x.h, mechs(m), tmpl) })
}

// GenerateKeyPair generates a key pair under the key generation timeout and
// returns the public and the private key.
func (o operations) GenerateKeyPair(ctx context.Context, m *pkcs11.Mechanism, pub, priv []*pkcs11.Attribute) (pkcs11.ObjectHandle, pkcs11.ObjectHandle, error) {
	if err := checkMech(o.member(), OpGenerateKeyPair, m); err != nil {
		return 0, 0, err
	}
	var hpub, hpriv pkcs11.ObjectHandle // read as result reads its result
	err := o.call(ctx, OpGenerateKeyPair, true, func(x *sess) error {
		a, b, err := x.ctx.GenerateKeyPair(x.h, mechs(m), pub, priv)
		hpub, hpriv = a, b
		return err
	})
	if err != nil {
		return 0, 0, err
	}
	return hpub, hpriv, nil
}

// WrapKey wraps key under wrapping.
func (o operations) WrapKey(ctx context.Context, m *pkcs11.Mechanism, wrapping, key pkcs11.ObjectHandle) ([]byte, error) {
	if err := checkMech(o.member(), OpWrapKey, m); err != nil {
		return nil, err
	}
	return result(ctx, o, OpWrapKey, false, func(x *sess) ([]byte, error) { return x.ctx.WrapKey(x.h, mechs(m), wrapping, key) })
}

// UnwrapKey unwraps blob under unwrapping into a new key with tmpl.
func (o operations) UnwrapKey(ctx context.Context, m *pkcs11.Mechanism, unwrapping pkcs11.ObjectHandle, blob []byte, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	if err := checkMech(o.member(), OpUnwrapKey, m); err != nil {
		return 0, err
	}
	if err := remote.WrappedKeyMissing(blob); err != nil {
		return 0, err
	}
	return result(ctx, o, OpUnwrapKey, false, func(x *sess) (pkcs11.ObjectHandle, error) {
		return x.ctx.UnwrapKey(x.h, mechs(m), unwrapping, blob, tmpl)
	})
}

// DeriveKey derives a new key with tmpl from base.
func (o operations) DeriveKey(ctx context.Context, m *pkcs11.Mechanism, base pkcs11.ObjectHandle, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	if err := checkMech(o.member(), OpDeriveKey, m); err != nil {
		return 0, err
	}
	return result(ctx, o, OpDeriveKey, false, func(x *sess) (pkcs11.ObjectHandle, error) { return x.ctx.DeriveKey(x.h, mechs(m), base, tmpl) })
}

// Sign signs data with key in one part.
func (o operations) Sign(ctx context.Context, m *pkcs11.Mechanism, key pkcs11.ObjectHandle, data []byte) ([]byte, error) {
	return o.Single(ctx, KindSign, m, key, data, nil)
}

// Verify verifies sig over data with key in one part; a bad signature is
// CKR_SIGNATURE_INVALID (class request).
func (o operations) Verify(ctx context.Context, m *pkcs11.Mechanism, key pkcs11.ObjectHandle, data, sig []byte) error {
	_, err := o.Single(ctx, KindVerify, m, key, data, sig)
	return err
}

// Encrypt encrypts data with key in one part.
func (o operations) Encrypt(ctx context.Context, m *pkcs11.Mechanism, key pkcs11.ObjectHandle, data []byte) ([]byte, error) {
	return o.Single(ctx, KindEncrypt, m, key, data, nil)
}

// Decrypt decrypts data with key in one part.
func (o operations) Decrypt(ctx context.Context, m *pkcs11.Mechanism, key pkcs11.ObjectHandle, data []byte) ([]byte, error) {
	return o.Single(ctx, KindDecrypt, m, key, data, nil)
}

// Digest digests data in one part.
func (o operations) Digest(ctx context.Context, m *pkcs11.Mechanism, data []byte) ([]byte, error) {
	return o.Single(ctx, KindDigest, m, 0, data, nil)
}

// GenerateRandom returns n random bytes from the token.
func (o operations) GenerateRandom(ctx context.Context, n int) ([]byte, error) {
	if n < 0 {
		return nil, invalid(o.member(), OpGenerateRandom, "length %d is negative", n)
	}
	return result(ctx, o, OpGenerateRandom, false, func(x *sess) ([]byte, error) { return x.ctx.GenerateRandom(x.h, n) })
}

// TokenInfo returns the token's information.
func (s *Slot) TokenInfo(ctx context.Context) (pkcs11.TokenInfo, error) {
	return direct(ctx, s, OpTokenInfo, func(st *slotState) (pkcs11.TokenInfo, error) { return st.ctx.GetTokenInfo(st.id) })
}

// Mechanisms returns the mechanism types the token supports.
func (s *Slot) Mechanisms(ctx context.Context) ([]uint, error) {
	return direct(ctx, s, OpMechanisms, func(st *slotState) ([]uint, error) {
		ms, err := st.ctx.GetMechanismList(st.id)
		if err != nil {
			return nil, err
		}
		out := make([]uint, len(ms))
		for i, m := range ms {
			out[i] = m.Mechanism
		}
		return out, nil
	})
}

// MechanismInfo returns what the token says of mechanism mech.
func (s *Slot) MechanismInfo(ctx context.Context, mech uint) (pkcs11.MechanismInfo, error) {
	return direct(ctx, s, OpMechanismInfo, func(st *slotState) (pkcs11.MechanismInfo, error) {
		return st.ctx.GetMechanismInfo(st.id, []*pkcs11.Mechanism{pkcs11.NewMechanism(mech, nil)})
	})
}
