package group

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

const (
	ckUnavailable = ^uint(0) // CK_UNAVAILABLE_INFORMATION
	ckInfinite    = 0        // CK_EFFECTIVELY_INFINITE
)

// each calls fn on every serving member in parallel (with accounting) and
// returns the members that answered.
func (g *Group) each(ctx context.Context, fn func(m *member.Member) error) []*member.Member {
	ms := g.serving()
	ok := make([]bool, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() {
			_, err := g.call(ctx, m, func() error { return fn(m) })
			ok[i] = err == nil
		})
	}
	wg.Wait()
	var out []*member.Member
	for i, m := range ms {
		if ok[i] {
			out = append(out, m)
		}
	}
	return out
}

// TokenInfo synthesises the virtual token's information from the serving
// members: the group's label and serial; CKF_RNG, CKF_USER_PIN_INITIALIZED,
// CKF_TOKEN_INITIALIZED and CKF_RESTORE_KEY_NOT_NEEDED when every member
// has them; CKF_LOGIN_REQUIRED, CKF_WRITE_PROTECTED and the PIN counter
// flags when any member has them; the PIN length range
// every member accepts; session counts summed and session maxima the
// smallest member's (each virtual session may need a session on every
// member); memory figures summed. With no member answering it returns the
// label, serial and flags of an initialised token and unavailable figures.
func (g *Group) TokenInfo(ctx context.Context) (pkcs11.TokenInfo, error) {
	if err := g.gate.enter(); err != nil {
		return pkcs11.TokenInfo{}, err
	}
	defer g.gate.leave()
	infos := make([]pkcs11.TokenInfo, MaxMembers)
	answered := g.each(ctx, func(m *member.Member) (err error) {
		infos[m.Index()], err = m.Slot().TokenInfo(ctx)
		return err
	})
	ti := pkcs11.TokenInfo{Label: g.label, SerialNumber: g.serial}
	ti.ManufacturerID, ti.Model = g.tokenModel(answered, infos)
	if len(answered) == 0 {
		ti.Flags = pkcs11.CKF_TOKEN_INITIALIZED | pkcs11.CKF_LOGIN_REQUIRED | pkcs11.CKF_USER_PIN_INITIALIZED
		ti.MaxSessionCount, ti.SessionCount = ckUnavailable, ckUnavailable
		ti.MaxRwSessionCount, ti.RwSessionCount = ckUnavailable, ckUnavailable
		ti.TotalPublicMemory, ti.FreePublicMemory = ckUnavailable, ckUnavailable
		ti.TotalPrivateMemory, ti.FreePrivateMemory = ckUnavailable, ckUnavailable
		ti.MaxPinLen, ti.MinPinLen = ckUnavailable, ckUnavailable
		return ti, nil
	}
	all := uint(pkcs11.CKF_RNG | pkcs11.CKF_USER_PIN_INITIALIZED | pkcs11.CKF_TOKEN_INITIALIZED | pkcs11.CKF_RESTORE_KEY_NOT_NEEDED)
	// A PIN's state on any member is the application's to see: a PIN is
	// proved on one member, and that one counts the failures.
	anyOf := uint(pkcs11.CKF_LOGIN_REQUIRED | pkcs11.CKF_WRITE_PROTECTED |
		pkcs11.CKF_USER_PIN_COUNT_LOW | pkcs11.CKF_USER_PIN_FINAL_TRY | pkcs11.CKF_USER_PIN_LOCKED | pkcs11.CKF_USER_PIN_TO_BE_CHANGED |
		pkcs11.CKF_SO_PIN_COUNT_LOW | pkcs11.CKF_SO_PIN_FINAL_TRY | pkcs11.CKF_SO_PIN_LOCKED | pkcs11.CKF_SO_PIN_TO_BE_CHANGED)
	ti.Flags = all
	ti.MaxPinLen = ckUnavailable
	ti.MaxSessionCount, ti.MaxRwSessionCount = ckInfinite, ckInfinite
	for i, m := range answered {
		in := infos[m.Index()]
		ti.Flags &^= all &^ in.Flags
		ti.Flags |= in.Flags & anyOf
		if in.MinPinLen > ti.MinPinLen {
			ti.MinPinLen = in.MinPinLen
		}
		if i == 0 || in.MaxPinLen < ti.MaxPinLen {
			ti.MaxPinLen = in.MaxPinLen
		}
		ti.MaxSessionCount = minCount(ti.MaxSessionCount, in.MaxSessionCount)
		ti.MaxRwSessionCount = minCount(ti.MaxRwSessionCount, in.MaxRwSessionCount)
		ti.SessionCount = sumCount(ti.SessionCount, in.SessionCount)
		ti.RwSessionCount = sumCount(ti.RwSessionCount, in.RwSessionCount)
		ti.TotalPublicMemory = sumCount(ti.TotalPublicMemory, in.TotalPublicMemory)
		ti.FreePublicMemory = sumCount(ti.FreePublicMemory, in.FreePublicMemory)
		ti.TotalPrivateMemory = sumCount(ti.TotalPrivateMemory, in.TotalPrivateMemory)
		ti.FreePrivateMemory = sumCount(ti.FreePrivateMemory, in.FreePrivateMemory)
		if i == 0 {
			ti.HardwareVersion, ti.FirmwareVersion = in.HardwareVersion, in.FirmwareVersion
		}
	}
	return ti, nil
}

