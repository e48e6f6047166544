package main

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/group/opstate"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// physical is a member's own token listed beside the virtual slots (unless
// only = true): a straight pass-through to pkg/slot. Each application
// session is a dedicated member session, so session objects and multi-part
// operations behave exactly as on the member.
type physical struct {
	group  string // the group's label, for the slot description
	member string
	s      *slot.Slot   // nil: the member could not be opened at C_Initialize
	err    error        // why not
	user   atomic.Int64 // the user type the application logged in as; -1: none
}

// openPhysical opens a member's token without logging in (the application
// does that with C_Login). A member that cannot be opened is listed as a
// slot without a token.
func openPhysical(ctx context.Context, group string, spec slot.Spec) *physical {
	p := &physical{group: group, member: spec.Name}
	p.user.Store(-1)
	p.s, p.err = slot.Open(ctx, spec)
	return p
}

func (p *physical) SlotInfo() slotInfo {
	return slotInfo{
		Description:  fmt.Sprintf("hagroup member %s of %s", p.member, p.group),
		Manufacturer: manufacturer,
		Present:      p.s != nil,
		Hardware:     true,
	}
}

func (p *physical) TokenInfo(ctx context.Context) (pkcs11.TokenInfo, error) {
	return p.s.TokenInfo(ctx)
}

func (p *physical) Mechanisms(ctx context.Context) ([]uint, error) { return p.s.Mechanisms(ctx) }

func (p *physical) MechanismInfo(ctx context.Context, mech uint) (pkcs11.MechanismInfo, error) {
	return p.s.MechanismInfo(ctx, mech)
}

func (p *physical) Login(ctx context.Context, userType uint, pin secret.PIN) error {
	if err := p.s.Login(ctx, userType, pin); err != nil {
		return err
	}
	p.user.Store(int64(userType))
	return nil
}

func (p *physical) Logout(ctx context.Context) error {
	p.user.Store(-1)
	return p.s.Logout(ctx)
}

func (p *physical) LoggedIn() (uint, bool) {
	ut := p.user.Load()
	return uint(ut), ut >= 0
}

func (p *physical) OpenSession(ctx context.Context) (session, error) {
	ss, err := p.s.OpenSession(ctx)
	if err != nil {
		return nil, err
	}
	return &physicalSession{ss: ss, d: opstate.NewDirect(ctx, ss)}, nil
}

func (p *physical) Close() error {
	if p.s == nil {
		return nil
	}
	return p.s.Close()
}

// physicalSession adapts a *slot.Session to the session interface: the only
// work is converting handles. Its operations run through the same state
// machine as a virtual slot's (opstate.Direct).
type physicalSession struct {
	ss *slot.Session
	d  *opstate.Direct
}

func oh(h uint) pkcs11.ObjectHandle { return pkcs11.ObjectHandle(h) }

func (p *physicalSession) FindObjects(ctx context.Context, tmpl []*pkcs11.Attribute) ([]uint, error) {
	hs, err := p.ss.FindObjects(ctx, tmpl)
	if err != nil {
		return nil, err
	}
	out := make([]uint, len(hs))
	for i, h := range hs {
		out[i] = uint(h)
	}
	return out, nil
}

func (p *physicalSession) GetAttributes(ctx context.Context, h uint, types []uint) ([]slot.Attribute, error) {
	return p.ss.GetAttributes(ctx, oh(h), types)
}

func (p *physicalSession) SetAttributes(ctx context.Context, h uint, attrs []*pkcs11.Attribute) error {
	return p.ss.SetAttributes(ctx, oh(h), attrs)
}

func (p *physicalSession) CreateObject(ctx context.Context, tmpl []*pkcs11.Attribute) (uint, error) {
	h, err := p.ss.CreateObject(ctx, tmpl)
	return uint(h), err
}

func (p *physicalSession) CopyObject(ctx context.Context, h uint, tmpl []*pkcs11.Attribute) (uint, error) {
	n, err := p.ss.CopyObject(ctx, oh(h), tmpl)
	return uint(n), err
}

func (p *physicalSession) DestroyObject(ctx context.Context, h uint) error {
	return p.ss.DestroyObject(ctx, oh(h))
}

func (p *physicalSession) GenerateKey(ctx context.Context, m *pkcs11.Mechanism, tmpl []*pkcs11.Attribute) (uint, error) {
	h, err := p.ss.GenerateKey(ctx, m, tmpl)
	return uint(h), err
}

func (p *physicalSession) GenerateKeyPair(ctx context.Context, m *pkcs11.Mechanism, pub, priv []*pkcs11.Attribute) (uint, uint, error) {
	pk, sk, err := p.ss.GenerateKeyPair(ctx, m, pub, priv)
	return uint(pk), uint(sk), err
}

func (p *physicalSession) WrapKey(ctx context.Context, m *pkcs11.Mechanism, wrapping, key uint) ([]byte, error) {
	return p.ss.WrapKey(ctx, m, oh(wrapping), oh(key))
}

func (p *physicalSession) UnwrapKey(ctx context.Context, m *pkcs11.Mechanism, unwrapping uint, blob []byte, tmpl []*pkcs11.Attribute) (uint, error) {
	h, err := p.ss.UnwrapKey(ctx, m, oh(unwrapping), blob, tmpl)
	return uint(h), err
}

func (p *physicalSession) DeriveKey(ctx context.Context, m *pkcs11.Mechanism, base uint, tmpl []*pkcs11.Attribute) (uint, error) {
	h, err := p.ss.DeriveKey(ctx, m, oh(base), tmpl)
	return uint(h), err
}

func (p *physicalSession) GenerateRandom(ctx context.Context, n int) ([]byte, error) {
	return p.ss.GenerateRandom(ctx, n)
}

func (p *physicalSession) Init(ctx context.Context, k group.OpKind, m *pkcs11.Mechanism, key uint) error {
	return p.d.Init(ctx, k, m, oh(key))
}

func (p *physicalSession) Cancel(k group.OpKind) error { return p.d.Cancel(k) }

func (p *physicalSession) Do(ctx context.Context, k group.OpKind, st group.Step, in, sig []byte, room group.Room) ([]byte, error) {
	return p.d.Do(ctx, k, st, in, sig, room)
}

func (p *physicalSession) DigestKey(ctx context.Context, key uint) error {
	return p.d.DigestKey(ctx, oh(key))
}

func (p *physicalSession) Check() error { return nil } // a member's own session is lost only with its token

func (p *physicalSession) Close() error { return p.d.Close() }
