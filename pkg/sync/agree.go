package sync

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// Between members of two makes a key does not travel under the domain key.
// The domain key is a promise only a make that keeps a wrap-only key
// can make: NSS softokn 3.87 refuses CKA_COPYABLE and
// CKA_ALLOWED_MECHANISMS on a token key, keeps no CKA_UNWRAP_TEMPLATE, and
// copies a non-modifiable key into one that decrypts or is extractable, so
// a user with the user PIN would read every key the group wraps under a
// domain key it held (DESIGN.md, "How a key travels"). So a key crosses
// between makes under a key agreed for the one copy: each side makes a
// throwaway P-256 key pair, each derives the same AES-256 key from its
// private half and the other's public point (CKM_ECDH1_DERIVE), the
// source's copy wraps only and the target's unwraps only, neither is
// extractable or readable, all are session objects of this process, and
// all are destroyed once the copy is made. The key is wrapped with the
// way the pair proved (ProvePair) on the source and unwrapped with its
// other half on the target.
//
// The agreed key is not CKA_TRUSTED: a key that may be wrapped under a
// trusted key only (CKA_WRAP_WITH_TRUSTED, which the group gives a key the
// application made unextractable under a trusted domain key) never
// crosses, and is refused before any call (a make may not enforce the
// flag). What crosses is what a user on the source could already wrap
// under a key of their own, and the copy takes the source's own
// CKA_SENSITIVE and CKA_WRAP_WITH_TRUSTED: no one gains from the crossing.

// ErrCannotCross is wrapped by errors saying a key cannot travel from its
// member to another: no way the pair proved carries its kind, or it may be
// wrapped under trusted keys only and the target holds none. The key stays
// where it is; a catch-up leaves it out rather than failing.
var ErrCannotCross = errors.New("the key cannot travel between these members")

// PairWay says how keys of kind k travel from src to dst: cross is false
// for two members of one make (the key goes under the domain key); for
// two makes, way is the way their pair proved, or err says why none
// carries such keys (a request error naming dst).
type PairWay func(ctx context.Context, src, dst *slot.Slot, k Kind) (way Way, cross bool, err error)

// agreeKeyPair is a throwaway P-256 key pair whose private half derives
// only.
func agreeKeyPair(ctx context.Context, s agreer) (point []byte, priv, pub pkcs11.ObjectHandle, err error) {
	session := []*pkcs11.Attribute{object.BoolAttr(pkcs11.CKA_TOKEN, false), pkcs11.NewAttribute(pkcs11.CKA_LABEL, transitLabel)}
	pub, priv, err = s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		append(session, pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, derP256), object.BoolAttr(pkcs11.CKA_VERIFY, false)),
		append(session, object.BoolAttr(pkcs11.CKA_PRIVATE, true), object.BoolAttr(pkcs11.CKA_DERIVE, true), object.BoolAttr(pkcs11.CKA_SIGN, false),
			object.BoolAttr(pkcs11.CKA_SENSITIVE, true), object.BoolAttr(pkcs11.CKA_EXTRACTABLE, false)))
	if err != nil {
		return nil, 0, 0, fmt.Errorf("make a key pair to agree a transit key: %w", err)
	}
	a, err := object.ReadAttrs(ctx, s, pub, []uint{pkcs11.CKA_EC_POINT})
	if err == nil && !a.NonEmpty(pkcs11.CKA_EC_POINT) {
		err = errors.New("the token does not show it")
	}
	if err != nil {
		object.Discard(ctx, s, pub)
		object.Discard(ctx, s, priv)
		return nil, 0, 0, fmt.Errorf("read the agreement key's point: %w", err)
	}
	return object.ECPoint(a[pkcs11.CKA_EC_POINT]), priv, pub, nil
}

// agreer is a member, or a session of one, that can agree a key.
type agreer interface {
	object.Store
	GenerateKeyPair(ctx context.Context, m *pkcs11.Mechanism, pub, priv []*pkcs11.Attribute) (pkcs11.ObjectHandle, pkcs11.ObjectHandle, error)
	GenerateKey(ctx context.Context, m *pkcs11.Mechanism, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error)
	DeriveKey(ctx context.Context, m *pkcs11.Mechanism, base pkcs11.ObjectHandle, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error)
}

var (
	_ agreer = (*slot.Slot)(nil)
	_ agreer = (*slot.Session)(nil)
)

