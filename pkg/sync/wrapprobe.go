package sync

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// Kind is a kind of key: its class and key type. KeyTypeUnknown stands for
// a key whose type is not known before it is made (an unwrap or derive
// whose template names none).
type Kind struct{ Class, KeyType uint }

// KeyTypeUnknown is the KeyType of a Kind whose key type is not known.
const KeyTypeUnknown = ^uint(0)

// ClassUnknownKey is the Class of a Kind that is a private or a secret key,
// which one not known (an unwrap whose template names no class).
const ClassUnknownKey = ^uint(0)

func (k Kind) String() string {
	if k.Class == ClassUnknownKey {
		return "key"
	}
	if k.KeyType == KeyTypeUnknown {
		return object.ClassName(k.Class)
	}
	return object.KeyTypeName(k.KeyType) + " " + object.ClassName(k.Class)
}

// Wrapped reports whether keys of kind k travel wrapped under the domain
// key (private and secret keys) rather than by their attributes.
func (k Kind) Wrapped() bool {
	return k.Class == pkcs11.CKO_PRIVATE_KEY || k.Class == pkcs11.CKO_SECRET_KEY || k.Class == ClassUnknownKey
}

// WrapCapability is what one token can wrap and unwrap with
// CKM_AES_KEY_WRAP_PAD, the mechanism keys travel under between members.
type WrapCapability struct {
	// Mechanism reports whether the token offers CKM_AES_KEY_WRAP_PAD.
	Mechanism bool
	// Refused holds, for each kind the token would not wrap or unwrap in
	// the trial, the token's answer (SoftHSM 2.6: EdDSA private keys,
	// CKR_KEY_NOT_WRAPPABLE).
	Refused map[Kind]error
	// Probed lists the kinds tried, in the order tried.
	Probed []Kind
}

// Holds returns nil when the token can send and receive keys of kind k
// wrapped, else why not. A kind not tried is judged by the mechanism
// alone (the replication itself is the check for it).
func (c WrapCapability) Holds(k Kind) error {
	if !k.Wrapped() {
		return nil
	}
	if !c.Mechanism {
		return fmt.Errorf("its token does not offer %s", domainkey.MechanismName(domainkey.Mechanism))
	}
	if err, ok := c.Refused[k]; ok {
		return fmt.Errorf("its token refuses to wrap or unwrap %ss with %s: %w", k, domainkey.MechanismName(domainkey.Mechanism), err)
	}
	return nil
}

// Unholdable lists the kinds of key a token with capability c could not
// hold in a group of two or more (Holds says why): private and secret keys
// of any type when it lacks the mechanism, else the kinds it refused.
func (c WrapCapability) Unholdable() []Kind {
	if !c.Mechanism {
		return []Kind{{pkcs11.CKO_PRIVATE_KEY, KeyTypeUnknown}, {pkcs11.CKO_SECRET_KEY, KeyTypeUnknown}}
	}
	var out []Kind
	for _, k := range c.Probed {
		if c.Holds(k) != nil {
			out = append(out, k)
		}
	}
	return out
}

// wrapTrial is one kind of key tried, made by one generation mechanism
// the token lists.
type wrapTrial struct {
	kind Kind
	mech uint
	pub  []*pkcs11.Attribute // nil for a secret key
	key  []*pkcs11.Attribute // the secret key or the private half
}

// Curve parameters (DER OIDs) of the trial keys.
var (
	derP256    = []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}
	derEd25519 = []byte{0x06, 0x03, 0x2b, 0x65, 0x70}
	derX25519  = []byte{0x06, 0x03, 0x2b, 0x65, 0x6e}
)

// wrapTrials are the kinds whose trial is cheap (well under a millisecond
// each on SoftHSM). RSA, DSA and DH are not tried: a trial key costs a
// generation of tens of milliseconds (RSA) or domain parameters (DSA,
// DH), and no token we know offers CKM_AES_KEY_WRAP_PAD yet refuses them;
// should one, the replication of the first such key fails and the
// creation is undone on every member.
var wrapTrials = []wrapTrial{
	{Kind{pkcs11.CKO_SECRET_KEY, pkcs11.CKK_AES}, pkcs11.CKM_AES_KEY_GEN, nil,
		[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_VALUE_LEN, 16)}},
	{Kind{pkcs11.CKO_SECRET_KEY, pkcs11.CKK_GENERIC_SECRET}, pkcs11.CKM_GENERIC_SECRET_KEY_GEN, nil,
		[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_VALUE_LEN, 16)}},
	{Kind{pkcs11.CKO_SECRET_KEY, pkcs11.CKK_DES3}, pkcs11.CKM_DES3_KEY_GEN, nil, nil},
	{Kind{pkcs11.CKO_PRIVATE_KEY, pkcs11.CKK_EC}, pkcs11.CKM_EC_KEY_PAIR_GEN,
		[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, derP256)}, nil},
	{Kind{pkcs11.CKO_PRIVATE_KEY, slot.CKKECEdwards}, slot.CKMECEdwardsKeyPairGen,
		[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, derEd25519)}, nil},
	{Kind{pkcs11.CKO_PRIVATE_KEY, slot.CKKECMontgomery}, slot.CKMECMontgomeryKeyPairGen,
		[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, derX25519)}, nil},
}

