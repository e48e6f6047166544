package group

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/replica"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// Luna's promise for creation: an object made through the group exists on
// every serving member before the call succeeds. A member that cannot hold
// a key of some kind (its token lacks CKM_AES_KEY_WRAP_PAD, or refuses to
// wrap or unwrap that key type) therefore makes every creation of that
// kind fail before anything is written, and makes the virtual slot stop
// offering the mechanisms that generate it, for as long as it serves with
// another member. One member alone needs no replication and holds
// whatever its token makes. What each member can hold is probed when it
// joins or is re-opened (replica.ProbeWrap) and cached here.

// keygenKinds is the kind of key each generation mechanism makes (the
// private half, for a key pair).
var keygenKinds = map[uint]replica.Kind{
	pkcs11.CKM_RSA_PKCS_KEY_PAIR_GEN:  {Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_RSA},
	pkcs11.CKM_RSA_X9_31_KEY_PAIR_GEN: {Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_RSA},
	pkcs11.CKM_EC_KEY_PAIR_GEN:        {Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_EC},
	slot.CKMECEdwardsKeyPairGen:       {Class: pkcs11.CKO_PRIVATE_KEY, KeyType: slot.CKKECEdwards},
	slot.CKMECMontgomeryKeyPairGen:    {Class: pkcs11.CKO_PRIVATE_KEY, KeyType: slot.CKKECMontgomery},
	pkcs11.CKM_DSA_KEY_PAIR_GEN:       {Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_DSA},
	pkcs11.CKM_DH_PKCS_KEY_PAIR_GEN:   {Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_DH},
	pkcs11.CKM_GOSTR3410_KEY_PAIR_GEN: {Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_GOSTR3410},
	pkcs11.CKM_AES_KEY_GEN:            {Class: pkcs11.CKO_SECRET_KEY, KeyType: pkcs11.CKK_AES},
	pkcs11.CKM_GENERIC_SECRET_KEY_GEN: {Class: pkcs11.CKO_SECRET_KEY, KeyType: pkcs11.CKK_GENERIC_SECRET},
	pkcs11.CKM_DES_KEY_GEN:            {Class: pkcs11.CKO_SECRET_KEY, KeyType: pkcs11.CKK_DES},
	pkcs11.CKM_DES2_KEY_GEN:           {Class: pkcs11.CKO_SECRET_KEY, KeyType: pkcs11.CKK_DES2},
	pkcs11.CKM_DES3_KEY_GEN:           {Class: pkcs11.CKO_SECRET_KEY, KeyType: pkcs11.CKK_DES3},
	pkcs11.CKM_GOST28147_KEY_GEN:      {Class: pkcs11.CKO_SECRET_KEY, KeyType: pkcs11.CKK_GOST28147},
}

// Refusal is why one member cannot hold a kind of key.
type Refusal struct {
	Member string
	Kind   replica.Kind
	Err    error
}

func (r Refusal) Error() string {
	return fmt.Sprintf("member %s cannot hold %ss made through the group: %v", r.Member, r.Kind, r.Err)
}

// probeCapability finds out which kinds of key m's token can wrap and
// unwrap (mechs is its mechanism list) and caches the answer; a change is
// reported once with a KeysUnholdable event naming the kinds. A member
// failing under the probe is charged and the error returned.
func (g *Group) probeCapability(ctx context.Context, m *member.Member, mechs []uint) error {
	var c replica.WrapCapability
	if _, err := g.call(ctx, m, func() (err error) {
		c, err = replica.ProbeWrap(ctx, m.Slot(), mechs)
		return err
	}); err != nil {
		return err
	}
	old, seen := g.caps.Swap(m.Name(), c)
	if seen && sameCapability(old.(replica.WrapCapability), c) {
		return nil
	}
	if names, why := refusedKinds(c); c.Mechanism && len(names) > 0 {
		g.emit(Event{Kind: KeysUnholdable, Member: m.Name(), Err: fmt.Errorf(
			"member %s cannot hold %s: %s; while it serves with another member the group makes no such key and does not offer the mechanisms that generate them",
			m.Name(), strings.Join(names, ", "), why)})
	}
	return nil
}

func sameCapability(a, b replica.WrapCapability) bool {
	return a.Mechanism == b.Mechanism && slices.Equal(a.Unholdable(), b.Unholdable())
}

// refusedKinds names the kinds c refused and why the first was.
func refusedKinds(c replica.WrapCapability) (names []string, why string) {
	for _, k := range c.Unholdable() {
		names = append(names, k.String()+"s")
		if why == "" {
			why = c.Holds(k).Error()
		}
	}
	return names, why
}

// capability is what m was last probed to hold; a member not probed yet is
// judged by the mechanism alone.
func (g *Group) capability(m *member.Member) replica.WrapCapability {
	if c, ok := g.caps.Load(m.Name()); ok {
		return c.(replica.WrapCapability)
	}
	return replica.WrapCapability{Mechanism: !m.Lacks(MechWrapPad)}
}