// agreedKey derives, from priv and the other side's point, the transit
// key: wrap only (the source) or unwrap only (the target).
func agreedKey(ctx context.Context, s agreer, priv pkcs11.ObjectHandle, other []byte, wrap bool) (pkcs11.ObjectHandle, error) {
	m := pkcs11.NewMechanism(pkcs11.CKM_ECDH1_DERIVE, pkcs11.NewECDH1DeriveParams(pkcs11.CKD_NULL, nil, other))
	h, err := s.DeriveKey(ctx, m, priv, []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY),
		pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
		pkcs11.NewAttribute(pkcs11.CKA_VALUE_LEN, 32),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, transitLabel),
		object.BoolAttr(pkcs11.CKA_TOKEN, false),
		object.BoolAttr(pkcs11.CKA_PRIVATE, true),
		object.BoolAttr(pkcs11.CKA_SENSITIVE, true),
		object.BoolAttr(pkcs11.CKA_EXTRACTABLE, false),
		object.BoolAttr(pkcs11.CKA_WRAP, wrap),
		object.BoolAttr(pkcs11.CKA_UNWRAP, !wrap),
		object.BoolAttr(pkcs11.CKA_ENCRYPT, false),
		object.BoolAttr(pkcs11.CKA_DECRYPT, false),
	})
	if err != nil {
		return 0, fmt.Errorf("derive the agreed transit key: %w", err)
	}
	return h, nil
}

// agreement is the source's half of the agreements: one key pair for
// every target of one shared source (Shared, ReplicateEach).
type agreement struct {
	point     []byte
	priv, pub pkcs11.ObjectHandle
}

// agreeHalf makes the source's key pair once; a failure is kept too.
func (sc *source) agreeHalf(ctx context.Context) (*agreement, error) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.agreed == nil && sc.agreeErr == nil {
		var a agreement
		a.point, a.priv, a.pub, sc.agreeErr = agreeKeyPair(ctx, sc.slot)
		if sc.agreeErr == nil {
			sc.agreed = &a
		} else {
			sc.agreeErr = fmt.Errorf("on %s: %w", sc.name(), sc.agreeErr)
		}
	}
	return sc.agreed, sc.agreeErr
}

// dropAgreement destroys the source's key pair.
func (sc *source) dropAgreement(ctx context.Context) {
	if sc.agreed != nil {
		object.Discard(ctx, sc.slot, sc.agreed.priv)
		object.Discard(ctx, sc.slot, sc.agreed.pub)
		sc.agreed = nil
	}
}

// notCrossing is the source's refusal of a key that may not cross
// between makes: one wrappable under trusted keys only. It names the
// source as a token refusal would (CKR_KEY_NOT_WRAPPABLE), so a creation
// fails cleanly, charging no member.
func (sc *source) notCrossing(target string) error {
	return &slot.Error{Member: sc.name(), Op: "WrapKey", Code: pkcs11.CKR_KEY_NOT_WRAPPABLE, Err: fmt.Errorf(
		"%w: %w: it carries CKA_WRAP_WITH_TRUSTED (made unextractable under a trusted domain key), so it cannot reach member %s, which holds no domain key",
		pkcs11.Error(pkcs11.CKR_KEY_NOT_WRAPPABLE), ErrCannotCross, target)}
}

// createCrossed makes the copy on a target of another make: the source
// wrapped with j.way.Wrap under a transit key agreed for this copy,
// unwrapped with j.way.Unwrap on the target with tmpl, the source's own
// attributes.
func (j *replication) createCrossed(ctx context.Context, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	a, err := j.src.unwrapAttrs(ctx)
	if err != nil {
		return 0, err
	}
	if !a.Boolean(pkcs11.CKA_EXTRACTABLE) {
		return 0, fmt.Errorf("the key is not extractable (CKA_EXTRACTABLE=false on %s), so it cannot be wrapped", j.src.name())
	}
	if a.Boolean(pkcs11.CKA_WRAP_WITH_TRUSTED) {
		return 0, j.src.notCrossing(j.dname)
	}
	ds, ok := j.ds.(agreer)
	if !ok {
		return 0, fmt.Errorf("the target cannot agree a transit key")
	}
	var wrapper, unwrapper pkcs11.ObjectHandle
	var drop func()
	if j.way.Wrap == pkcs11.CKM_RSA_PKCS_OAEP {
		// The key itself goes under the target's transport key.
		wrapper, unwrapper, drop, err = transportKeys(ctx, j.src.slot, j.src.name(), ds, true)
	} else {
		wrapper, unwrapper, drop, err = j.agreeTransit(ctx, ds)
	}
	if err != nil {
		return 0, err
	}
	defer drop()
	blob, err := j.src.slot.WrapKey(ctx, transitMech(j.way.Wrap), wrapper, j.src.h)
	if err != nil {
		return 0, fmt.Errorf("wrap with %s under the agreed transit key on %s: %w", transitMechName(j.way.Wrap), j.src.name(), err)
	}
	defer clear(blob)
	h, err := ds.UnwrapKey(ctx, transitMech(j.way.Unwrap), unwrapper, blob, withoutDefaults(tmpl))
	if slot.CodeOf(err) == pkcs11.CKR_ATTRIBUTE_READ_ONLY {
		h, err = unwrapThenProtect(ctx, ds, transitMech(j.way.Unwrap), unwrapper, blob, withoutDefaults(tmpl))
	}
	if err != nil {
		return 0, fmt.Errorf("unwrap with %s under the agreed transit key (the way %s proved): %w", transitMechName(j.way.Unwrap), j.way, err)
	}
	return h, nil
}

