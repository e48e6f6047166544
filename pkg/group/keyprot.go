package group

import (
	"context"
	"encoding/binary"
	"errors"
	"github.com/hagroup/hagroup/internal/tokenquirk"
	"slices"

	"github.com/hagroup/hagroup/pkg/group/vtable"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/miekg/pkcs11"
)

// Key protection: how a private or secret key made through the group is
// kept on the members, and how the virtual slot presents it (docs/DESIGN.md,
// "Key replication"). Both halves live here, since each reads what the
// other writes.
//
// The application's view of a key is the bare token's view, and every
// member's copy is at least as protected as that view. On every member the
// key is CKA_EXTRACTABLE=true (the group wraps it under the domain key to
// replicate it); it is CKA_SENSITIVE=true when the application made it
// sensitive or unextractable (a copy that lets itself be wrapped must not
// also show its value), and, under a trusted domain key,
// CKA_WRAP_WITH_TRUSTED=true unless the application made it extractable
// without asking for CKA_WRAP_WITH_TRUSTED. A user on a member can then
// neither read such a key nor wrap it under a key of their own (only the
// SO makes CKA_TRUSTED keys), and neither flag can be turned back
// (PKCS#11; SoftHSM refuses with CKR_ATTRIBUTE_READ_ONLY). A key the
// application made readable (CKA_SENSITIVE=false, CKA_EXTRACTABLE=true)
// is readable on every member, as it is to the application.
//
// The application's view is recorded by that combination, so that any
// process reading any member answers alike: a private or secret key whose
// every serving copy carries CKA_WRAP_WITH_TRUSTED=true is unextractable
// to the application. Replicas carry their source's flag and sensitivity
// (a key without the flag, or not sensitive, travels under a transit key,
// since the domain key's unwrap template would force them:
// pkg/sync/transit.go), so every copy of a key the application made
// extractable lets it out, as the bare token does. A replica made before
// that carries the flag: such a key is recognised by the copy it was made
// as, and reads unextractable once that copy is gone — the safe side.

// tokenDefaultSensitive is the token's CKA_SENSITIVE when a template
// gives none: every make measured (SoftHSM 2.6, NSS softokn 3.87,
// opencryptoki 3.8's soft token; test/conformance's key sweeps) makes a
// key readable then. CKA_EXTRACTABLE's default is the make's
// (tokenquirk.DefaultExtractable).
const tokenDefaultSensitive = false

// protect applies the members' side of the rule to in, a private or
// secret key about to be made on primary from the application's tmpl.
// from is the source of a C_CopyObject (nil otherwise): a copy inherits
// its source's protection on the member, and its template may restate
// CKA_SENSITIVE only where the source is not sensitive (SoftHSM answers
// CKR_ATTRIBUTE_READ_ONLY otherwise, and to CKA_WRAP_WITH_TRUSTED;
// CKA_EXTRACTABLE=true, which it holds already, is accepted); its default
// is its source's extractability, and a CKA_EXTRACTABLE=false it asks for
// makes the member copy sensitive and is kept by this process only (the
// copy cannot be given CKA_WRAP_WITH_TRUSTED). A copy of an unextractable
// key cannot be made extractable (CKR_ATTRIBUTE_READ_ONLY, as a token
// answers).
func (g *Group) protect(ctx context.Context, primary *member.Member, in *intent, tmpl []*pkcs11.Attribute, from *vtable.Object) error {
	ext, extSet := attrBool(tmpl, pkcs11.CKA_EXTRACTABLE)
	sens, sensSet := attrBool(tmpl, pkcs11.CKA_SENSITIVE)
	if g.capability(primary).Mechanism || byPairOnly(primary) {
		// Its copies travel wrapped. A token that wraps nothing (a TPM,
		// which refuses CKA_EXTRACTABLE=true) keeps what the application
		// asked, as the bare token.
		in.tmpl = setAttr(in.tmpl, pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, true))
	}
	if from != nil {
		return g.protectCopy(ctx, in, from, ext, extSet, sens, sensSet)
	}
	if !extSet {
		t := primary.Slot().Token()
		ext = tokenquirk.DefaultExtractable(t.Manufacturer, t.Model)
	}
	if !sensSet {
		sens = tokenDefaultSensitive
	}
	in.unextractable = !ext
	if sens || !ext {
		in.tmpl = setAttr(in.tmpl, pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true))
	}
	if wwt, _ := attrBool(tmpl, pkcs11.CKA_WRAP_WITH_TRUSTED); (!ext || wwt) && g.domainTrusted(ctx, primary) {
		in.tmpl = setAttr(in.tmpl, pkcs11.NewAttribute(pkcs11.CKA_WRAP_WITH_TRUSTED, true))
	}
	return nil
}