// cannotHold returns, for each serving member that cannot hold a key of
// kind k, why. With one serving member nothing needs replicating: none.
// Every member is asked to both send and receive the kind, whichever is
// primary: the primary changes with every failover, and a key a member
// could not send would not reach a member that comes back.
func (g *Group) cannotHold(k replica.Kind) []Refusal {
	ms := g.serving()
	if len(ms) < 2 || !k.Wrapped() {
		return nil
	}
	var out []Refusal
	for _, m := range ms {
		if err := g.capability(m).Holds(k); err != nil {
			out = append(out, Refusal{Member: m.Name(), Kind: k, Err: err})
		}
	}
	return out
}

// offered reports whether the virtual slot offers mech: every mechanism
// but one that generates keys some serving member cannot hold.
func (g *Group) offered(mech uint) bool {
	k, ok := keygenKinds[mech]
	return !ok || len(g.cannotHold(k)) == 0
}

func mechType(m *pkcs11.Mechanism) uint {
	if m == nil {
		return 0
	}
	return m.Mechanism
}

// kindOf is the kind of key in makes: its class (a key of unknown class
// when neither the operation nor the template says), and its key type from
// the template, the generation mechanism, or the source of a copy.
func kindOf(in intent, inputs []*vobject) replica.Kind {
	k := replica.Kind{Class: in.class, KeyType: replica.KeyTypeUnknown}
	if !in.classKnown {
		k.Class = replica.ClassUnknownKey
	}
	switch gk, gen := keygenKinds[in.genMech]; {
	case attrIndex(in.tmpl, pkcs11.CKA_KEY_TYPE) >= 0:
		k.KeyType = ulong(in.tmpl[attrIndex(in.tmpl, pkcs11.CKA_KEY_TYPE)].Value)
	case gen && in.genMech != 0:
		k.KeyType = gk.KeyType
	case in.copied && len(inputs) == 1:
		k.KeyType = inputs[0].identity().KeyType
	}
	return k
}

// checkHold refuses, before anything is written, a creation that makes a
// key some serving member cannot hold: an event per member at fault
// (CreationRefused) and an error with a code op may return —
// CKR_MECHANISM_INVALID for a generation (the virtual slot does not offer
// the mechanism), CKR_TEMPLATE_INCONSISTENT for the others (the kind the
// template asks for cannot be made here). Neither is charged to a member.
func (g *Group) checkHold(op string, ins []intent, inputs []*vobject) error {
	var refused []Refusal
	for _, in := range ins {
		refused = append(refused, g.cannotHold(kindOf(in, inputs))...)
	}
	return g.refuse(op, refused)
}

// refuse reports each refusal and returns the error of op, or nil when
// there is none.
func (g *Group) refuse(op string, refused []Refusal) error {
	if len(refused) == 0 {
		return nil
	}
	for _, r := range refused {
		g.emit(Event{Kind: CreationRefused, Member: r.Member, Err: fmt.Errorf("%s refused: %w", op, r)})
	}
	code := uint(pkcs11.CKR_TEMPLATE_INCONSISTENT)
	if op == "GenerateKey" || op == "GenerateKeyPair" {
		code = pkcs11.CKR_MECHANISM_INVALID
	}
	return &Error{Code: code, Op: op, Member: refused[0].Member, Err: errors.Join(errs(refused)...),
		msg: "every serving member must hold an object made through the group"}
}

// Refusals is the error of a replication that a target could not take.
type Refusals []Refusal

func (rs Refusals) Error() string { return errors.Join(errs(rs)...).Error() }

// targetsCannotHold returns the refusals of targets (or of the source p)
// that cannot hold what ms holds, nil when every target can.
func (g *Group) targetsCannotHold(p *member.Member, targets []*member.Member, ms []made) Refusals {
	var out Refusals
	for _, m := range append([]*member.Member{p}, targets...) {
		for _, o := range ms {
			k := kindOfObject(o.obj)
			if err := g.capability(m).Holds(k); err != nil {
				out = append(out, Refusal{Member: m.Name(), Kind: k, Err: err})
			}
		}
	}
	return out
}

// targetsRefused returns the refusals among the copies' errors: a target
// answering its copy with a request error (not a health failure, not an
// ambiguous answer) will not take the object at all.
func targetsRefused(targets []*member.Member, errs []error, ms []made, failedAt []int) Refusals {
	var out Refusals
	for i, t := range targets {
		var se *slot.Error
		if err := errs[i]; err != nil && errors.As(err, &se) && se.Member == t.Name() &&
			slot.ClassOf(err) == slot.ClassRequest && !slot.Ambiguous(err) {
			out = append(out, Refusal{Member: t.Name(), Kind: kindOfObject(ms[failedAt[i]].obj), Err: err})
		}
	}
	return out
}

func kindOfObject(o replica.Object) replica.Kind {
	return replica.Kind{Class: o.Class, KeyType: o.KeyType}
}

func errs(rs []Refusal) []error {
	out := make([]error, len(rs))
	for i, r := range rs {
		out[i] = r
	}
	return out
}