// agreeTransit makes the transit key of one copy: wrap only on the
// source, unwrap only on the target; drop destroys what it made. By
// ECDH where both tokens make P-256 keys; where one makes none
// (opencryptoki 3.8's soft token: RSA only), by RSA key transport.
func (j *replication) agreeTransit(ctx context.Context, ds agreer) (wrapper, unwrapper pkcs11.ObjectHandle, drop func(), err error) {
	half, err := j.src.agreeHalf(ctx)
	var point []byte
	var priv, pub pkcs11.ObjectHandle
	if err == nil {
		point, priv, pub, err = agreeKeyPair(ctx, ds)
	}
	if slot.ClassOf(err) == slot.ClassRequest {
		return transportTransit(ctx, j.src.slot, ds)
	}
	if err != nil {
		return 0, 0, nil, err
	}
	var made []func()
	drop = func() {
		for _, d := range slices.Backward(made) {
			d()
		}
	}
	made = append(made, func() { object.Discard(ctx, ds, pub) }, func() { object.Discard(ctx, ds, priv) })
	if unwrapper, err = agreedKey(ctx, ds, priv, half.point, false); err != nil {
		drop()
		return 0, 0, nil, err
	}
	made = append(made, func() { object.Discard(ctx, ds, unwrapper) })
	if wrapper, err = agreedKey(ctx, j.src.slot, half.priv, point, true); err != nil {
		drop()
		return 0, 0, nil, fmt.Errorf("on %s: %w", j.src.name(), err)
	}
	made = append(made, func() { object.Discard(ctx, j.src.slot, wrapper) })
	return wrapper, unwrapper, drop, nil
}

// transportTransit is agreeTransit by RSA key transport: the target's
// throwaway RSA pair (transportKeys) carries the AES-256 transit key the
// source makes. The source's transit key must be extractable to be
// wrapped: a private session object of this process that wraps only,
// destroyed once the copy is made, as the agreed key is.
func transportTransit(ctx context.Context, src *slot.Slot, ds agreer) (wrapper, unwrapper pkcs11.ObjectHandle, drop func(), err error) {
	srcPub, priv, drop, err := transportKeys(ctx, src, src.Name(), ds, true)
	if err != nil {
		return 0, 0, nil, err
	}
	fail := func(format string, err error) (pkcs11.ObjectHandle, pkcs11.ObjectHandle, func(), error) {
		drop()
		return 0, 0, nil, fmt.Errorf(format, err)
	}
	secret := func(wrap bool) []*pkcs11.Attribute {
		return []*pkcs11.Attribute{object.BoolAttr(pkcs11.CKA_TOKEN, false), pkcs11.NewAttribute(pkcs11.CKA_LABEL, transitLabel),
			pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
			object.BoolAttr(pkcs11.CKA_PRIVATE, true), object.BoolAttr(pkcs11.CKA_SENSITIVE, true), object.BoolAttr(pkcs11.CKA_EXTRACTABLE, wrap),
			object.BoolAttr(pkcs11.CKA_WRAP, wrap), object.BoolAttr(pkcs11.CKA_UNWRAP, !wrap), object.BoolAttr(pkcs11.CKA_ENCRYPT, false), object.BoolAttr(pkcs11.CKA_DECRYPT, false)}
	}
	if wrapper, err = src.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil),
		append(secret(true), pkcs11.NewAttribute(pkcs11.CKA_VALUE_LEN, 32))); err != nil {
		return fail("on "+src.Name()+": make the transit key: %w", err)
	}
	dropKeys := drop
	drop = func() { object.Discard(ctx, src, wrapper); dropKeys() }
	for _, m := range []*pkcs11.Mechanism{transitMech(pkcs11.CKM_RSA_PKCS_OAEP), pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS, nil)} {
		var blob []byte
		if blob, err = src.WrapKey(ctx, m, srcPub, wrapper); err == nil {
			unwrapper, err = ds.UnwrapKey(ctx, m, priv, blob, secret(false))
			clear(blob)
		}
		if err == nil {
			dropRest := drop
			drop = func() { object.Discard(ctx, ds, unwrapper); dropRest() }
			return wrapper, unwrapper, drop, nil
		}
		if slot.ClassOf(err) != slot.ClassRequest {
			break
		}
	}
	return fail("transport the transit key under RSA: %w", err)
}