// protectCopy is protect for a copy of from, given what the copy's
// template asks (ext, sens, and whether each is set).
func (g *Group) protectCopy(ctx context.Context, in *intent, from *vtable.Object, ext, extSet, sens, sensSet bool) error {
	srcUnextractable := g.unextractable(ctx, from) // this process's word, or the members' copies
	if extSet && ext && srcUnextractable {
		return wrap(ErrReadOnly, "CopyObject", "", errors.New("a copy of an unextractable key cannot be extractable"))
	}
	in.unextractable = extSet && !ext || srcUnextractable
	if in.unextractable && !(sensSet && sens) && !srcUnextractable && !g.sensitiveOnMembers(ctx, from) {
		// Unextractable to the application, so not readable on the members.
		in.tmpl = setAttr(in.tmpl, pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true))
	}
	return nil
}

// sensitiveOnMembers reports whether the members' copies of o are
// sensitive: they are unless the application made o readable. Asked of
// the first serving member that answers; with none answering, true (the
// safe side).
func (g *Group) sensitiveOnMembers(ctx context.Context, o *vtable.Object) bool {
	for _, m := range g.serving() {
		if v, ok := g.boolOn(ctx, o, m, pkcs11.CKA_SENSITIVE); ok {
			return v
		}
	}
	return true
}

// latching is what a C_SetAttributeValue changes of the application's
// view of a key beyond what its members' copies show.
type latching struct {
	unextractable bool // CKA_EXTRACTABLE goes false (kept by this process: see SetAttributes)
}

// latch applies the latching attributes of attrs, set on the private or
// secret key o, as the bare token does (measured by test/conformance's
// latch steps): CKA_SENSITIVE goes from false to true only, and
// CKA_EXTRACTABLE from true to false only, any other change of either
// being CKR_ATTRIBUTE_READ_ONLY. It returns the attributes to send to the
// members: a key made unextractable becomes sensitive on them (a copy that
// lets itself be wrapped must not show its value) while it keeps
// CKA_EXTRACTABLE=true there for the domain key; a change the copies
// already hold is not sent, since the token would refuse it.
func (g *Group) latch(ctx context.Context, op string, o *vtable.Object, attrs []*pkcs11.Attribute) ([]*pkcs11.Attribute, latching, error) {
	var l latching
	unextractable := g.unextractable(ctx, o)
	if v, ok := attrBool(attrs, pkcs11.CKA_EXTRACTABLE); ok {
		if unextractable {
			return nil, l, wrap(ErrReadOnly, op, "", errors.New("CKA_EXTRACTABLE cannot change once false"))
		}
		if !v {
			l.unextractable = true
			attrs = slices.DeleteFunc(attrs, func(a *pkcs11.Attribute) bool { return a.Type == pkcs11.CKA_EXTRACTABLE })
		}
	}
	v, sensSet := attrBool(attrs, pkcs11.CKA_SENSITIVE)
	if l.unextractable && !(sensSet && v) && !g.sensitiveOnMembers(ctx, o) {
		attrs = setAttr(attrs, pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true))
	}
	return attrs, l, nil
}

// apply records l on o once the members took the change.
func (l latching) apply(o *vtable.Object) {
	if l.unextractable {
		o.Unextractable.Store(true)
	}
}

