package sync

import (
	"context"
	"errors"
	"fmt"

	"github.com/hagroup/hagroup/pkg/slot"
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
	session := []*pkcs11.Attribute{boolAttr(pkcs11.CKA_TOKEN, false), pkcs11.NewAttribute(pkcs11.CKA_LABEL, transitLabel)}
	pub, priv, err = s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		append(session, pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, derP256), boolAttr(pkcs11.CKA_VERIFY, false)),
		append(session, boolAttr(pkcs11.CKA_PRIVATE, true), boolAttr(pkcs11.CKA_DERIVE, true), boolAttr(pkcs11.CKA_SIGN, false),
			boolAttr(pkcs11.CKA_SENSITIVE, true), boolAttr(pkcs11.CKA_EXTRACTABLE, false)))
	if err != nil {
		return nil, 0, 0, fmt.Errorf("make a key pair to agree a transit key: %w", err)
	}
	a, err := readAttrs(ctx, s, pub, []uint{pkcs11.CKA_EC_POINT})
	if err == nil && !a.nonEmpty(pkcs11.CKA_EC_POINT) {
		err = errors.New("the token does not show it")
	}
	if err != nil {
		destroyTransit(ctx, s, pub)
		destroyTransit(ctx, s, priv)
		return nil, 0, 0, fmt.Errorf("read the agreement key's point: %w", err)
	}
	return ecPoint(a[pkcs11.CKA_EC_POINT]), priv, pub, nil
}

// agreer is a member, or a session of one, that can agree a key.
type agreer interface {
	store
	GenerateKeyPair(ctx context.Context, m *pkcs11.Mechanism, pub, priv []*pkcs11.Attribute) (pkcs11.ObjectHandle, pkcs11.ObjectHandle, error)
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
		boolAttr(pkcs11.CKA_TOKEN, false),
		boolAttr(pkcs11.CKA_PRIVATE, true),
		boolAttr(pkcs11.CKA_SENSITIVE, true),
		boolAttr(pkcs11.CKA_EXTRACTABLE, false),
		boolAttr(pkcs11.CKA_WRAP, wrap),
		boolAttr(pkcs11.CKA_UNWRAP, !wrap),
		boolAttr(pkcs11.CKA_ENCRYPT, false),
		boolAttr(pkcs11.CKA_DECRYPT, false),
	})
	if err != nil {
		return 0, fmt.Errorf("derive the agreed transit key: %w", err)
	}
	return h, nil
}

// agreement is the source's half of the agreements: one key pair for
// every target of one ReplicateEach.
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
		destroyTransit(ctx, sc.slot, sc.agreed.priv)
		destroyTransit(ctx, sc.slot, sc.agreed.pub)
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
	if !a.boolean(pkcs11.CKA_EXTRACTABLE) {
		return 0, fmt.Errorf("the key is not extractable (CKA_EXTRACTABLE=false on %s), so it cannot be wrapped", j.src.name())
	}
	if a.boolean(pkcs11.CKA_WRAP_WITH_TRUSTED) {
		return 0, j.src.notCrossing(j.dname)
	}
	ds, ok := j.ds.(agreer)
	if !ok {
		return 0, fmt.Errorf("the target cannot agree a transit key")
	}
	half, err := j.src.agreeHalf(ctx)
	if err != nil {
		return 0, err
	}
	point, priv, pub, err := agreeKeyPair(ctx, ds)
	if err != nil {
		return 0, err
	}
	defer destroyTransit(ctx, ds, pub)
	defer destroyTransit(ctx, ds, priv)
	unwrapper, err := agreedKey(ctx, ds, priv, half.point, false)
	if err != nil {
		return 0, err
	}
	defer destroyTransit(ctx, ds, unwrapper)
	wrapper, err := agreedKey(ctx, j.src.slot, half.priv, point, true)
	if err != nil {
		return 0, fmt.Errorf("on %s: %w", j.src.name(), err)
	}
	defer destroyTransit(ctx, j.src.slot, wrapper)
	blob, err := j.src.slot.WrapKey(ctx, transitMech(j.way.Wrap), wrapper, j.src.h)
	if err != nil {
		return 0, fmt.Errorf("wrap with %s under the agreed transit key on %s: %w", transitMechName(j.way.Wrap), j.src.name(), err)
	}
	defer clear(blob)
	h, err := ds.UnwrapKey(ctx, transitMech(j.way.Unwrap), unwrapper, blob, withoutDefaults(tmpl))
	if err != nil {
		return 0, fmt.Errorf("unwrap with %s under the agreed transit key (the way %s proved): %w", transitMechName(j.way.Unwrap), j.way, err)
	}
	return h, nil
}

// crossDefaults are attributes a copy leaves to the target when they
// hold their default: NSS 3.87 answers CKR_GENERAL_ERROR to CKA_COPYABLE
// in a template at all, so only a value the source changed is asked for
// (and a make that cannot keep it refuses the copy).
var crossDefaults = map[uint]bool{pkcs11.CKA_COPYABLE: true, pkcs11.CKA_DESTROYABLE: true, pkcs11.CKA_MODIFIABLE: true}

func withoutDefaults(tmpl []*pkcs11.Attribute) []*pkcs11.Attribute {
	out := make([]*pkcs11.Attribute, 0, len(tmpl))
	for _, a := range tmpl {
		if crossDefaults[a.Type] && len(a.Value) == 1 && a.Value[0] != 0 {
			continue
		}
		out = append(out, a)
	}
	return out
}
