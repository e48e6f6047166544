package main

import (
	"context"

	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// handleSession adapts an engine's session to the session interface: a
// virtual slot's (group.Session, handles group.ObjectHandle) or a member's
// own (slot.Session and opstate.Direct, handles pkcs11.ObjectHandle).
// The only work is converting handles; written once for both. The calls
// without handles (Do, the hot path, among them) are the engine's own.
type handleSession[H ~uint] struct {
	opCalls[H]
	objs  objectCalls[H]
	find  func(ctx context.Context, tmpl []*pkcs11.Attribute) ([]H, error)
	check func() error
	ident func(H) (object.Identity, error) // nil: the engine does not know identities
}

func (a *handleSession[H]) identity(h uint) (object.Identity, bool) {
	if a.ident == nil {
		return object.Identity{}, false
	}
	id, err := a.ident(H(h))
	return id, err == nil
}

func (a *handleSession[H]) FindObjects(ctx context.Context, tmpl []*pkcs11.Attribute) ([]uint, error) {
	hs, err := a.find(ctx, tmpl)
	if err != nil {
		return nil, err
	}
	out := make([]uint, len(hs))
	for i, h := range hs {
		out[i] = uint(h)
	}
	return out, nil
}

func (a *handleSession[H]) GetAttributes(ctx context.Context, h uint, types []uint) ([]slot.Attribute, error) {
	return a.objs.GetAttributes(ctx, H(h), types)
}

func (a *handleSession[H]) SetAttributes(ctx context.Context, h uint, attrs []*pkcs11.Attribute) error {
	return a.objs.SetAttributes(ctx, H(h), attrs)
}

func (a *handleSession[H]) CreateObject(ctx context.Context, tmpl []*pkcs11.Attribute) (uint, error) {
	h, err := a.objs.CreateObject(ctx, tmpl)
	return uint(h), err
}

func (a *handleSession[H]) CopyObject(ctx context.Context, h uint, tmpl []*pkcs11.Attribute) (uint, error) {
	n, err := a.objs.CopyObject(ctx, H(h), tmpl)
	return uint(n), err
}

func (a *handleSession[H]) DestroyObject(ctx context.Context, h uint) error {
	return a.objs.DestroyObject(ctx, H(h))
}

func (a *handleSession[H]) GenerateKey(ctx context.Context, m *pkcs11.Mechanism, tmpl []*pkcs11.Attribute) (uint, error) {
	h, err := a.objs.GenerateKey(ctx, m, tmpl)
	return uint(h), err
}

func (a *handleSession[H]) GenerateKeyPair(ctx context.Context, m *pkcs11.Mechanism, pub, priv []*pkcs11.Attribute) (uint, uint, error) {
	pk, sk, err := a.objs.GenerateKeyPair(ctx, m, pub, priv)
	return uint(pk), uint(sk), err
}

func (a *handleSession[H]) WrapKey(ctx context.Context, m *pkcs11.Mechanism, wrapping, key uint) ([]byte, error) {
	return a.objs.WrapKey(ctx, m, H(wrapping), H(key))
}

func (a *handleSession[H]) UnwrapKey(ctx context.Context, m *pkcs11.Mechanism, unwrapping uint, blob []byte, tmpl []*pkcs11.Attribute) (uint, error) {
	h, err := a.objs.UnwrapKey(ctx, m, H(unwrapping), blob, tmpl)
	return uint(h), err
}

func (a *handleSession[H]) DeriveKey(ctx context.Context, m *pkcs11.Mechanism, base uint, tmpl []*pkcs11.Attribute) (uint, error) {
	h, err := a.objs.DeriveKey(ctx, m, H(base), tmpl)
	return uint(h), err
}

func (a *handleSession[H]) GenerateRandom(ctx context.Context, n int) ([]byte, error) {
	return a.objs.GenerateRandom(ctx, n)
}

func (a *handleSession[H]) Init(ctx context.Context, k group.OpKind, m *pkcs11.Mechanism, key uint) error {
	return a.opCalls.Init(ctx, k, m, H(key))
}

func (a *handleSession[H]) DigestKey(ctx context.Context, key uint) error {
	return a.opCalls.DigestKey(ctx, H(key))
}

func (a *handleSession[H]) Check() error { return a.check() }
