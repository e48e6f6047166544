package group

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/hagroup/hagroup/pkg/group/tokeninfo"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// ask calls fn on every serving member in parallel (with accounting) and
// returns the members that answered, their answers in the same order, and
// the errors of those that did not.
func ask[T any](ctx context.Context, g *Group, fn func(m *member.Member) (T, error)) (answered []*member.Member, answers []T, errs []error) {
	ms := g.serving()
	outs := make([]T, len(ms))
	failed := make([]error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() {
			_, failed[i] = g.call(ctx, m, func() (err error) {
				outs[i], err = fn(m)
				return err
			})
		})
	}
	wg.Wait()
	for i, m := range ms {
		if failed[i] != nil {
			errs = append(errs, failed[i])
			continue
		}
		answered, answers = append(answered, m), append(answers, outs[i])
	}
	return answered, answers, errs
}

// TokenInfo synthesises the virtual token's information from the serving
// members (tokeninfo.Merge), under the group's label and serial. With no
// member answering it returns the flags of an initialised token and
// unavailable figures (tokeninfo.Unanswered), and the model the members
// last agreed on, so that the token does not change identity during an
// outage.
func (g *Group) TokenInfo(ctx context.Context) (pkcs11.TokenInfo, error) {
	if err := g.gate.Enter(); err != nil {
		return pkcs11.TokenInfo{}, err
	}
	defer g.gate.Leave()
	_, infos, _ := ask(ctx, g, func(m *member.Member) (pkcs11.TokenInfo, error) {
		return m.Slot().TokenInfo(ctx)
	})
	ti := tokeninfo.Unanswered()
	ti.ManufacturerID, ti.Model = tokeninfo.MixedManufacturer, tokeninfo.MixedModel
	if len(infos) > 0 {
		ti = tokeninfo.Merge(infos)
		g.model.Store(&[2]string{ti.ManufacturerID, ti.Model})
	} else if id := g.model.Load(); id != nil {
		ti.ManufacturerID, ti.Model = id[0], id[1]
	}
	ti.Label, ti.SerialNumber = g.label, g.serial
	return ti, nil
}

// Mechanisms returns the mechanisms every serving member supports (a
// mechanism only some members have would fail after a failover), in the
// order the primary lists them: applications pick "the first mechanism
// that does X" as they would on the member token. A mechanism that
// generates keys some serving member cannot hold is left out (offered).
func (g *Group) Mechanisms(ctx context.Context) ([]uint, error) {
	if err := g.gate.Enter(); err != nil {
		return nil, err
	}
	defer g.gate.Leave()
	answered, lists, _ := ask(ctx, g, func(m *member.Member) ([]uint, error) {
		return m.Slot().Mechanisms(ctx)
	})
	if len(answered) == 0 {
		return nil, wrap(ErrNoMember, "Mechanisms", "", nil)
	}
	first := max(slices.Index(answered, g.primary()), 0)
	out := tokeninfo.Mechanisms(lists[first], lists)
	return slices.DeleteFunc(out, func(x uint) bool { return !g.offered(x) }), nil
}

// Withholds reports whether the virtual slot refuses an operation's mech
// that Mechanisms leaves out because of the group: a generation some
// serving member cannot hold, or a mechanism some serving members list and
// others do not (it would fail after a failover). A mechanism no serving
// member lists is theirs to answer, as on the bare token: NSS softokn
// serves the digests its database slot does not list.
func (g *Group) Withholds(ctx context.Context, mech uint) (bool, error) {
	if !g.offered(mech) {
		return true, nil
	}
	if err := g.gate.Enter(); err != nil {
		return false, err
	}
	defer g.gate.Leave()
	answered, lists, _ := ask(ctx, g, func(m *member.Member) ([]uint, error) {
		return m.Slot().Mechanisms(ctx)
	})
	if len(answered) == 0 {
		return false, wrap(ErrNoMember, "Mechanisms", "", nil)
	}
	listing := 0
	for _, l := range lists {
		if slices.Contains(l, mech) {
			listing++
		}
	}
	return listing > 0 && listing < len(lists), nil
}

// MechanismInfo returns what every serving member can do with mech: the
// flags all of them have and the key size range all of them accept. A
// mechanism Mechanisms leaves out answers CKR_MECHANISM_INVALID.
func (g *Group) MechanismInfo(ctx context.Context, mech uint) (pkcs11.MechanismInfo, error) {
	if err := g.gate.Enter(); err != nil {
		return pkcs11.MechanismInfo{}, err
	}
	defer g.gate.Leave()
	if !g.offered(mech) {
		return pkcs11.MechanismInfo{}, &Error{Code: pkcs11.CKR_MECHANISM_INVALID, Op: "MechanismInfo",
			msg: fmt.Sprintf("mechanism 0x%x generates keys a serving member cannot hold", mech)}
	}
	_, infos, errs := ask(ctx, g, func(m *member.Member) (pkcs11.MechanismInfo, error) {
		return m.Slot().MechanismInfo(ctx, mech)
	})
	if len(infos) == 0 {
		if len(errs) > 0 {
			return pkcs11.MechanismInfo{}, opErr("MechanismInfo", "", errs[0])
		}
		return pkcs11.MechanismInfo{}, wrap(ErrNoMember, "MechanismInfo", "", nil)
	}
	for _, err := range errs {
		// A member without the mechanism: the group does not have it. A
		// member that failed to answer (dying, not failed yet) says
		// nothing about the mechanism: the others answer.
		if slot.ClassOf(err) != slot.ClassHealth {
			return pkcs11.MechanismInfo{}, opErr("MechanismInfo", "", err)
		}
	}
	return tokeninfo.MechanismInfo(infos), nil
}
