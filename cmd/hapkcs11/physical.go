package main

import (
	"context"
	"fmt"
	"sync/atomic"

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

// Withholds: a member's own slot leaves every answer to its token.
func (p *physical) Withholds(context.Context, uint) (bool, error) { return false, nil }

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
	// Its operations run through the same state machine as a virtual
	// slot's (opstate.Direct); it is lost only with its token.
	return &handleSession[pkcs11.ObjectHandle]{opCalls: opstate.NewDirect(ctx, ss), objs: ss, find: ss.FindObjects, check: noCheck}, nil
}

func (p *physical) Close() error {
	if p.s == nil {
		return nil
	}
	return p.s.Close()
}

func noCheck() error { return nil }