// unextractable reports whether the application may not wrap o, a
// private or secret key: it made or set it unextractable in this process,
// or every serving member's copy carries CKA_WRAP_WITH_TRUSTED (see the
// rule above).
func (g *Group) unextractable(ctx context.Context, o *vtable.Object) bool {
	return o.Unextractable.Load() || g.wrapWithTrustedEverywhere(ctx, o)
}

// wrapWithTrustedEverywhere reports whether no serving member holds a
// copy of o without CKA_WRAP_WITH_TRUSTED. A copy without it is the key as
// the application made it extractable (protect); replicas carry it
// whatever the application asked. With no member answering, true: the
// safe side. "Everywhere" is kept for the life of o only when every
// member of the group answered: a member away may hold the copy without
// it, and the key is extractable again when that member returns.
func (g *Group) wrapWithTrustedEverywhere(ctx context.Context, o *vtable.Object) bool {
	switch o.WWTOrigin.Load() {
	case vtable.WWTSomewhereFalse:
		return false
	case vtable.WWTEverywhere:
		return true
	}
	answered := 0
	for _, m := range g.serving() {
		wwt, ok := g.wrapWithTrustedOn(ctx, o, m)
		if !ok {
			continue
		}
		answered++
		if !wwt {
			o.WWTOrigin.Store(vtable.WWTSomewhereFalse)
			return false
		}
	}
	if answered == len(g.view().members) {
		o.WWTOrigin.Store(vtable.WWTEverywhere)
	}
	return true
}

// sensitiveTypes are the attributes that carry key material of a private
// or secret key.
var sensitiveTypes = map[uint]bool{
	pkcs11.CKA_VALUE:            true,
	pkcs11.CKA_PRIVATE_EXPONENT: true,
	pkcs11.CKA_PRIME_1:          true,
	pkcs11.CKA_PRIME_2:          true,
	pkcs11.CKA_EXPONENT_1:       true,
	pkcs11.CKA_EXPONENT_2:       true,
	pkcs11.CKA_COEFFICIENT:      true,
}

// viewTypes are the attributes present rewrites for some key; a read
// that names none of them is passed on as the member answered it.
var viewTypes = []uint{
	pkcs11.CKA_SENSITIVE, pkcs11.CKA_ALWAYS_SENSITIVE, pkcs11.CKA_EXTRACTABLE, pkcs11.CKA_NEVER_EXTRACTABLE,
	pkcs11.CKA_WRAP_WITH_TRUSTED, pkcs11.CKA_LOCAL, pkcs11.CKA_KEY_GEN_MECHANISM, pkcs11.CKA_VALUE_LEN,
	pkcs11.CKA_VALUE, pkcs11.CKA_PRIVATE_EXPONENT, pkcs11.CKA_PRIME_1, pkcs11.CKA_PRIME_2,
	pkcs11.CKA_EXPONENT_1, pkcs11.CKA_EXPONENT_2, pkcs11.CKA_COEFFICIENT,
}

