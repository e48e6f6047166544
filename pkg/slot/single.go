package slot

import (
	"context"

	"github.com/hagroup/hagroup/pkg/remote"
	"github.com/miekg/pkcs11"
)

// The closures below hand results back through variables of the calling
// function. A variable is read only after the call returned its result,
// never after an abandoned call: the worker of an abandoned call may still
// write it when the module finally answers.

// runner is what Slot (a pooled session) and Session (a dedicated one) give
// the single-part operations, which are written once below.
type runner interface {
	call(ctx context.Context, op Op, keygen bool, fn func(*sess) error) error
	member() string
}

func (s *Slot) call(ctx context.Context, op Op, keygen bool, fn func(*sess) error) error {
	t := s.cmdTimeout
	if keygen {
		t = s.keyTimeout
	}
	return s.do(ctx, op, t, fn, nil)
}

func (s *Slot) member() string { return s.spec.Name }

func findObjects(ctx context.Context, r runner, tmpl []*pkcs11.Attribute) ([]pkcs11.ObjectHandle, error) {
	var hs []pkcs11.ObjectHandle
	err := r.call(ctx, OpFindObjects, false, func(x *sess) error {
		v, err := x.findObjects(tmpl)
		hs = v
		return err
	})
	if err != nil {
		return nil, err
	}
	return hs, nil
}

