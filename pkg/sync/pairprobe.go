package sync

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// How a key travels between two members is decided by trying, never by a
// mechanism's name: SoftHSM 2.6's CKM_AES_KEY_WRAP_PAD is RFC 5649, NSS
// 3.87's is PKCS#7 padding then RFC 3394, and NSS's CKM_AES_KEY_WRAP_KWP is
// what SoftHSM calls _PAD. A blob one member wraps under a name the other
// reads differently unwraps as garbage, or not at all. So for each ordered
// pair of members (source, target) ProvePair makes a throwaway key of each
// class on the source, wraps it under a throwaway key-encryption key both
// hold, unwraps the blob on the target, and checks that the target's copy
// is the source's key: the same value for a secret key, a signature the
// source's public key verifies for a private key. A way is a pair of
// mechanisms (the source's wrap, the target's unwrap), which need not have
// one name.

// CKMAESKeyWrapKWP is CKM_AES_KEY_WRAP_KWP (PKCS#11 3.0, RFC 5649), which
// miekg/pkcs11 v1.1.2 does not name.
const CKMAESKeyWrapKWP = 0x210B

// Way is one way a key travels from a source member to a target: wrapped
// with Wrap on the source, unwrapped with Unwrap on the target. IV, for a
// mechanism that takes one (CKM_AES_CBC_PAD), is carried with the blob.
type Way struct {
	Wrap   uint `json:"wrap"`
	Unwrap uint `json:"unwrap"`
}

func (w Way) String() string {
	if w.Wrap == w.Unwrap {
		return transitMechName(w.Wrap)
	}
	return transitMechName(w.Wrap) + " on the source, " + transitMechName(w.Unwrap) + " on the target"
}

// transitCandidates are the wrapping mechanisms a pair is tried with, in
// order of preference: the padded RFC 5649 wraps (any key length, an
// integrity check), RFC 3394 (key lengths a multiple of 8), then CBC with
// PKCS#7 padding (no integrity check: the last resort).
var transitCandidates = []uint{CKMAESKeyWrapKWP, pkcs11.CKM_AES_KEY_WRAP_PAD, pkcs11.CKM_AES_KEY_WRAP, pkcs11.CKM_AES_CBC_PAD}

func transitMechName(m uint) string {
	switch m {
	case CKMAESKeyWrapKWP:
		return "CKM_AES_KEY_WRAP_KWP"
	case pkcs11.CKM_AES_CBC_PAD:
		return "CKM_AES_CBC_PAD"
	case pkcs11.CKM_RSA_PKCS_OAEP:
		return "CKM_RSA_PKCS_OAEP under the target's throwaway RSA key"
	}
	return domainkey.MechanismName(m)
}

// transitIV is the IV of a CBC trial: any fixed value does for a
// throwaway key under a throwaway key-encryption key.
var transitIV = bytes.Repeat([]byte{0x5a}, 16)

func transitMech(m uint) *pkcs11.Mechanism {
	switch m {
	case pkcs11.CKM_AES_CBC_PAD:
		return pkcs11.NewMechanism(m, transitIV)
	case pkcs11.CKM_RSA_PKCS_OAEP:
		return pkcs11.NewMechanism(m, pkcs11.NewOAEPParams(pkcs11.CKM_SHA_1, pkcs11.CKG_MGF1_SHA1, pkcs11.CKZ_DATA_SPECIFIED, nil))
	}
	return pkcs11.NewMechanism(m, nil)
}

// rsaTransport is the way of last resort, tried for a kind of key no AES
// way carried: the key itself wrapped with RSA-OAEP under a throwaway RSA
// pair of the target's (transportKeys), for a pair with no AES wrap in
// common: SoftHSM 2.6.1 unwraps with AES key wrap or RSA only, and the
// opencryptoki 3.8 soft token wraps with AES ECB/CBC/CBC-PAD or RSA only.
// Only a secret key is short enough, and SoftHSM wraps no private key so.
var rsaTransport = Way{pkcs11.CKM_RSA_PKCS_OAEP, pkcs11.CKM_RSA_PKCS_OAEP}

// PairWays is what a pair of members proved: for each class of key
// (secret, private), the ways that carried a throwaway key of that class
// from the source to the target intact, best first; and for each way tried
// and failed, what went wrong.
type PairWays struct {
	Source string            `json:"source"`
	Target string            `json:"target"`
	Ways   map[string][]Way  `json:"ways"` // by trial: "secret key", "private key" (EC), "RSA private key"
	Failed map[string]string `json:"failed,omitempty"`
	// Untried names the classes nothing was tried for: no candidate way
	// both offer, or the source would not make the trial key (a curve it
	// lacks). They are judged by each member's own capability.
	Untried []string `json:"untried,omitempty"`
}

