package group

import (
	"context"
	"encoding/binary"
	"errors"

	"github.com/hagroup/hagroup/pkg/group/vtable"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync"
	"github.com/miekg/pkcs11"
)

// Key protection: how a private or secret key made through the group is
// kept on the members, and how the virtual slot presents it (docs/DESIGN.md,
// "Key replication"). Both halves live here, since each reads what the
// other writes.
//
// On every member the key is CKA_SENSITIVE=true and CKA_EXTRACTABLE=true
// (the group wraps it under the domain key to replicate it), and, under a
// trusted domain key, CKA_WRAP_WITH_TRUSTED=true unless the application
// made it extractable without asking for CKA_WRAP_WITH_TRUSTED. A user on
// a member can then neither read it nor wrap it under a key of their own
// (only the SO makes CKA_TRUSTED keys), and neither flag can be turned
// back (PKCS#11; SoftHSM refuses with CKR_ATTRIBUTE_READ_ONLY).
//
// The application's view is recorded by that combination, so that any
// process reading any member answers alike: a private or secret key whose
// every serving copy carries CKA_WRAP_WITH_TRUSTED=true is unextractable
// to the application. Replicas carry their source's flag (a key without
// it travels under a transit key, since the trusted domain key's unwrap
// template would force it: pkg/sync/transit.go), so every copy of a
// key the application made extractable lets it out, as the bare token
// does. A replica made before that carries the flag: such a key is
// recognised by the copy it was made as, and reads unextractable once that
// copy is gone — the safe side.

// tokenDefaultExtractable is CKA_EXTRACTABLE when a template gives none:
// SoftHSM 2.6's default (measured by TestKeyprot/BareDefaults in
// test/security), and the safe side for tokens whose default is not known.
const tokenDefaultExtractable = false

// protect applies the members' side of the rule to in, a private or
// secret key about to be made on primary from the application's tmpl.
// from is the source of a C_CopyObject (nil otherwise): a copy inherits
// its source's protection on the member, and its template may not restate
// it (SoftHSM answers CKR_ATTRIBUTE_READ_ONLY to CKA_SENSITIVE=true or
// CKA_WRAP_WITH_TRUSTED in a copy's template, whatever the source holds;
// CKA_EXTRACTABLE=true, which it holds already, is accepted);
// its default is its source's extractability, and a CKA_EXTRACTABLE=false
// it asks for is kept by this process only (the copy cannot be given
// CKA_WRAP_WITH_TRUSTED). A copy of an unextractable key cannot be made
// extractable (CKR_ATTRIBUTE_READ_ONLY, as a token answers).
func (g *Group) protect(ctx context.Context, primary *member.Member, in *intent, tmpl []*pkcs11.Attribute, from *vtable.Object) error {
	ext, set := attrBool(tmpl, pkcs11.CKA_EXTRACTABLE)
	in.tmpl = setAttr(in.tmpl, pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, true))
	if from != nil {
		srcUnextractable := g.unextractable(ctx, from) // this process's word, or the members' copies
		if set && ext && srcUnextractable {
			return wrap(ErrReadOnly, "CopyObject", "", errors.New("a copy of an unextractable key cannot be extractable"))
		}
		in.unextractable = set && !ext || srcUnextractable
		return nil
	}
	if !set {
		ext = tokenDefaultExtractable
	}
	in.unextractable = !ext
	in.tmpl = setAttr(in.tmpl, pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true))
	if wwt, _ := attrBool(tmpl, pkcs11.CKA_WRAP_WITH_TRUSTED); (!ext || wwt) && g.domainTrusted(ctx, primary) {
		in.tmpl = setAttr(in.tmpl, pkcs11.NewAttribute(pkcs11.CKA_WRAP_WITH_TRUSTED, true))
	}
	return nil
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
// the answer every member gives through the virtual slot:
//   - a private or secret key is sensitive (CKA_SENSITIVE and
//     CKA_ALWAYS_SENSITIVE true, its material CKR_ATTRIBUTE_SENSITIVE), as
//     every member's copy is;
//   - CKA_EXTRACTABLE, CKA_NEVER_EXTRACTABLE and CKA_WRAP_WITH_TRUSTED say
//     what unextractable says;
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
		case a.Type == pkcs11.CKA_SENSITIVE, a.Type == pkcs11.CKA_ALWAYS_SENSITIVE:
			*a = boolAnswer(a.Type, true)
		case a.Type == pkcs11.CKA_EXTRACTABLE:
			*a = boolAnswer(a.Type, !g.unextractable(ctx, o))
		case a.Type == pkcs11.CKA_NEVER_EXTRACTABLE:
			*a = boolAnswer(a.Type, g.unextractable(ctx, o))
		case a.Type == pkcs11.CKA_WRAP_WITH_TRUSTED:
			*a = boolAnswer(a.Type, g.wrapWithTrustedEverywhere(ctx, o))
		case sensitiveTypes[a.Type] && (a.Status == pkcs11.CKR_OK || a.Status == pkcs11.CKR_ATTRIBUTE_SENSITIVE):
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
		dk, err := sync.FindDomainKey(ctx, m.Slot(), g.serial)
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
