package group

import (
	"bytes"
	"context"
	"errors"
	"slices"

	"github.com/hagroup/hagroup/pkg/group/vtable"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// Single-part operations. Each runs on one member chosen by the scheduler
// and moves to the next member after a health failure or a timeout, so the
// caller sees success while one member that holds the key lives. Request
// errors (bad mechanism, wrong signature, …) are returned as they are.

// withKey runs the single-part operation k with the group's key h.
func (g *Group) withKey(ctx context.Context, k OpKind, mech *pkcs11.Mechanism, h ObjectHandle, data, sig []byte) ([]byte, error) {
	o, err := g.key(k.String(), h, argOpKey)
	if err != nil {
		return nil, err
	}
	return hedged(ctx, g, k.String(), []*vtable.Object{o}, shotCall{k, mech, data, sig})
}

// Sign signs data with key in one part.
func (g *Group) Sign(ctx context.Context, mech *pkcs11.Mechanism, key ObjectHandle, data []byte) ([]byte, error) {
	return g.withKey(ctx, OpSign, mech, key, data, nil)
}

// Verify checks sig over data with key in one part.
func (g *Group) Verify(ctx context.Context, mech *pkcs11.Mechanism, key ObjectHandle, data, sig []byte) error {
	_, err := g.withKey(ctx, OpVerify, mech, key, data, sig)
	return err
}

// Encrypt encrypts data with key in one part.
func (g *Group) Encrypt(ctx context.Context, mech *pkcs11.Mechanism, key ObjectHandle, data []byte) ([]byte, error) {
	return g.withKey(ctx, OpEncrypt, mech, key, data, nil)
}

// Decrypt decrypts data with key in one part.
func (g *Group) Decrypt(ctx context.Context, mech *pkcs11.Mechanism, key ObjectHandle, data []byte) ([]byte, error) {
	return g.withKey(ctx, OpDecrypt, mech, key, data, nil)
}

// Digest digests data in one part.
func (g *Group) Digest(ctx context.Context, mech *pkcs11.Mechanism, data []byte) ([]byte, error) {
	return hedged(ctx, g, "Digest", nil, shotCall{OpDigest, mech, data, nil})
}

// GenerateRandom returns n random bytes from a member's generator.
func (g *Group) GenerateRandom(ctx context.Context, n int) ([]byte, error) {
	return hedged(ctx, g, "GenerateRandom", nil, randomCall{n})
}

// GetAttributes reads attributes of an object from one member (with
// failover). Each attribute comes back with its own status
// (CKR_ATTRIBUTE_SENSITIVE, CKR_ATTRIBUTE_TYPE_INVALID) as in
// C_GetAttributeValue. A key's protection and provenance attributes are
// presented as every member answers them (see present), whichever member
// served the read.
func (g *Group) GetAttributes(ctx context.Context, h ObjectHandle, types []uint) ([]slot.Attribute, error) {
	o, err := g.object("GetAttributes", h)
	if err != nil {
		return nil, err
	}
	if attrs, ok := g.answered(ctx, o, types); ok {
		return attrs, usable("GetAttributes", []*vtable.Object{o})
	}
	read := types
	if g.learnsWWT(o, types) {
		read = append(slices.Clone(types), pkcs11.CKA_WRAP_WITH_TRUSTED)
	}
	attrs, m, err := g.readVerifying(ctx, o, read)
	if attrs == nil && err == nil {
		m, err = g.exec(ctx, plan{op: "GetAttributes", objs: []*vtable.Object{o}, next: g.known(o)}, func(ctx context.Context, _ *member.Member, s *slot.Slot, hs []pkcs11.ObjectHandle) (err error) {
			attrs, err = s.GetAttributes(ctx, hs[0], read)
			return err
		})
	}
	if err != nil {
		return nil, err
	}
	if len(read) > len(types) {
		g.noteWWT(o, m, attrs[len(types)])
		attrs = attrs[:len(types)]
	}
	if o.IsKey() && containsType(types, viewTypes...) {
		g.present(ctx, o, attrs)
	}
	return attrs, nil
}

// learnsWWT reports whether a read of types of o, a private or secret key
// whose copies' CKA_WRAP_WITH_TRUSTED the group has not learnt yet, should
// read the member copy's too: a copy without it is enough for
// wrapWithTrustedEverywhere, and pkcs11-tool's CKA_EXTRACTABLE then costs
// no member call of its own. Not once a member refused an attribute a read
// was given beside the caller's (unfolded).
func (g *Group) learnsWWT(o *vtable.Object, types []uint) bool {
	c := o.Identity().Class
	return (c == pkcs11.CKO_PRIVATE_KEY || c == pkcs11.CKO_SECRET_KEY) && o.WWTOrigin.Load() == 0 &&
		g.unfolded.Load() == 0 && !slices.Contains(types, pkcs11.CKA_WRAP_WITH_TRUSTED)
}

// noteWWT keeps what m's copy of o answered for CKA_WRAP_WITH_TRUSTED
// beside a read (learnsWWT), as wrapWithTrustedOn reads it: false, or
// unknown to the token, is a copy without it.
func (g *Group) noteWWT(o *vtable.Object, m *member.Member, a slot.Attribute) {
	switch {
	case a.Status == pkcs11.CKR_OK && (len(a.Value) == 0 || a.Value[0] == 0):
		o.WWTOrigin.Store(vtable.WWTSomewhereFalse)
	case a.Status == pkcs11.CKR_ATTRIBUTE_TYPE_INVALID:
		o.WWTOrigin.Store(vtable.WWTSomewhereFalse)
		g.unfolded.Or(1 << uint(m.Index()))
	case a.Status != pkcs11.CKR_OK:
		g.unfolded.Or(1 << uint(m.Index()))
	}
}

// readVerifying reads types of o on the member a read goes to (known) when
// o's handle there is not yet checked against o's fingerprint (a
// find-all's), and reads the key material the check needs in the same
// member call (verifyRef's read): the first read of each object a
// listing tool makes after a find-all costs one member call, not two.
// A conflict is the read's answer, as resolve's would be. It returns the
// member read, or nil and no error when it did not read (another case, or
// the member did not answer): exec then reads as any read.
func (g *Group) readVerifying(ctx context.Context, o *vtable.Object, types []uint) ([]slot.Attribute, *member.Member, error) {
	if !o.Token || unusable(o) != nil {
		return nil, nil, nil
	}
	if err := g.gate.Enter(); err != nil {
		return nil, nil, nil // exec answers it
	}
	defer g.gate.Leave()
	m := g.known(o)(0)
	if m == nil {
		return nil, nil, nil
	}
	r := o.Ref(m.Index())
	if r == nil || !r.Unverified || r.Epoch != m.Epoch() || memberSet(g.unfolded.Load()).has(m.Index()) {
		return nil, nil, nil
	}
	// Only now: every read of a key comes here, and few find a handle
	// still to check.
	id := o.Identity()
	mat := object.MaterialTypes(id)
	if len(mat) == 0 {
		return nil, nil, nil
	}
	all := slices.Clone(types)
	for _, t := range mat {
		if !slices.Contains(all, t) {
			all = append(all, t)
		}
	}
	s := m.Slot()
	var got []slot.Attribute
	var fp []byte
	class, err := g.call(ctx, m, func() (err error) {
		if got, err = s.GetAttributes(ctx, r.Handle, all); err != nil {
			return err
		}
		a := object.Attrs{}
		for _, x := range got {
			switch {
			case !slices.Contains(mat, x.Type):
			case x.Status == pkcs11.CKR_OK:
				a[x.Type] = object.NonNil(x.Value)
			default:
				g.unfolded.Or(1 << uint(m.Index()))
			}
		}
		fp, err = object.FingerprintOf(ctx, s, r.Handle, id, a, nil)
		if errors.Is(err, object.ErrNoFingerprint) {
			return nil
		}
		return err
	})
	switch {
	case got == nil || class == slot.ClassHealth:
		return nil, nil, nil
	case err != nil:
		fp = nil // a request-class failure: no fingerprint to compare (fingerprint)
	}
	if want := o.Fingerprint(); want != nil && fp != nil && !bytes.Equal(want, fp) {
		g.conflict(o, m, want, fp)
		return nil, m, wrap(ErrConflict, "GetAttributes", m.Name(), nil)
	}
	o.SetFingerprint(fp)
	o.Verified(m.Index(), r)
	return got[:len(types)], m, nil
}

// answered answers a read naming only attributes the group answers
// without asking a member: CKA_CLASS, CKA_KEY_TYPE and CKA_TOKEN, which no
// call changes, from o's identity, and what present answers for every key
// whatever its copy says. pkcs11-tool -O reads each attribute on its own,
// and through hsmserve every member call is a round trip.
func (g *Group) answered(ctx context.Context, o *vtable.Object, types []uint) ([]slot.Attribute, bool) {
	id := o.Identity()
	private := id.Class == pkcs11.CKO_PRIVATE_KEY || id.Class == pkcs11.CKO_SECRET_KEY
	attrs := make([]slot.Attribute, len(types))
	for i, t := range types {
		a := slot.Attribute{Type: t, Status: pkcs11.CKR_OK}
		switch {
		case t == pkcs11.CKA_CLASS:
			a.Value = ulongBytes(id.Class)
		case t == pkcs11.CKA_TOKEN:
			a = boolAnswer(t, o.Token)
		case !o.IsKey():
			return nil, false
		case t == pkcs11.CKA_KEY_TYPE:
			a.Value = ulongBytes(id.KeyType)
		case t == pkcs11.CKA_LOCAL, t == pkcs11.CKA_KEY_GEN_MECHANISM:
		case private && (t == pkcs11.CKA_ALWAYS_SENSITIVE || t == pkcs11.CKA_NEVER_EXTRACTABLE ||
			t == pkcs11.CKA_EXTRACTABLE || t == pkcs11.CKA_WRAP_WITH_TRUSTED):
		case private && sensitiveTypes[t] && g.unextractable(ctx, o):
		default:
			return nil, false
		}
		attrs[i] = a
	}
	if o.IsKey() {
		g.present(ctx, o, attrs)
	}
	return attrs, true
}

func containsType(types []uint, want ...uint) bool {
	for _, t := range types {
		for _, w := range want {
			if t == w {
				return true
			}
		}
	}
	return false
}

// wrapWithTrustedCopies returns the serving members whose copy of o
// carries CKA_WRAP_WITH_TRUSTED=true. Such a copy can be wrapped only
// under a CKA_TRUSTED key, which an application's wrapping key is not:
// the token answers CKR_KEY_NOT_WRAPPABLE. Replicas made before keys
// travelled under transit keys (pkg/sync/transit.go) carry the flag
// whatever the application asked, so such a key is wrapped where it was
// made. A member that does not hold o or does not
// answer is left out (run finds that out and fails over). Read on every
// call, not kept: a member's copy changes when it is recovered or
// re-added, and WrapKey is not on the hot path.
func (g *Group) wrapWithTrustedCopies(ctx context.Context, o *vtable.Object) memberSet {
	var set memberSet
	for _, m := range g.serving() {
		if wwt, ok := g.wrapWithTrustedOn(ctx, o, m); ok && wwt {
			set.add(m.Index())
		}
	}
	return set
}

// wrapWithTrustedOn reads CKA_WRAP_WITH_TRUSTED of m's copy of o; ok is
// false when m does not hold o or does not answer.
// A token that does not know the attribute (opencryptoki 3.8, a v2.20
// token: CKR_ATTRIBUTE_TYPE_INVALID) holds a copy without it: protect
// gives it only under a trusted domain key, which such a token cannot hold.
func (g *Group) wrapWithTrustedOn(ctx context.Context, o *vtable.Object, m *member.Member) (wwt, ok bool) {
	return g.boolOr(ctx, o, m, pkcs11.CKA_WRAP_WITH_TRUSTED, pkcs11.CKR_ATTRIBUTE_TYPE_INVALID)
}

// boolOn reads the boolean attribute t of m's copy of o; ok is false when
// m does not answer it.
func (g *Group) boolOn(ctx context.Context, o *vtable.Object, m *member.Member, t uint) (v, ok bool) {
	return g.boolOr(ctx, o, m, t, pkcs11.CKR_OK)
}

// boolOr is boolOn where a copy answering the attribute's status unknown
// (not CKR_OK) reads false.
func (g *Group) boolOr(ctx context.Context, o *vtable.Object, m *member.Member, t, unknown uint) (v, ok bool) {
	h, err := g.resolve(ctx, o, m)
	if err != nil {
		return false, false
	}
	var attrs []slot.Attribute
	if _, err := g.call(ctx, m, func() (err error) {
		attrs, err = m.Slot().GetAttributes(ctx, h, []uint{t})
		return err
	}); err != nil || len(attrs) != 1 {
		return false, false
	}
	switch attrs[0].Status {
	case pkcs11.CKR_OK:
		return len(attrs[0].Value) > 0 && attrs[0].Value[0] != 0, true
	case unknown:
		return false, true
	}
	return false, false
}

// WrapKey wraps key under wrapping (with failover). A private or secret
// key the application did not make extractable cannot be wrapped through
// the group (CKR_KEY_UNEXTRACTABLE, see unextractable) even though the
// group keeps it physically extractable under trusted keys, so that it
// can move it between members under the domain key. A key the application
// made extractable is wrapped on a member whose copy lacks
// CKA_WRAP_WITH_TRUSTED (every copy, but for replicas made before transit
// keys), and on the others only when no such member serves.
func (g *Group) WrapKey(ctx context.Context, mech *pkcs11.Mechanism, wrapping, key ObjectHandle) ([]byte, error) {
	w, err := g.key("WrapKey", wrapping, argWrapping)
	if err != nil {
		return nil, err
	}
	k, err := g.key("WrapKey", key, argKey)
	if err != nil {
		return nil, err
	}
	if k.Identity().Class != pkcs11.CKO_PUBLIC_KEY && g.unextractable(ctx, k) {
		return nil, wrap(ErrKeyUnextractable, "WrapKey", "", nil)
	}
	var avoid memberSet
	if k.Identity().Class != pkcs11.CKO_PUBLIC_KEY {
		avoid = g.wrapWithTrustedCopies(ctx, k)
	}
	var out []byte
	_, err = g.exec(ctx, plan{op: "WrapKey", objs: []*vtable.Object{w, k}, avoid: avoid}, func(ctx context.Context, _ *member.Member, s *slot.Slot, hs []pkcs11.ObjectHandle) (err error) {
		out, err = s.WrapKey(ctx, mech, hs[0], hs[1])
		return err
	})
	return out, err
}