// Tried reports whether a way was tried for class.
func (p PairWays) Tried(class uint) bool {
	return !slices.Contains(p.Untried, object.ClassName(class))
}

// Proven reports whether way carried keys of class (CKO_SECRET_KEY or
// CKO_PRIVATE_KEY) from the source to the target.
func (p PairWays) Proven(class uint, way Way) bool {
	return slices.Contains(p.Ways[object.ClassName(class)], way)
}

// Best returns the preferred way proven for class, and whether there is one.
func (p PairWays) Best(class uint) (Way, bool) {
	ws := p.Ways[object.ClassName(class)]
	if len(ws) == 0 {
		return Way{}, false
	}
	return ws[0], true
}

// pairTrial is one class of key tried between a pair.
type pairTrial struct {
	class uint
	name  string // its entry in PairWays.Ways
	make  func(ctx context.Context, ss *slot.Session) (key, pub pkcs11.ObjectHandle, err error)
	tmpl  []*pkcs11.Attribute // the unwrap template on the target
	same  func(ctx context.Context, src, dst *slot.Session, key, pub, copy pkcs11.ObjectHandle) (bool, error)
}

var pairTrials = []pairTrial{
	{
		class: pkcs11.CKO_SECRET_KEY,
		name:  "secret key",
		make: func(ctx context.Context, ss *slot.Session) (pkcs11.ObjectHandle, pkcs11.ObjectHandle, error) {
			h, err := ss.GenerateKey(ctx, aesKeyGen, append(trialAttrs(), pkcs11.NewAttribute(pkcs11.CKA_VALUE_LEN, 16),
				object.BoolAttr(pkcs11.CKA_EXTRACTABLE, true), object.BoolAttr(pkcs11.CKA_SENSITIVE, false)))
			return h, 0, err
		},
		tmpl: []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY),
			pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES), object.BoolAttr(pkcs11.CKA_SENSITIVE, false),
			object.BoolAttr(pkcs11.CKA_EXTRACTABLE, true)},
		same: func(ctx context.Context, src, dst *slot.Session, key, _, cp pkcs11.ObjectHandle) (bool, error) {
			a, err := readValue(ctx, src, key)
			if err != nil {
				return false, err
			}
			b, err := readValue(ctx, dst, cp)
			if err != nil {
				return false, err
			}
			return bytes.Equal(a, b), nil
		},
	},
	{
		class: pkcs11.CKO_PRIVATE_KEY,
		name:  "private key",
		make: func(ctx context.Context, ss *slot.Session) (pkcs11.ObjectHandle, pkcs11.ObjectHandle, error) {
			pub, priv, err := ss.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
				append(trialAttrs(), pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, derP256), object.BoolAttr(pkcs11.CKA_VERIFY, true)),
				append(trialAttrs(), object.BoolAttr(pkcs11.CKA_SIGN, true), object.BoolAttr(pkcs11.CKA_EXTRACTABLE, true), object.BoolAttr(pkcs11.CKA_SENSITIVE, true)))
			return priv, pub, err
		},
		tmpl: []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY),
			pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_EC), object.BoolAttr(pkcs11.CKA_SIGN, true), object.BoolAttr(pkcs11.CKA_SENSITIVE, true)},
		same: signsAlike(pkcs11.CKM_ECDSA, trialDigest[:]),
	},
	{
		// RSA's PKCS#8 is another encoding, and a make may take one and
		// not the other (NSS 3.87 unwraps RSA private keys, no EC one).
		// The key is small: the trial proves the encoding, not the size.
		class: pkcs11.CKO_PRIVATE_KEY,
		name:  rsaTrialName,
		make: func(ctx context.Context, ss *slot.Session) (pkcs11.ObjectHandle, pkcs11.ObjectHandle, error) {
			pub, priv, err := ss.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS_KEY_PAIR_GEN, nil),
				append(trialAttrs(), pkcs11.NewAttribute(pkcs11.CKA_MODULUS_BITS, 1024),
					pkcs11.NewAttribute(pkcs11.CKA_PUBLIC_EXPONENT, []byte{1, 0, 1}), object.BoolAttr(pkcs11.CKA_VERIFY, true)),
				append(trialAttrs(), object.BoolAttr(pkcs11.CKA_SIGN, true), object.BoolAttr(pkcs11.CKA_EXTRACTABLE, true), object.BoolAttr(pkcs11.CKA_SENSITIVE, true)))
			return priv, pub, err
		},
		tmpl: []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY),
			pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_RSA), object.BoolAttr(pkcs11.CKA_SIGN, true), object.BoolAttr(pkcs11.CKA_SENSITIVE, true)},
		// CKM_RSA_PKCS, which every RSA make signs with (opencryptoki
		// 3.8's soft token has no CKM_SHA256_RSA_PKCS).
		same: signsAlike(pkcs11.CKM_RSA_PKCS, []byte("hagroup pair trial")),
	},
}