// transportKeys makes the keys of an RSA key transport from src (named
// srcName) to ds: a throwaway RSA-2048 pair on ds whose private half
// unwraps only, and its public half imported on src to wrap only (RSA-OAEP,
// or PKCS #1 v1.5 where the token has no OAEP wrap: the pair is used once,
// so no oracle answers for it). private makes the private half a private
// object (a pair proof, which needs no login, makes it public). drop
// destroys them.
func transportKeys(ctx context.Context, src agreer, srcName string, ds agreer, private bool) (wrapper, unwrapper pkcs11.ObjectHandle, drop func(), err error) {
	var made []func()
	drop = func() {
		for _, d := range slices.Backward(made) {
			d()
		}
	}
	fail := func(format string, err error) (pkcs11.ObjectHandle, pkcs11.ObjectHandle, func(), error) {
		drop()
		return 0, 0, nil, fmt.Errorf(format, err)
	}
	session := []*pkcs11.Attribute{object.BoolAttr(pkcs11.CKA_TOKEN, false), pkcs11.NewAttribute(pkcs11.CKA_LABEL, transitLabel)}
	pub, priv, err := ds.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS_KEY_PAIR_GEN, nil),
		append(slices.Clone(session), pkcs11.NewAttribute(pkcs11.CKA_MODULUS_BITS, 2048), pkcs11.NewAttribute(pkcs11.CKA_PUBLIC_EXPONENT, []byte{1, 0, 1}),
			object.BoolAttr(pkcs11.CKA_WRAP, false), object.BoolAttr(pkcs11.CKA_ENCRYPT, false), object.BoolAttr(pkcs11.CKA_VERIFY, false)),
		append(slices.Clone(session), object.BoolAttr(pkcs11.CKA_PRIVATE, private), object.BoolAttr(pkcs11.CKA_UNWRAP, true), object.BoolAttr(pkcs11.CKA_DECRYPT, false),
			object.BoolAttr(pkcs11.CKA_SIGN, false), object.BoolAttr(pkcs11.CKA_SENSITIVE, true), object.BoolAttr(pkcs11.CKA_EXTRACTABLE, false)))
	if err != nil {
		return fail("make a key pair for RSA key transport: %w", err)
	}
	made = append(made, func() { object.Discard(ctx, ds, pub) }, func() { object.Discard(ctx, ds, priv) })
	a, err := object.ReadAttrs(ctx, ds, pub, []uint{pkcs11.CKA_MODULUS, pkcs11.CKA_PUBLIC_EXPONENT})
	if err == nil && (!a.NonEmpty(pkcs11.CKA_MODULUS) || !a.NonEmpty(pkcs11.CKA_PUBLIC_EXPONENT)) {
		err = errors.New("the token does not show it")
	}
	if err != nil {
		return fail("read the transport key's public half: %w", err)
	}
	srcPub, err := src.CreateObject(ctx, append(slices.Clone(session),
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_PUBLIC_KEY), pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_RSA),
		pkcs11.NewAttribute(pkcs11.CKA_MODULUS, a[pkcs11.CKA_MODULUS]), pkcs11.NewAttribute(pkcs11.CKA_PUBLIC_EXPONENT, a[pkcs11.CKA_PUBLIC_EXPONENT]),
		object.BoolAttr(pkcs11.CKA_WRAP, true), object.BoolAttr(pkcs11.CKA_ENCRYPT, false), object.BoolAttr(pkcs11.CKA_VERIFY, false)))
	if err != nil {
		return fail("on "+srcName+": import the transport key: %w", err)
	}
	made = append(made, func() { object.Discard(ctx, src, srcPub) })
	return srcPub, priv, drop, nil
}