// Fallback token identity, for a group whose members are of different
// models (no one token's quirks apply to it) or were never reached.
const (
	MixedManufacturer = "hagroup"
	MixedModel        = "HA virtual slot"
)

// tokenModel returns the manufacturer and model the virtual token reports:
// its members' when they all agree, since the group passes every operation
// to them and an application working around a token's quirks by
// ManufacturerID meets exactly theirs; else MixedManufacturer and
// MixedModel. The last agreed answer stands while no member answers, so
// the token does not change identity during an outage.
func (g *Group) tokenModel(answered []*member.Member, infos []pkcs11.TokenInfo) (string, string) {
	if len(answered) == 0 {
		if id := g.model.Load(); id != nil {
			return id[0], id[1]
		}
		return MixedManufacturer, MixedModel
	}
	got := make([]pkcs11.TokenInfo, len(answered))
	for i, m := range answered {
		got[i] = infos[m.Index()]
	}
	id := agreedModel(got)
	g.model.Store(&id)
	return id[0], id[1]
}

// agreedModel is the manufacturer and model of tokens that agree on both,
// else MixedManufacturer and MixedModel.
func agreedModel(infos []pkcs11.TokenInfo) [2]string {
	for _, in := range infos[1:] {
		if in.ManufacturerID != infos[0].ManufacturerID || in.Model != infos[0].Model {
			return [2]string{MixedManufacturer, MixedModel}
		}
	}
	return [2]string{infos[0].ManufacturerID, infos[0].Model}
}

func sumCount(a, b uint) uint {
	if a == ckUnavailable || b == ckUnavailable {
		return ckUnavailable
	}
	return a + b
}

// minCount is the smaller of two maxima where 0 means unlimited.
func minCount(a, b uint) uint {
	switch {
	case a == ckUnavailable || b == ckUnavailable:
		return ckUnavailable
	case a == ckInfinite:
		return b
	case b == ckInfinite:
		return a
	}
	return min(a, b)
}

// Mechanisms returns the mechanisms every serving member supports (a
// mechanism only some members have would fail after a failover), in the
// order the primary lists them: applications pick "the first mechanism
// that does X" as they would on the member token. A mechanism that
// generates keys some serving member cannot hold is left out (offered).
func (g *Group) Mechanisms(ctx context.Context) ([]uint, error) {
	if err := g.gate.enter(); err != nil {
		return nil, err
	}
	defer g.gate.leave()
	lists := make([][]uint, MaxMembers)
	answered := g.each(ctx, func(m *member.Member) (err error) {
		lists[m.Index()], err = m.Slot().Mechanisms(ctx)
		return err
	})
	if len(answered) == 0 {
		return nil, wrap(ErrNoMember, "Mechanisms", "", nil)
	}
	first := answered[0]
	if p := g.primary(); p != nil && slices.Contains(answered, p) {
		first = p
	}
	out := slices.Clone(lists[first.Index()])
	for _, m := range answered {
		l := lists[m.Index()]
		out = slices.DeleteFunc(out, func(x uint) bool { return !slices.Contains(l, x) })
	}
	return slices.DeleteFunc(out, func(x uint) bool { return !g.offered(x) }), nil
}

// MechanismInfo returns what every serving member can do with mech: the
// flags all of them have and the key size range all of them accept. A
// mechanism Mechanisms leaves out answers CKR_MECHANISM_INVALID.
func (g *Group) MechanismInfo(ctx context.Context, mech uint) (pkcs11.MechanismInfo, error) {
	if err := g.gate.enter(); err != nil {
		return pkcs11.MechanismInfo{}, err
	}
	defer g.gate.leave()
	if !g.offered(mech) {
		return pkcs11.MechanismInfo{}, &Error{Code: pkcs11.CKR_MECHANISM_INVALID, Op: "MechanismInfo",
			msg: fmt.Sprintf("mechanism 0x%x generates keys a serving member cannot hold", mech)}
	}
	infos := make([]pkcs11.MechanismInfo, MaxMembers)
	errs := make([]error, MaxMembers)
	answered := g.each(ctx, func(m *member.Member) error {
		var err error
		infos[m.Index()], err = m.Slot().MechanismInfo(ctx, mech)
		errs[m.Index()] = err
		return err
	})
	if len(answered) == 0 {
		for _, err := range errs {
			if err != nil {
				return pkcs11.MechanismInfo{}, opErr("MechanismInfo", "", err)
			}
		}
		return pkcs11.MechanismInfo{}, wrap(ErrNoMember, "MechanismInfo", "", nil)
	}
	for _, err := range errs {
		// A member without the mechanism: the group does not have it. A
		// member that failed to answer (dying, not failed yet) says
		// nothing about the mechanism: the others answer.
		if err != nil && slot.ClassOf(err) != slot.ClassHealth {
			return pkcs11.MechanismInfo{}, opErr("MechanismInfo", "", err)
		}
	}
	out := infos[answered[0].Index()]
	for _, m := range answered[1:] {
		in := infos[m.Index()]
		out.Flags &= in.Flags
		out.MinKeySize = max(out.MinKeySize, in.MinKeySize)
		out.MaxKeySize = min(out.MaxKeySize, in.MaxKeySize)
	}
	return out, nil
}