// trialDigest is what the EC trial signs (ECDSA signs a digest).
var trialDigest = sha256.Sum256([]byte("hagroup pair trial"))

// signsAlike is a private key trial's same: the copy signs msg with mech,
// and the source's public key verifies the signature.
func signsAlike(mech uint, msg []byte) func(ctx context.Context, src, dst *slot.Session, _, pub, cp pkcs11.ObjectHandle) (bool, error) {
	return func(ctx context.Context, src, dst *slot.Session, _, pub, cp pkcs11.ObjectHandle) (bool, error) {
		m := pkcs11.NewMechanism(mech, nil)
		sig, err := dst.Sign(ctx, m, cp, msg)
		if err != nil {
			return false, err
		}
		err = src.Verify(ctx, m, pub, msg, sig)
		if errors.Is(err, pkcs11.Error(pkcs11.CKR_SIGNATURE_INVALID)) {
			return false, nil
		}
		return err == nil, err
	}
}

// PairTrials names the trials of a pair proof, the keys of
// PairWays.Ways: "secret key", "private key" (EC, and every private key
// but RSA), "RSA private key".
func PairTrials() []string {
	out := make([]string, len(pairTrials))
	for i, t := range pairTrials {
		out[i] = t.name
	}
	return out
}

// PairFailures says why each way tried for trial failed, in one line.
func PairFailures(p PairWays, trial string) string {
	var whys []string
	for way, why := range p.Failed {
		if way == trial || strings.HasPrefix(way, trial+" by ") {
			whys = append(whys, strings.TrimPrefix(way, trial+" ")+": "+why)
		}
	}
	if len(whys) == 0 {
		return "no candidate way is offered by both"
	}
	slices.Sort(whys)
	return strings.Join(whys, "; ")
}

// rsaTrialName is the entry of PairWays.Ways for RSA private keys; every
// other private key is judged by the EC trial ("private key").
const rsaTrialName = "RSA private key"

// trialName is the entry of PairWays.Ways that speaks for keys of kind k.
func trialName(k Kind) string {
	if k.Class == pkcs11.CKO_PRIVATE_KEY && k.KeyType == pkcs11.CKK_RSA {
		return rsaTrialName
	}
	return object.ClassName(k.Class)
}

// TriedFor reports whether a way was tried for keys of kind k.
func (p PairWays) TriedFor(k Kind) bool {
	return !slices.Contains(p.Untried, trialName(k))
}

// WayFor returns the preferred way proven for keys of kind k, and
// whether there is one.
func (p PairWays) WayFor(k Kind) (Way, bool) {
	ws := p.Ways[trialName(k)]
	if len(ws) == 0 {
		return Way{}, false
	}
	return ws[0], true
}

func readValue(ctx context.Context, ss *slot.Session, h pkcs11.ObjectHandle) ([]byte, error) {
	a, err := ss.GetAttributes(ctx, h, []uint{pkcs11.CKA_VALUE})
	if err != nil {
		return nil, err
	}
	if len(a) != 1 || a[0].Status != pkcs11.CKR_OK {
		return nil, fmt.Errorf("the trial key's value cannot be read")
	}
	return a[0].Value, nil
}

