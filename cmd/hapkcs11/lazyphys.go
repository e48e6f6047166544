package main

import (
	"context"
	"fmt"
	"sync"

	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// lazyPhysical is a member's own token, listed at C_Initialize and opened
// at its first use. Opening one is a module session of its own — for a
// served member a connection, and so a server process, of its own — which
// most applications, using only the virtual slot, never need; a tool that
// initialises the module per task paid for every member's at every
// C_Initialize.
//
// Until it is opened, the slot says a token is present when the group
// opened the member's token at C_Initialize (same module, same token), as
// an opened physical slot said before; a token that cannot be opened at
// first use answers that call with the error slot.Open gives and is listed
// without a token from then on, as one that could not be opened at
// C_Initialize was.
type lazyPhysical struct {
	group, member string
	spec          slot.Spec
	present       bool      // the group opened the member's token
	log           *eventLog // member_slot_absent, when the open fails

	mu sync.Mutex
	p  *physical // nil until the first use; guarded by mu
}

func (l *lazyPhysical) SlotInfo() slotInfo {
	l.mu.Lock()
	p := l.p
	l.mu.Unlock()
	if p != nil {
		return p.SlotInfo()
	}
	si := (&physical{group: l.group, member: l.member}).SlotInfo()
	si.Present = l.present
	return si
}

// open returns the opened token, opening it within the member's command
// timeout on the first call.
func (l *lazyPhysical) open(ctx context.Context) (*physical, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.p == nil {
		octx, cancel := context.WithTimeout(ctx, l.spec.CommandTimeout)
		l.p = openPhysical(octx, l.group, l.spec)
		cancel()
		if l.p.err != nil {
			l.log.event(l.group, l.member, "member_slot_absent", l.p.err.Error())
		}
	}
	if l.p.s == nil {
		err := l.p.err
		if err == nil {
			err = pkcs11.Error(pkcs11.CKR_TOKEN_NOT_PRESENT)
		}
		return nil, fmt.Errorf("member %s: %w", l.member, err)
	}
	return l.p, nil
}

func (l *lazyPhysical) TokenInfo(ctx context.Context) (pkcs11.TokenInfo, error) {
	p, err := l.open(ctx)
	if err != nil {
		return pkcs11.TokenInfo{}, err
	}
	return p.TokenInfo(ctx)
}

func (l *lazyPhysical) Mechanisms(ctx context.Context) ([]uint, error) {
	p, err := l.open(ctx)
	if err != nil {
		return nil, err
	}
	return p.Mechanisms(ctx)
}

func (l *lazyPhysical) Withholds(context.Context, uint) (bool, error) { return false, nil }

func (l *lazyPhysical) MechanismInfo(ctx context.Context, mech uint) (pkcs11.MechanismInfo, error) {
	p, err := l.open(ctx)
	if err != nil {
		return pkcs11.MechanismInfo{}, err
	}
	return p.MechanismInfo(ctx, mech)
}

func (l *lazyPhysical) Login(ctx context.Context, userType uint, pin secret.PIN) error {
	p, err := l.open(ctx)
	if err != nil {
		return err
	}
	return p.Login(ctx, userType, pin)
}

func (l *lazyPhysical) Logout(ctx context.Context) error {
	p, err := l.open(ctx)
	if err != nil {
		return err
	}
	return p.Logout(ctx)
}

// LoggedIn is the opened token's login; a token not opened yet has none.
func (l *lazyPhysical) LoggedIn() (uint, bool) {
	l.mu.Lock()
	p := l.p
	l.mu.Unlock()
	if p == nil || p.s == nil {
		return 0, false
	}
	return p.LoggedIn()
}

func (l *lazyPhysical) OpenSession(ctx context.Context) (session, error) {
	p, err := l.open(ctx)
	if err != nil {
		return nil, err
	}
	return p.OpenSession(ctx)
}

// Close closes the token if it was opened.
func (l *lazyPhysical) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.p == nil {
		return nil
	}
	return l.p.Close()
}