// present rewrites attrs, read from one member's copy of the key o, into
// the answer every member gives through the virtual slot, in every
// process:
//   - CKA_SENSITIVE is the member copy's: the application's, but true for
//     a key it made unextractable (its copies must be sensitive);
//   - CKA_EXTRACTABLE and CKA_WRAP_WITH_TRUSTED say what unextractable
//     says; CKA_ALWAYS_SENSITIVE and CKA_NEVER_EXTRACTABLE are false for
//     every key: only the copy the application's call made could tell
//     (replicas were unwrapped, which the token marks as neither), and
//     false never claims a protection the group cannot show on every copy;
//   - key material is CKR_ATTRIBUTE_SENSITIVE for a key unextractable to
//     the application, else the member copy's answer;
//   - CKA_LOCAL is false and CKA_KEY_GEN_MECHANISM unavailable for every
//     key: most copies were unwrapped, not generated, on their token, and
//     which copy was generated changes with every recovery;
//   - a secret key's CKA_VALUE_LEN is the one copy that knows it tells
//     (SoftHSM gives unwrapped keys 0; see valueLen).
func (g *Group) present(ctx context.Context, o *vtable.Object, attrs []slot.Attribute) {
	class := o.Identity().Class
	private := class == pkcs11.CKO_PRIVATE_KEY || class == pkcs11.CKO_SECRET_KEY
	for i := range attrs {
		a := &attrs[i]
		switch {
		case a.Type == pkcs11.CKA_LOCAL:
			*a = boolAnswer(a.Type, false)
		case a.Type == pkcs11.CKA_KEY_GEN_MECHANISM:
			*a = slot.Attribute{Type: a.Type, Value: ulongBytes(pkcs11.CK_UNAVAILABLE_INFORMATION), Status: pkcs11.CKR_OK}
		case !private:
		case a.Type == pkcs11.CKA_ALWAYS_SENSITIVE, a.Type == pkcs11.CKA_NEVER_EXTRACTABLE:
			*a = boolAnswer(a.Type, false)
		case a.Type == pkcs11.CKA_EXTRACTABLE:
			*a = boolAnswer(a.Type, !g.unextractable(ctx, o))
		case a.Type == pkcs11.CKA_WRAP_WITH_TRUSTED:
			*a = boolAnswer(a.Type, g.wrapWithTrustedEverywhere(ctx, o))
		case sensitiveTypes[a.Type] && a.Status == pkcs11.CKR_OK && g.unextractable(ctx, o):
			*a = slot.Attribute{Type: a.Type, Status: pkcs11.CKR_ATTRIBUTE_SENSITIVE}
		case a.Type == pkcs11.CKA_VALUE_LEN && class == pkcs11.CKO_SECRET_KEY && a.Status == pkcs11.CKR_OK && ulong(a.Value) == 0:
			a.Value = ulongBytes(g.valueLen(ctx, o))
		}
	}
}

func boolAnswer(t uint, v bool) slot.Attribute {
	b := byte(0)
	if v {
		b = 1
	}
	return slot.Attribute{Type: t, Value: []byte{b}, Status: pkcs11.CKR_OK}
}

func ulongBytes(v uint) []byte { return binary.NativeEndian.AppendUint64(nil, uint64(v)) }

// valueLen returns the length of the secret key o. SoftHSM answers 0 for
// a key it unwrapped, which every replica is: the copy that was made by
// the application's call knows it; without one, an AES key's length is
// its wrapped blob's less the 8 bytes of RFC 5649's integrity block
// (AES keys are multiples of 8 bytes long, so the padding adds nothing).
// 0 when neither tells. A length found is kept for the life of o.
func (g *Group) valueLen(ctx context.Context, o *vtable.Object) uint {
	if n := o.ValueLen.Load(); n > 0 {
		return uint(n)
	}
	var n uint
	for _, m := range g.serving() {
		if n = g.valueLenOn(ctx, o, m); n > 0 {
			break
		}
	}
	if n > 0 {
		o.ValueLen.Store(uint64(n))
	}
	return n
}

// valueLenOn reads m's CKA_VALUE_LEN of o, or, when m says 0 and o is an
// AES key, measures it under m's domain key; 0 when m cannot tell.
func (g *Group) valueLenOn(ctx context.Context, o *vtable.Object, m *member.Member) uint {
	h, err := g.resolve(ctx, o, m)
	if err != nil {
		return 0
	}
	var n uint
	if _, err := g.call(ctx, m, func() error {
		attrs, err := m.Slot().GetAttributes(ctx, h, []uint{pkcs11.CKA_VALUE_LEN})
		if err == nil && len(attrs) == 1 && attrs[0].Status == pkcs11.CKR_OK {
			n = ulong(attrs[0].Value)
		}
		return err
	}); err != nil || n > 0 || o.Identity().KeyType != pkcs11.CKK_AES {
		return n
	}
	var blob []byte
	if _, err := g.call(ctx, m, func() error {
		dk, err := domainkey.Find(ctx, m.Slot(), g.serial)
		if err != nil {
			return err
		}
		blob, err = m.Slot().WrapKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP_PAD, nil), dk, h)
		return err
	}); err != nil || len(blob) <= 8 {
		return 0
	}
	defer clear(blob)
	return uint(len(blob) - 8)
}