// ProvePair tries every way a key of each class could travel from src to
// dst (transitCandidates the source offers for wrapping and the target
// for unwrapping; only those in only when it is not empty), under a throwaway session key-encryption key made on
// both from one random value), and returns the ways that carried the
// trial key intact. Every trial object is a public session object in a
// session of the probe's own: nothing stays on either token, and no login
// is needed. The error is a member failing (a health error); the result
// then holds what was proven before it.
func ProvePair(ctx context.Context, src, dst *slot.Slot, srcMechs, dstMechs []uint, only ...Way) (PairWays, error) {
	p := PairWays{Source: src.Name(), Target: dst.Name(), Ways: map[string][]Way{}, Failed: map[string]string{}}
	var ways []Way
	for _, w := range transitCandidates {
		for _, u := range transitCandidates {
			if slices.Contains(srcMechs, w) && slices.Contains(dstMechs, u) && sameFamily(w, u) &&
				(len(only) == 0 || slices.Contains(only, Way{w, u})) {
				ways = append(ways, Way{w, u})
			}
		}
	}
	// By the wrap's preference (the padded RFC 5649 wraps first: a
	// private key's PKCS#8 need not be a multiple of 8 bytes), and for
	// one wrap the same name before a crossing.
	rank := func(w Way) int {
		r := 2 * slices.Index(transitCandidates, w.Wrap)
		if w.Wrap != w.Unwrap {
			r++
		}
		return r
	}
	slices.SortStableFunc(ways, func(a, b Way) int { return rank(a) - rank(b) })
	rsa := slices.Contains(srcMechs, rsaTransport.Wrap) && slices.Contains(dstMechs, rsaTransport.Unwrap) &&
		(len(only) == 0 || slices.Contains(only, rsaTransport))
	if len(ways) == 0 && !rsa {
		for _, t := range pairTrials {
			p.Untried = append(p.Untried, t.name)
		}
		return p, nil
	}
	ss, err := src.OpenSession(ctx)
	if err != nil {
		return p, fmt.Errorf("prove how keys travel from %s to %s: %w", src.Name(), dst.Name(), err)
	}
	defer ss.Close()
	ds, err := dst.OpenSession(ctx)
	if err != nil {
		return p, fmt.Errorf("prove how keys travel from %s to %s: %w", src.Name(), dst.Name(), err)
	}
	defer ds.Close()
	kekValue := make([]byte, 32)
	if _, err := rand.Read(kekValue); err != nil {
		return p, err
	}
	defer clear(kekValue)
	skek, err := trialKEK(ctx, ss, kekValue)
	if err != nil {
		return p, fmt.Errorf("prove how keys travel from %s to %s: a trial key-encryption key on %s: %w", src.Name(), dst.Name(), src.Name(), err)
	}
	dkek, err := trialKEK(ctx, ds, kekValue)
	if err != nil {
		return p, fmt.Errorf("prove how keys travel from %s to %s: a trial key-encryption key on %s: %w", src.Name(), dst.Name(), dst.Name(), err)
	}
	for _, t := range pairTrials {
		if err := t.prove(ctx, &p, ss, ds, skek, dkek, ways); err != nil {
			return p, fmt.Errorf("prove how %ss travel from %s to %s: %w", t.name, src.Name(), dst.Name(), err)
		}
		if !rsa || t.class != pkcs11.CKO_SECRET_KEY || len(p.Ways[t.name]) > 0 || slices.Contains(p.Untried, t.name) {
			continue
		}
		wrapper, unwrapper, drop, err := transportKeys(ctx, ss, src.Name(), ds, false)
		if err == nil {
			err = t.prove(ctx, &p, ss, ds, wrapper, unwrapper, []Way{rsaTransport})
			drop()
		} else if !unwell(err) {
			p.Failed[t.name+" by "+rsaTransport.String()] = "no transport key pair: " + err.Error()
			err = nil
		}
		if err != nil {
			return p, fmt.Errorf("prove how %ss travel from %s to %s: %w", t.name, src.Name(), dst.Name(), err)
		}
	}
	return p, nil
}

// sameFamily reports whether a blob wrapped with w could be unwrapped with
// u at all: the AES key wraps among themselves (their names are what is
// in doubt), CBC with itself.
func sameFamily(w, u uint) bool {
	cbc := func(m uint) bool { return m == pkcs11.CKM_AES_CBC_PAD }
	return cbc(w) == cbc(u)
}

// trialKEK makes the throwaway key-encryption key of value v in ss.
func trialKEK(ctx context.Context, ss *slot.Session, v []byte) (pkcs11.ObjectHandle, error) {
	return ss.CreateObject(ctx, append(trialAttrs(),
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
		pkcs11.NewAttribute(pkcs11.CKA_VALUE, v), object.BoolAttr(pkcs11.CKA_WRAP, true), object.BoolAttr(pkcs11.CKA_UNWRAP, true),
		object.BoolAttr(pkcs11.CKA_ENCRYPT, true), object.BoolAttr(pkcs11.CKA_DECRYPT, true), object.BoolAttr(pkcs11.CKA_EXTRACTABLE, false)))
}

