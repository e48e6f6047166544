package group

import (
	"context"
	"errors"
	"fmt"
	"github.com/hagroup/hagroup/internal/tokenquirk"
	"slices"

	"github.com/hagroup/hagroup/pkg/group/vtable"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/hagroup/hagroup/pkg/sync/object"
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
// joins or is re-opened (sync.ProbeWrap) and cached here; with
// Options.Facts a process answers from what an earlier one on the host
// probed of the same token.

// probeCapability finds out which kinds of key m's token can wrap and
// unwrap (mechs is its mechanism list) and caches the answer; a change is
// reported once with a KeysUnholdable event naming the kinds. A member
// failing under the probe is charged and the error returned.
func (g *Group) probeCapability(ctx context.Context, m *member.Member, mechs []uint) error {
	var c sync.WrapCapability
	if _, err := g.call(ctx, m, func() (err error) {
		c, err = sync.ProbeWrapKnown(ctx, m.Slot(), mechs, g.opts.Facts)
		return err
	}); err != nil {
		return err
	}
	g.mechs.Store(m.Name(), mechs)
	g.provePairs(ctx, m, mechs)
	old, seen := g.caps.Swap(m.Name(), c)
	if seen && old.(sync.WrapCapability).Same(c) {
		return nil
	}
	if names, why := c.Explain(); c.Mechanism && names != "" {
		g.emit(Event{Kind: KeysUnholdable, Member: m.Name(), Err: fmt.Errorf(
			"member %s cannot hold %s: %s; while it serves with another member the group makes no such key and does not offer the mechanisms that generate them",
			m.Name(), names, why)})
	}
	return nil
}

// capability is what m was last probed to hold; a member not probed yet is
// judged by the mechanism alone.
func (g *Group) capability(m *member.Member) sync.WrapCapability {
	if c, ok := g.caps.Load(m.Name()); ok {
		return c.(sync.WrapCapability)
	}
	return sync.WrapCapability{Mechanism: !m.Lacks(MechWrapPad)}
}

// cannotHold returns, for each serving member that cannot hold a key of
// kind k, why. With one serving member nothing needs replicating: none.
// Every member is asked to both send and receive the kind, whichever is
// primary: the primary changes with every failover, and a key a member
// could not send would not reach a member that comes back.
func (g *Group) cannotHold(k sync.Kind) []sync.Refusal {
	ms := g.serving()
	if len(ms) < 2 || !k.Wrapped() {
		return nil
	}
	var out []sync.Refusal
	for _, m := range ms {
		if byPairOnly(m) {
			// Judged by its pairs below, which must be proven.
			for _, o := range ms {
				if o == m {
					continue
				}
				for _, pk := range []string{pairKey(m.Name(), o.Name()), pairKey(o.Name(), m.Name())} {
					if _, ok := g.pairs.Load(pk); !ok {
						out = append(out, sync.Refusal{Member: m.Name(), Kind: k, Err: fmt.Errorf("its token offers no AES key wrap and the way keys travel between it and member %s is not proven yet", o.Name())})
					}
				}
			}
			continue
		}
		if err := g.capability(m).Holds(k); err != nil {
			out = append(out, sync.Refusal{Member: m.Name(), Kind: k, Err: err})
		}
	}
	for _, a := range ms {
		for _, b := range ms {
			if r := g.pairRefusal(a, b, k); r != nil {
				out = append(out, *r)
			}
		}
	}
	return out
}

// offered reports whether the virtual slot offers mech: every mechanism
// but one that generates keys some serving member cannot hold.
func (g *Group) offered(mech uint) bool {
	k, ok := sync.GeneratedKind(mech)
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
func kindOf(in intent, inputs []*vtable.Object) sync.Kind {
	k := sync.Kind{Class: in.class, KeyType: sync.KeyTypeUnknown}
	if !in.classKnown {
		k.Class = sync.ClassUnknownKey
	}
	switch gk, gen := sync.GeneratedKind(in.genMech); {
	case attrIndex(in.tmpl, pkcs11.CKA_KEY_TYPE) >= 0:
		k.KeyType = ulong(in.tmpl[attrIndex(in.tmpl, pkcs11.CKA_KEY_TYPE)].Value)
	case gen && in.generated:
		k.KeyType = gk.KeyType
	case in.copied && len(inputs) == 1:
		k.KeyType = inputs[0].Identity().KeyType
	}
	return k
}

// checkHold refuses, before anything is written, a creation that makes a
// key some serving member cannot hold: an event per member at fault
// (CreationRefused) and an error with a code op may return —
// CKR_MECHANISM_INVALID for a generation (the virtual slot does not offer
// the mechanism), CKR_TEMPLATE_INCONSISTENT for the others (the kind the
// template asks for cannot be made here). Neither is charged to a member.
func (g *Group) checkHold(op string, ins []intent, inputs []*vtable.Object) error {
	var refused []sync.Refusal
	for _, in := range ins {
		refused = append(refused, g.cannotHold(kindOf(in, inputs))...)
	}
	return g.refuse(op, refused)
}

// checkReplicable refuses, before anything is written, a creation of a
// key that travels wrapped (wrapped) while the group is not logged in as
// the user and two or more members serve: the domain key that carries it
// to the others is a private object, which no member shows before the
// login, so the key could be made on one member only (the bare token
// would make it; see "Differences from the member token"). The code is
// the token's for an object that needs a login, CKR_USER_NOT_LOGGED_IN,
// and nothing is charged to a member.
func (g *Group) checkReplicable(op string, wrapped bool) error {
	if who, in := g.LoggedIn(); !wrapped || in && who == pkcs11.CKU_USER || len(g.serving()) < 2 {
		return nil
	}
	return wrap(ErrNotLoggedIn, op, "", errors.New("a key made before the login cannot reach the other members: the domain key that carries it is a private object"))
}

// refuse reports each refusal and returns the error of op, or nil when
// there is none.
func (g *Group) refuse(op string, refused []sync.Refusal) error {
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
	return &Error{Code: code, Op: op, Member: refused[0].Member, Err: sync.Refusals(refused),
		msg: "every serving member must hold an object made through the group"}
}

// targetsCannotHold returns the refusals of targets (or of the source p)
// that cannot hold what ms holds, nil when every target can.
func (g *Group) targetsCannotHold(p *member.Member, targets []*member.Member, ms []made) sync.Refusals {
	var out sync.Refusals
	for _, m := range append([]*member.Member{p}, targets...) {
		for _, o := range ms {
			k := sync.KindOf(o.obj.Identity)
			if err := g.capability(m).Holds(k); err != nil && !byPairOnly(m) {
				out = append(out, sync.Refusal{Member: m.Name(), Kind: k, Err: err})
			}
			if r := g.pairRefusal(p, m, k); r != nil {
				out = append(out, *r)
			}
		}
	}
	return out
}

// targetsRefused returns the refusals among the copies' errors: a target
// answering its copy with a request error (not a health failure, not an
// ambiguous answer) will not take the object at all.
func targetsRefused(targets []*member.Member, errs []error, ms []made, failedAt []int) sync.Refusals {
	var out sync.Refusals
	for i, t := range targets {
		var se *slot.Error
		if err := errs[i]; err != nil && errors.As(err, &se) && se.Member == t.Name() &&
			slot.ClassOf(err) == slot.ClassRequest && !slot.Ambiguous(err) {
			out = append(out, sync.Refusal{Member: t.Name(), Kind: sync.KindOf(ms[failedAt[i]].obj.Identity), Err: err})
		}
	}
	return out
}

// A key travels between two members only by a way the pair proved by a
// round trip (sync.ProvePair), never by a mechanism's name: SoftHSM's and
// NSS's CKM_AES_KEY_WRAP_PAD are two wraps. Two tokens of one make, model
// and firmware run one implementation, whose wrap each member's own probe
// has already checked against its unwrap (sync.ProbeWrap): their pair
// needs no proof of its own, and their keys travel under the domain key.
// When a member is probed, every ordered pair it forms with a serving
// member of another make that was probed is proven (kept in Options.Facts
// for the next process); replication between them uses the best way the
// pair proved for the kind of key (pairWay), under a key agreed for the
// copy (pkg/sync/agree.go). A pair that proved no way for a kind of key is
// named in a KeysUnholdable event, and while both serve the group makes no
// key of that kind. A pair not proven yet (the other member was not
// probed, or a member failed under the proof) is proven when a copy first
// needs it.

func pairKey(src, dst string) string { return src + "\x00" + dst }

// provePairs proves the pairs m forms with the other serving members
// whose mechanisms are known, both ways. A member failing under a proof
// leaves the pair unproven; the member's own probe has charged it if it
// is m, and the other's next call will if it is the other.
func (g *Group) provePairs(ctx context.Context, m *member.Member, mechs []uint) {
	for _, o := range g.serving() {
		if o == m || o.Name() == m.Name() || o.Slot() == nil || m.Slot() == nil {
			continue
		}
		if sameMake(o.Slot().Token(), m.Slot().Token()) && !byPairOnly(m) {
			// A proof kept from before (a member re-opened on another
			// token) no longer holds.
			g.pairs.Delete(pairKey(m.Name(), o.Name()))
			g.pairs.Delete(pairKey(o.Name(), m.Name()))
			continue
		}
		v, ok := g.mechs.Load(o.Name())
		if !ok {
			continue
		}
		om := v.([]uint)
		g.provePair(ctx, m, o, mechs, om)
		g.provePair(ctx, o, m, om, mechs)
	}
}

func (g *Group) provePair(ctx context.Context, src, dst *member.Member, srcMechs, dstMechs []uint) {
	ss, ds := src.Slot(), dst.Slot()
	if ss == nil || ds == nil {
		return
	}
	p, err := sync.ProvePairKnown(ctx, ss, ds, srcMechs, dstMechs, g.opts.Facts)
	if err != nil {
		return
	}
	g.notePair(src.Name(), dst.Name(), p)
}

// notePair keeps p and reports, once per change, each kind of key it
// carries no way.
func (g *Group) notePair(src, dst string, p sync.PairWays) {
	old, seen := g.pairs.Swap(pairKey(src, dst), p)
	lacks := pairLacks(p)
	if seen && slices.Equal(pairLacks(old.(sync.PairWays)), lacks) || len(lacks) == 0 {
		return
	}
	for _, k := range lacks {
		g.emit(Event{Kind: KeysUnholdable, Member: dst, Err: fmt.Errorf(
			"no proven way carries %ss from member %s to member %s (%s): while both serve the group makes no such key and does not offer the mechanisms that generate them",
			pairKindName(k), src, dst, pairWhy(p, k))})
	}
}

// pairKinds are the kinds of key a pair proof speaks for: secret keys,
// RSA private keys, and every other private key (by the EC trial).
var pairKinds = []sync.Kind{
	{Class: pkcs11.CKO_SECRET_KEY, KeyType: sync.KeyTypeUnknown},
	{Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_RSA},
	{Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_EC},
}

func pairKindName(k sync.Kind) string {
	if k.Class == pkcs11.CKO_PRIVATE_KEY && k.KeyType == pkcs11.CKK_RSA {
		return "RSA private key"
	}
	return object.ClassName(k.Class)
}

// pairLacks lists the kinds of key p proved no way for.
func pairLacks(p sync.PairWays) []sync.Kind {
	var out []sync.Kind
	for _, k := range pairKinds {
		if _, ok := p.WayFor(k); !ok && p.TriedFor(k) {
			out = append(out, k)
		}
	}
	return out
}

// lacksKind reports whether p carries no keys of kind k: a key of unknown
// class or type is judged by every kind it may be.
func lacksKind(p sync.PairWays, k sync.Kind) (sync.Kind, bool) {
	for _, l := range pairLacks(p) {
		switch {
		case k.Class == sync.ClassUnknownKey,
			k.Class == l.Class && l.Class == pkcs11.CKO_SECRET_KEY,
			k.Class == l.Class && (k.KeyType == pkcs11.CKK_RSA) == (l.KeyType == pkcs11.CKK_RSA),
			k.Class == l.Class && k.KeyType == sync.KeyTypeUnknown:
			return l, true
		}
	}
	return sync.Kind{}, false
}

// pairWhy says why p proved no way for kind k.
func pairWhy(p sync.PairWays, k sync.Kind) string {
	return sync.PairFailures(p, pairKindName(k))
}

// pairRefusal is why keys of kind k cannot travel from a to b, nil when
// they can or the pair is not proven yet.
func (g *Group) pairRefusal(a, b *member.Member, k sync.Kind) *sync.Refusal {
	if a == b || !k.Wrapped() {
		return nil
	}
	v, ok := g.pairs.Load(pairKey(a.Name(), b.Name()))
	if !ok {
		return nil
	}
	p := v.(sync.PairWays)
	if l, lacks := lacksKind(p, k); lacks {
		return &sync.Refusal{Member: b.Name(), Kind: k, Err: fmt.Errorf("no proven way carries %ss from member %s to it (%s)",
			pairKindName(l), a.Name(), pairWhy(p, l))}
	}
	return nil
}

// pairWay is the Replicator's sync.PairWay: two members of one make that
// keeps a wrap-only key exchange keys under the domain key; two makes, or
// a make that keeps none (NSS), by the best way their pair proved for the
// kind, proven now if it was not yet.
func (g *Group) pairWay(ctx context.Context, src, dst *slot.Slot, k sync.Kind) (sync.Way, bool, error) {
	if t := dst.Token(); sameMake(src.Token(), t) && !tokenquirk.CarriesKeysByPairOnly(t.Manufacturer, t.Model) {
		// A member holding a domain key keeps a wrap-only key: only one
		// that holds none is tried (a write on its token, once per slot).
		holds, err := g.rep.HoldsDomainKey(ctx, dst)
		if err != nil || holds {
			return sync.Way{}, false, err
		}
		err = g.rep.KeepsWrapOnlyKey(ctx, dst)
		if !errors.Is(err, domainkey.ErrNoWrapOnlyKey) {
			return sync.Way{}, false, err
		}
	}
	v, ok := g.pairs.Load(pairKey(src.Name(), dst.Name()))
	if !ok {
		sm, err := src.Mechanisms(ctx)
		if err != nil {
			return sync.Way{}, true, err
		}
		dm, err := dst.Mechanisms(ctx)
		if err != nil {
			return sync.Way{}, true, err
		}
		p, err := sync.ProvePairKnown(ctx, src, dst, sm, dm, g.opts.Facts)
		if err != nil {
			return sync.Way{}, true, err
		}
		g.notePair(src.Name(), dst.Name(), p)
		v = p
	}
	p := v.(sync.PairWays)
	if w, ok := p.WayFor(k); ok {
		return w, true, nil
	}
	return sync.Way{}, true, &slot.Error{Member: dst.Name(), Op: slot.OpUnwrapKey, Code: pkcs11.CKR_KEY_TYPE_INCONSISTENT,
		Err: fmt.Errorf("%w: %w: no proven way carries %ss from member %s to it (%s)",
			pkcs11.Error(pkcs11.CKR_KEY_TYPE_INCONSISTENT), sync.ErrCannotCross, pairKindName(k), src.Name(), pairWhy(p, k))}
}

// byPairOnly reports whether m's make offers no AES key wrap, so keys
// reach it only by the ways its pairs proved (tokenquirk).
func byPairOnly(m *member.Member) bool {
	s := m.Slot()
	if s == nil {
		return false
	}
	t := s.Token()
	return tokenquirk.CarriesKeysByPairOnly(t.Manufacturer, t.Model)
}

// sameMake reports whether two tokens run one implementation: the same
// manufacturer, model and firmware.
func sameMake(a, b slot.TokenSummary) bool {
	return a.Manufacturer == b.Manufacturer && a.Model == b.Model && a.Firmware == b.Firmware
}