// laterTypes are the attributes a make may refuse in an unwrap template
// (opencryptoki 3.8's soft token: CKR_ATTRIBUTE_READ_ONLY) and then take
// by C_SetAttributeValue.
var laterTypes = []uint{pkcs11.CKA_SENSITIVE, pkcs11.CKA_EXTRACTABLE}

// unwrapThenProtect unwraps blob on a token that refused tmpl's
// CKA_SENSITIVE or CKA_EXTRACTABLE: as a session object of this process
// without them (no other process, and no user on the token, sees it),
// given them where its default differs (the token allows a change to the
// safe side only, and the source's values are what it asks), read back,
// and then copied to the token object tmpl asks for; the session object
// is destroyed. A token that keeps neither refuses the copy.
func unwrapThenProtect(ctx context.Context, ds agreer, m *pkcs11.Mechanism, unwrapper pkcs11.ObjectHandle, blob []byte, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	c, ok := ds.(interface {
		CopyObject(ctx context.Context, h pkcs11.ObjectHandle, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error)
	})
	if !ok {
		return 0, errors.New("the target cannot copy an object")
	}
	var first []*pkcs11.Attribute
	want := map[uint]bool{}
	token := false
	for _, a := range tmpl {
		switch {
		case slices.Contains(laterTypes, a.Type):
			want[a.Type] = len(a.Value) > 0 && a.Value[0] != 0
		case a.Type == pkcs11.CKA_TOKEN:
			token = len(a.Value) > 0 && a.Value[0] != 0
		default:
			first = append(first, a)
		}
	}
	h, err := ds.UnwrapKey(ctx, m, unwrapper, blob, append(first, object.BoolAttr(pkcs11.CKA_TOKEN, false)))
	if err != nil {
		return 0, err
	}
	defer object.Discard(ctx, ds, h)
	got, err := object.ReadAttrs(ctx, ds, h, laterTypes)
	if err != nil {
		return 0, fmt.Errorf("read the unwrapped copy's protection: %w", err)
	}
	var set []*pkcs11.Attribute
	for t, v := range want {
		if got.Boolean(t) != v {
			set = append(set, object.BoolAttr(t, v))
		}
	}
	if len(set) > 0 {
		if err := ds.SetAttributes(ctx, h, set); err != nil {
			return 0, fmt.Errorf("give the unwrapped copy the source's CKA_SENSITIVE and CKA_EXTRACTABLE: %w", err)
		}
	}
	if !token {
		return 0, errors.New("a copy that is not a token object")
	}
	cp, err := c.CopyObject(ctx, h, []*pkcs11.Attribute{object.BoolAttr(pkcs11.CKA_TOKEN, true)})
	if err != nil {
		return 0, fmt.Errorf("copy the unwrapped copy to a token object: %w", err)
	}
	if got, err = object.ReadAttrs(ctx, ds, cp, laterTypes); err == nil {
		for t, v := range want {
			if got.Boolean(t) != v {
				err = fmt.Errorf("attribute 0x%x reads %v on the copy, the source's is %v", t, got.Boolean(t), v)
			}
		}
	}
	if err != nil {
		object.Discard(ctx, ds, cp)
		return 0, fmt.Errorf("the copy does not keep the source's protection: %w", err)
	}
	return cp, nil
}

// crossDefaults are attributes a copy leaves to the target when they
// hold their default (the value here): NSS 3.87 answers CKR_GENERAL_ERROR
// to CKA_COPYABLE in a template at all, and opencryptoki 3.8's soft token
// (a v2.20 token) CKR_ATTRIBUTE_TYPE_INVALID to CKA_WRAP_WITH_TRUSTED, so
// only a value the source changed is asked for (and a make that cannot
// keep it refuses the copy).
var crossDefaults = map[uint]bool{pkcs11.CKA_COPYABLE: true, pkcs11.CKA_DESTROYABLE: true, pkcs11.CKA_MODIFIABLE: true,
	pkcs11.CKA_WRAP_WITH_TRUSTED: false}

func withoutDefaults(tmpl []*pkcs11.Attribute) []*pkcs11.Attribute {
	out := make([]*pkcs11.Attribute, 0, len(tmpl))
	for _, a := range tmpl {
		if def, ok := crossDefaults[a.Type]; ok && len(a.Value) == 1 && (a.Value[0] != 0) == def {
			continue
		}
		out = append(out, a)
	}
	return out
}