// prove tries each way for one class and records the ones that carried
// the trial key intact. A key the source will not make proves nothing.
func (t pairTrial) prove(ctx context.Context, p *PairWays, ss, ds *slot.Session, skek, dkek pkcs11.ObjectHandle, ways []Way) error {
	cleanup := context.WithoutCancel(ctx)
	key, pub, err := t.make(ctx, ss)
	if err != nil {
		p.Untried = append(p.Untried, t.name)
		p.Failed[t.name] = fmt.Sprintf("the source made no trial key: %v", err)
		return healthOnly(err)
	}
	defer ss.DestroyObject(cleanup, key)
	if pub != 0 {
		defer ss.DestroyObject(cleanup, pub)
	}
	name := t.name
	for _, w := range ways {
		ok, why, err := t.try(ctx, ss, ds, skek, dkek, key, pub, w)
		if err != nil {
			return err
		}
		if ok {
			p.Ways[name] = append(p.Ways[name], w)
		} else {
			p.Failed[name+" by "+w.String()] = why
		}
	}
	return nil
}

// try carries the trial key one way: ok when the target's copy is the
// source's key; why says what went wrong otherwise; err is a member
// failing.
func (t pairTrial) try(ctx context.Context, ss, ds *slot.Session, skek, dkek, key, pub pkcs11.ObjectHandle, w Way) (ok bool, why string, err error) {
	blob, err := ss.WrapKey(ctx, transitMech(w.Wrap), skek, key)
	if err != nil {
		refusal, fail := refusalOf(err)
		if fail != nil {
			return false, "", fail
		}
		return false, "the source refuses to wrap: " + refusal.Error(), nil
	}
	defer clear(blob)
	cp, err := ds.UnwrapKey(ctx, transitMech(w.Unwrap), dkek, blob, object.Override(trialAttrs(), t.tmpl))
	if c := slot.CodeOf(err); c == pkcs11.CKR_ATTRIBUTE_READ_ONLY || c == pkcs11.CKR_TEMPLATE_INCONSISTENT {
		// A make that sets some of these itself (opencryptoki's soft
		// token: CKR_ATTRIBUTE_READ_ONLY) gets the class and type alone.
		cp, err = ds.UnwrapKey(ctx, transitMech(w.Unwrap), dkek, blob, object.Override(trialAttrs(), t.tmpl[:2]))
	}
	if err != nil {
		refusal, fail := refusalOf(err)
		if fail != nil {
			return false, "", fail
		}
		return false, "the target refuses to unwrap: " + refusal.Error(), nil
	}
	defer ds.DestroyObject(context.WithoutCancel(ctx), cp)
	same, err := t.same(ctx, ss, ds, key, pub, cp)
	switch {
	case err != nil && unwell(err):
		return false, "", err
	case err != nil:
		return false, "the target's copy does not work: " + err.Error(), nil
	case !same:
		return false, "the target's copy is another key (the two read the mechanism differently)", nil
	}
	return true, "", nil
}

// ProvePairKnown is ProvePair, answered from facts when a process proved
// the same pair of tokens (tokenKey) offering the same mechanisms, for the
// same ways, before; a proof made is kept there. facts may be nil.
func ProvePairKnown(ctx context.Context, src, dst *slot.Slot, srcMechs, dstMechs []uint, facts Facts, only ...Way) (PairWays, error) {
	key := ""
	if sk, dk := tokenKey(src), tokenKey(dst); sk != "" && dk != "" && facts != nil {
		key = fmt.Sprintf("pair3\x00%s\x00%x\x00%s\x00%x\x00%v", sk, sortedMechs(srcMechs), dk, sortedMechs(dstMechs), only)
		if b, ok := facts.Load(key); ok {
			var p PairWays
			if json.Unmarshal(b, &p) == nil && p.Source == src.Name() && p.Target == dst.Name() && p.Ways != nil {
				return p, nil
			}
		}
	}
	p, err := ProvePair(ctx, src, dst, srcMechs, dstMechs, only...)
	if err == nil && key != "" {
		if b, err := json.Marshal(p); err == nil {
			_ = facts.Store(key, b)
		}
	}
	return p, err
}

func sortedMechs(ms []uint) []uint {
	s := slices.Clone(ms)
	slices.Sort(s)
	return s
}