// ProbeWrap finds out what the token of s can wrap and unwrap with
// CKM_AES_KEY_WRAP_PAD. mechs is the token's mechanism list. For every
// kind in wrapTrials whose generation mechanism the token lists, it makes
// a throwaway session key of that kind, wraps it under a throwaway
// session AES key and unwraps the blob again; a refusal of either marks
// the kind. The trial keys are public session objects in a session of its
// own, destroyed at the end and gone with the session in any case, so the
// probe needs no login and no domain key, and its answer does not change
// when the domain key is installed or replaced. A kind whose trial key
// the token will not make (a curve it lacks) is not marked, and nothing is
// tried on a token that will not make the trial wrapping key. The error is
// the member failing (a health error); the capability then holds what was
// learned before it.
func ProbeWrap(ctx context.Context, s *slot.Slot, mechs []uint) (WrapCapability, error) {
	c := WrapCapability{Mechanism: slices.Contains(mechs, domainkey.Mechanism)}
	if !c.Mechanism {
		return c, nil
	}
	ss, err := s.OpenSession(ctx)
	if err != nil {
		return c, fmt.Errorf("probe what member %s can wrap: %w", s.Name(), err)
	}
	defer ss.Close()
	kek, err := ss.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), append(trialAttrs(),
		pkcs11.NewAttribute(pkcs11.CKA_VALUE_LEN, 32), pkcs11.NewAttribute(pkcs11.CKA_WRAP, true),
		pkcs11.NewAttribute(pkcs11.CKA_UNWRAP, true), pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, false)))
	if err != nil {
		// A token that will not make the trial wrapping key is judged
		// by the mechanism alone; only its failing is an error.
		if err := healthOnly(err); err != nil {
			return c, fmt.Errorf("probe what member %s can wrap: a trial wrapping key: %w", s.Name(), err)
		}
		return c, nil
	}
	defer ss.DestroyObject(context.WithoutCancel(ctx), kek)
	for _, t := range wrapTrials {
		if !slices.Contains(mechs, t.mech) {
			continue
		}
		refusal, err := t.run(ctx, ss, kek)
		if err != nil {
			return c, fmt.Errorf("probe what member %s can wrap: %s: %w", s.Name(), t.kind, err)
		}
		c.Probed = append(c.Probed, t.kind)
		if refusal != nil {
			if c.Refused == nil {
				c.Refused = map[Kind]error{}
			}
			c.Refused[t.kind] = refusal
		}
	}
	return c, nil
}

// trialAttrs are the attributes every trial key has: a public session
// object, so that no login is needed and nothing stays on the token.
func trialAttrs() []*pkcs11.Attribute {
	return []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false), pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, false)}
}

// run tries one kind: it returns the token's refusal to wrap or unwrap
// it (nil: both worked, or the trial key could not be made), or an error
// when the member fails.
func (t wrapTrial) run(ctx context.Context, ss *slot.Session, kek pkcs11.ObjectHandle) (refusal, err error) {
	key := append(trialAttrs(), pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, true), pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true))
	key = append(key, t.key...)
	cleanup := context.WithoutCancel(ctx)
	var h pkcs11.ObjectHandle
	if t.pub == nil {
		h, err = ss.GenerateKey(ctx, pkcs11.NewMechanism(t.mech, nil), key)
	} else {
		var pub pkcs11.ObjectHandle
		pub, h, err = ss.GenerateKeyPair(ctx, pkcs11.NewMechanism(t.mech, nil), append(trialAttrs(), t.pub...), key)
		if err == nil {
			defer ss.DestroyObject(cleanup, pub)
		}
	}
	if err != nil {
		return nil, healthOnly(err)
	}
	defer ss.DestroyObject(cleanup, h)
	blob, err := ss.WrapKey(ctx, kwp, kek, h)
	if err != nil {
		return refusalOf(err)
	}
	back, err := ss.UnwrapKey(ctx, kwp, kek, blob, append(trialAttrs(),
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, t.kind.Class), pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, t.kind.KeyType),
		pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true)))
	if err != nil {
		return refusalOf(err)
	}
	ss.DestroyObject(cleanup, back)
	return nil, nil
}

// healthOnly keeps err when it says the member is unwell and drops any
// other: a trial key the token will not make says nothing about wrapping.
func healthOnly(err error) error {
	if unwell(err) {
		return err
	}
	return nil
}

// refusalOf sorts a failed wrap or unwrap: the member failing is an
// error, anything else the token's refusal of the kind.
func refusalOf(err error) (refusal, fail error) {
	if unwell(err) {
		return nil, err
	}
	return err, nil
}

// unwell reports whether err says the member is unwell rather than
// refusing a request. CKR_GENERAL_ERROR and CKR_FUNCTION_FAILED count as
// refusals: they are SoftHSM's answer to some requests it dislikes.
func unwell(err error) bool {
	return slot.ClassOf(err) == slot.ClassHealth && !slot.Ambiguous(err) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}