func getAttributes(ctx context.Context, r runner, h pkcs11.ObjectHandle, types []uint) ([]Attribute, error) {
	var out []Attribute
	err := r.call(ctx, OpGetAttributes, false, func(x *sess) error {
		v, err := x.getAttributes(h, types)
		out = v
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func setAttributes(ctx context.Context, r runner, h pkcs11.ObjectHandle, attrs []*pkcs11.Attribute) error {
	return r.call(ctx, OpSetAttributes, false, func(x *sess) error {
		return x.ctx.SetAttributeValue(x.h, h, attrs)
	})
}

func createObject(ctx context.Context, r runner, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	var h pkcs11.ObjectHandle
	err := r.call(ctx, OpCreateObject, false, func(x *sess) error {
		v, err := x.ctx.CreateObject(x.h, tmpl)
		h = v
		return err
	})
	if err != nil {
		return 0, err
	}
	return h, nil
}

func createObjectNested(ctx context.Context, r runner, tmpl []*pkcs11.Attribute, nested map[uint][]*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	if err := checkNested(tmpl, nested); err != nil {
		return 0, invalid(r.member(), OpCreateObject, "%v", err)
	}
	var h pkcs11.ObjectHandle
	err := r.call(ctx, OpCreateObject, false, func(x *sess) error {
		v, err := x.createObjectNested(tmpl, nested)
		h = v
		return err
	})
	if err != nil {
		return 0, err
	}
	return h, nil
}

func getNestedAttribute(ctx context.Context, r runner, h pkcs11.ObjectHandle, typ uint) ([]*pkcs11.Attribute, error) {
	var out []*pkcs11.Attribute
	err := r.call(ctx, OpGetAttributes, false, func(x *sess) error {
		v, err := x.getNestedAttribute(h, typ)
		out = v
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func copyObject(ctx context.Context, r runner, h pkcs11.ObjectHandle, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	var n pkcs11.ObjectHandle
	err := r.call(ctx, OpCopyObject, false, func(x *sess) error {
		v, err := x.ctx.CopyObject(x.h, h, tmpl)
		n = v
		return err
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

func destroyObject(ctx context.Context, r runner, h pkcs11.ObjectHandle) error {
	return r.call(ctx, OpDestroyObject, false, func(x *sess) error {
		return x.ctx.DestroyObject(x.h, h)
	})
}

func generateKey(ctx context.Context, r runner, m *pkcs11.Mechanism, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	if err := checkMech(r.member(), OpGenerateKey, m); err != nil {
		return 0, err
	}
	var h pkcs11.ObjectHandle
	err := r.call(ctx, OpGenerateKey, true, func(x *sess) error {
		v, err := x.ctx.GenerateKey(x.h, mechs(m), tmpl)
		h = v
		return err
	})
	if err != nil {
		return 0, err
	}
	return h, nil
}

func generateKeyPair(ctx context.Context, r runner, m *pkcs11.Mechanism, pub, priv []*pkcs11.Attribute) (pkcs11.ObjectHandle, pkcs11.ObjectHandle, error) {
	if err := checkMech(r.member(), OpGenerateKeyPair, m); err != nil {
		return 0, 0, err
	}
	var hpub, hpriv pkcs11.ObjectHandle
	err := r.call(ctx, OpGenerateKeyPair, true, func(x *sess) error {
		a, b, err := x.ctx.GenerateKeyPair(x.h, mechs(m), pub, priv)
		hpub, hpriv = a, b
		return err
	})
	if err != nil {
		return 0, 0, err
	}
	return hpub, hpriv, nil
}

func wrapKey(ctx context.Context, r runner, m *pkcs11.Mechanism, wrapping, key pkcs11.ObjectHandle) ([]byte, error) {
	if err := checkMech(r.member(), OpWrapKey, m); err != nil {
		return nil, err
	}
	var out []byte
	err := r.call(ctx, OpWrapKey, false, func(x *sess) error {
		v, err := x.ctx.WrapKey(x.h, mechs(m), wrapping, key)
		out = v
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func unwrapKey(ctx context.Context, r runner, m *pkcs11.Mechanism, unwrapping pkcs11.ObjectHandle, blob []byte, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	if err := checkMech(r.member(), OpUnwrapKey, m); err != nil {
		return 0, err
	}
	if err := remote.WrappedKeyMissing(blob); err != nil {
		return 0, err
	}
	var h pkcs11.ObjectHandle
	err := r.call(ctx, OpUnwrapKey, false, func(x *sess) error {
		v, err := x.ctx.UnwrapKey(x.h, mechs(m), unwrapping, blob, tmpl)
		h = v
		return err
	})
	if err != nil {
		return 0, err
	}
	return h, nil
}

func deriveKey(ctx context.Context, r runner, m *pkcs11.Mechanism, base pkcs11.ObjectHandle, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	if err := checkMech(r.member(), OpDeriveKey, m); err != nil {
		return 0, err
	}
	var h pkcs11.ObjectHandle
	err := r.call(ctx, OpDeriveKey, false, func(x *sess) error {
		v, err := x.ctx.DeriveKey(x.h, mechs(m), base, tmpl)
		h = v
		return err
	})
	if err != nil {
		return 0, err
	}
	return h, nil
}

func generateRandom(ctx context.Context, r runner, n int) ([]byte, error) {
	if n < 0 {
		return nil, invalid(r.member(), OpGenerateRandom, "length %d is negative", n)
	}
	var out []byte
	err := r.call(ctx, OpGenerateRandom, false, func(x *sess) error {
		v, err := x.ctx.GenerateRandom(x.h, n)
		out = v
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// FindObjects returns the handles of every object matching tmpl.
func (s *Slot) FindObjects(ctx context.Context, tmpl []*pkcs11.Attribute) ([]pkcs11.ObjectHandle, error) {
	return findObjects(ctx, s, tmpl)
}

// GetAttributes reads attributes of h, each with its own status
// (CKR_OK, CKR_ATTRIBUTE_SENSITIVE or CKR_ATTRIBUTE_TYPE_INVALID).
func (s *Slot) GetAttributes(ctx context.Context, h pkcs11.ObjectHandle, types []uint) ([]Attribute, error) {
	return getAttributes(ctx, s, h, types)
}

// GetNestedAttribute reads an attribute whose value is an attribute array
// (CKA_WRAP_TEMPLATE, CKA_UNWRAP_TEMPLATE, CKA_DERIVE_TEMPLATE).
func (s *Slot) GetNestedAttribute(ctx context.Context, h pkcs11.ObjectHandle, typ uint) ([]*pkcs11.Attribute, error) {
	return getNestedAttribute(ctx, s, h, typ)
}

// SetAttributes sets attributes of h.
func (s *Slot) SetAttributes(ctx context.Context, h pkcs11.ObjectHandle, attrs []*pkcs11.Attribute) error {
	return setAttributes(ctx, s, h, attrs)
}

// CreateObject creates an object.
func (s *Slot) CreateObject(ctx context.Context, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	return createObject(ctx, s, tmpl)
}

// CreateObjectNested creates an object whose template also holds
// attribute-array attributes: nested maps CKA_WRAP_TEMPLATE,
// CKA_UNWRAP_TEMPLATE or CKA_DERIVE_TEMPLATE to the attributes of the array.
// A session object made on a pooled session lives as long as that session;
// use Session.CreateObjectNested for session objects.
func (s *Slot) CreateObjectNested(ctx context.Context, tmpl []*pkcs11.Attribute, nested map[uint][]*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	return createObjectNested(ctx, s, tmpl, nested)
}

// CopyObject copies h, changing the attributes in tmpl.
func (s *Slot) CopyObject(ctx context.Context, h pkcs11.ObjectHandle, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	return copyObject(ctx, s, h, tmpl)
}

// DestroyObject destroys h.
func (s *Slot) DestroyObject(ctx context.Context, h pkcs11.ObjectHandle) error {
	return destroyObject(ctx, s, h)
}

// GenerateKey generates a secret key under the key generation timeout.
func (s *Slot) GenerateKey(ctx context.Context, m *pkcs11.Mechanism, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	return generateKey(ctx, s, m, tmpl)
}

// GenerateKeyPair generates a key pair under the key generation timeout and
// returns the public and the private key.
func (s *Slot) GenerateKeyPair(ctx context.Context, m *pkcs11.Mechanism, pub, priv []*pkcs11.Attribute) (pkcs11.ObjectHandle, pkcs11.ObjectHandle, error) {
	return generateKeyPair(ctx, s, m, pub, priv)
}

// WrapKey wraps key under wrapping.
func (s *Slot) WrapKey(ctx context.Context, m *pkcs11.Mechanism, wrapping, key pkcs11.ObjectHandle) ([]byte, error) {
	return wrapKey(ctx, s, m, wrapping, key)
}

// UnwrapKey unwraps blob under unwrapping into a new key with tmpl.
func (s *Slot) UnwrapKey(ctx context.Context, m *pkcs11.Mechanism, unwrapping pkcs11.ObjectHandle, blob []byte, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	return unwrapKey(ctx, s, m, unwrapping, blob, tmpl)
}

// DeriveKey derives a new key with tmpl from base.
func (s *Slot) DeriveKey(ctx context.Context, m *pkcs11.Mechanism, base pkcs11.ObjectHandle, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	return deriveKey(ctx, s, m, base, tmpl)
}

// Sign signs data with key in one part.
func (s *Slot) Sign(ctx context.Context, m *pkcs11.Mechanism, key pkcs11.ObjectHandle, data []byte) ([]byte, error) {
	return s.Single(ctx, KindSign, m, key, data, nil)
}

// Verify verifies sig over data with key in one part; a bad signature is
// CKR_SIGNATURE_INVALID (class request).
func (s *Slot) Verify(ctx context.Context, m *pkcs11.Mechanism, key pkcs11.ObjectHandle, data, sig []byte) error {
	_, err := s.Single(ctx, KindVerify, m, key, data, sig)
	return err
}

// Encrypt encrypts data with key in one part.
func (s *Slot) Encrypt(ctx context.Context, m *pkcs11.Mechanism, key pkcs11.ObjectHandle, data []byte) ([]byte, error) {
	return s.Single(ctx, KindEncrypt, m, key, data, nil)
}

// Decrypt decrypts data with key in one part.
func (s *Slot) Decrypt(ctx context.Context, m *pkcs11.Mechanism, key pkcs11.ObjectHandle, data []byte) ([]byte, error) {
	return s.Single(ctx, KindDecrypt, m, key, data, nil)
}

// Digest digests data in one part.
func (s *Slot) Digest(ctx context.Context, m *pkcs11.Mechanism, data []byte) ([]byte, error) {
	return s.Single(ctx, KindDigest, m, 0, data, nil)
}

// GenerateRandom returns n random bytes from the token.
func (s *Slot) GenerateRandom(ctx context.Context, n int) ([]byte, error) {
	return generateRandom(ctx, s, n)
}

// TokenInfo returns the token's information.
func (s *Slot) TokenInfo(ctx context.Context) (pkcs11.TokenInfo, error) {
	var ti pkcs11.TokenInfo
	err := s.direct(ctx, OpTokenInfo, func(st *slotState) error {
		v, err := st.ctx.GetTokenInfo(st.id)
		ti = v
		return err
	})
	if err != nil {
		return pkcs11.TokenInfo{}, err
	}
	return ti, nil
}

// Mechanisms returns the mechanism types the token supports.
func (s *Slot) Mechanisms(ctx context.Context) ([]uint, error) {
	var out []uint
	err := s.direct(ctx, OpMechanisms, func(st *slotState) error {
		ms, err := st.ctx.GetMechanismList(st.id)
		if err != nil {
			return err
		}
		v := make([]uint, len(ms))
		for i, m := range ms {
			v[i] = m.Mechanism
		}
		out = v
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// MechanismInfo returns what the token says of mechanism mech.
func (s *Slot) MechanismInfo(ctx context.Context, mech uint) (pkcs11.MechanismInfo, error) {
	var mi pkcs11.MechanismInfo
	err := s.direct(ctx, OpMechanismInfo, func(st *slotState) error {
		v, err := st.ctx.GetMechanismInfo(st.id, []*pkcs11.Mechanism{pkcs11.NewMechanism(mech, nil)})
		mi = v
		return err
	})
	if err != nil {
		return pkcs11.MechanismInfo{}, err
	}
	return mi, nil
}
