package object

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math/big"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// ErrNoFingerprint is wrapped by errors saying that a member cannot tell
// what key material an object holds: a private EC/EdDSA key whose token
// hides the public point and that has no public key under the same CKA_ID
// on that member, or a secret key with neither CKA_CHECK_VALUE nor
// permission to encrypt.
var ErrNoFingerprint = errors.New("no fingerprint")

// IdentTypes are read first, for every object: the identity and storage
// flags. Every attribute a request names must exist on the object, or
// the token answers CKR_ATTRIBUTE_TYPE_INVALID for the whole call and
// pkg/slot falls back to one call per attribute (its cost:
// docs/BENCHMARKS.md, "SoftHSM costs the code is shaped by"). These exist
// on every key; certificates lack CKA_KEY_TYPE and data objects also
// CKA_ID (SoftHSM refuses CKA_ID on data objects).
var IdentTypes = []uint{
	pkcs11.CKA_CLASS, pkcs11.CKA_KEY_TYPE, pkcs11.CKA_ID, pkcs11.CKA_LABEL,
	pkcs11.CKA_TOKEN, pkcs11.CKA_PRIVATE,
}

// materialTypes are read second, chosen by class and key type: the public
// attributes a fingerprint comes from. Values that may be secret
// (CKA_VALUE of keys) are never among them.
func materialTypes(class, keyType uint) []uint {
	switch class {
	case pkcs11.CKO_PUBLIC_KEY, pkcs11.CKO_PRIVATE_KEY:
		switch keyType {
		case pkcs11.CKK_RSA:
			return []uint{pkcs11.CKA_MODULUS, pkcs11.CKA_PUBLIC_EXPONENT}
		case pkcs11.CKK_EC, slot.CKKECEdwards, slot.CKKECMontgomery:
			if class == pkcs11.CKO_PUBLIC_KEY {
				return []uint{pkcs11.CKA_EC_PARAMS, pkcs11.CKA_EC_POINT}
			}
		}
		// SoftHSM leaves it empty on EC private keys; others fill it.
		return []uint{pkcs11.CKA_PUBLIC_KEY_INFO}
	case pkcs11.CKO_SECRET_KEY:
		return []uint{pkcs11.CKA_CHECK_VALUE}
	}
	return nil // certificates, data: CKA_VALUE, read when fingerprinting
}

// MaterialTypes are the attributes of an object of identity id that its
// fingerprint is computed from (FingerprintOf), none for certificates and
// data objects, whose CKA_VALUE FingerprintOf reads itself.
func MaterialTypes(id Identity) []uint { return materialTypes(id.Class, id.KeyType) }

// Fingerprint returns the fingerprint of the object h on s:
//
//   - public keys and the private halves of key pairs: SHA-256 of the DER
//     SubjectPublicKeyInfo of the public key (the usual "pin-sha256"), built
//     from CKA_MODULUS+CKA_PUBLIC_EXPONENT (RSA; SoftHSM exposes both on
//     private keys), CKA_EC_PARAMS+CKA_EC_POINT (EC, EdDSA, Montgomery), or
//     else CKA_PUBLIC_KEY_INFO. SoftHSM 2.6.1 exposes neither CKA_EC_POINT
//     nor a filled CKA_PUBLIC_KEY_INFO on EC and EdDSA private keys, so for
//     those the public key with the same CKA_ID and key type on the same
//     token is used; without one the error wraps ErrNoFingerprint.
//   - secret keys: the 3-byte key check value, CKA_CHECK_VALUE (SoftHSM 2.6
//     has it for AES, DES and generic secret keys), else computed as the
//     first 3 bytes of the ECB encryption of a zero block when the key
//     allows CKA_ENCRYPT; a key's usage is never changed to fingerprint it.
//   - certificates and data objects: SHA-256 of CKA_VALUE.
func Fingerprint(ctx context.Context, s *slot.Slot, h pkcs11.ObjectHandle) ([]byte, error) {
	o, err := Read(ctx, s, s.Name(), h, nil)
	if err != nil {
		return nil, err
	}
	if o.FpErr != nil {
		return nil, o.FpErr
	}
	return o.Fingerprint, nil
}

// FingerprintAs is Fingerprint of h, known to be an object of identity id
// (listed or found under it in the member's epoch): the identity is not
// read again, which saves a member call on each handle checked.
func FingerprintAs(ctx context.Context, s Store, h pkcs11.ObjectHandle, id Identity) ([]byte, error) {
	a := Attrs{}
	if types := materialTypes(id.Class, id.KeyType); len(types) > 0 {
		var err error
		if a, err = ReadAttrs(ctx, s, h, types); err != nil {
			return nil, fmt.Errorf("read attributes of %s: %w", id, err)
		}
	}
	return FingerprintOf(ctx, s, h, id, a, nil)
}

// ReadObject reads the identity, fingerprint and storage flags of h on s.
// An object whose fingerprint the member cannot compute comes back with a
// nil Fingerprint and no error (see ErrNoFingerprint); use Fingerprint to
// learn why.
func ReadObject(ctx context.Context, s *slot.Slot, h pkcs11.ObjectHandle) (Object, error) {
	r, err := Read(ctx, s, s.Name(), h, nil)
	return r.Object, err
}

// Read reads h's identity and fingerprint. pubs, when non-nil,
// answers the public-counterpart question from a listing instead of a
// FindObjects. A failure to compute the fingerprint is returned in FpErr,
// not err, so that listings can carry such objects.
type Result struct {
	Object
	Attrs       Attrs
	FpErr       error
	hasIdentity bool // Identity was read
}

func Read(ctx context.Context, s Store, member string, h pkcs11.ObjectHandle, pubs PubIndex) (Result, error) {
	r, err := ReadIdent(ctx, s, member, h)
	if err != nil {
		return Result{}, err
	}
	fp, err := FingerprintOf(ctx, s, h, r.Identity, r.Attrs, pubs)
	if err != nil {
		if !errors.Is(err, ErrNoFingerprint) {
			return Result{}, fmt.Errorf("member %s: fingerprint of %s: %w", member, r.Identity, err)
		}
		r.FpErr = fmt.Errorf("member %s: fingerprint of %s: %w", member, r.Identity, err)
	}
	r.Fingerprint = fp
	return r, nil
}

// ReadIdent reads h's identity, storage flags and the attributes its
// fingerprint needs (materialTypes), in two GetAttributes calls. When the
// second call fails, the result still carries the identity (see Known).
func ReadIdent(ctx context.Context, s Store, member string, h pkcs11.ObjectHandle) (Result, error) {
	a, err := ReadAttrs(ctx, s, h, IdentTypes)
	if err != nil {
		return Result{}, fmt.Errorf("member %s: read attributes of object %d: %w", member, h, err)
	}
	r := Result{Attrs: a}
	r.Handle = h
	r.Identity, err = IdentityOf(a)
	if err != nil {
		return Result{}, fmt.Errorf("member %s: object %d: %w", member, h, err)
	}
	r.hasIdentity = true
	r.Token = a.Boolean(pkcs11.CKA_TOKEN)
	r.Private = a.Boolean(pkcs11.CKA_PRIVATE)
	if types := materialTypes(r.Class, r.KeyType); len(types) > 0 {
		m, err := ReadAttrs(ctx, s, h, types)
		if err != nil {
			return r, fmt.Errorf("member %s: read attributes of %s: %w", member, r.Identity, err)
		}
		maps.Copy(a, m)
	}
	return r, nil
}

// Known returns the identity read, nil when none was.
func (r Result) Known() *Identity {
	if !r.hasIdentity {
		return nil
	}
	id := r.Identity
	return &id
}

// ErrNoClass: the member gives no CKA_CLASS for an object.
var ErrNoClass = errors.New("no readable CKA_CLASS")

// IdentityOf is the identity that a holds.
func IdentityOf(a Attrs) (Identity, error) {
	class, ok := a.Ulong(pkcs11.CKA_CLASS)
	if !ok {
		return Identity{}, ErrNoClass
	}
	kt, ok := a.Ulong(pkcs11.CKA_KEY_TYPE)
	if !ok {
		kt = NoKeyType
	}
	return Identity{Class: class, KeyType: kt, ID: a[pkcs11.CKA_ID], Label: string(a[pkcs11.CKA_LABEL])}, nil
}

// PubIndex finds the public keys that may be the other half of a private
// key: same key type, same non-empty CKA_ID. It returns their public-key
// encodings.
type PubIndex func(ctx context.Context, keyType uint, id []byte) ([][]byte, error)

// FingerprintOf computes the fingerprint of h, of identity id, from a.
func FingerprintOf(ctx context.Context, s Store, h pkcs11.ObjectHandle, id Identity, a Attrs, pubs PubIndex) ([]byte, error) {
	switch id.Class {
	case pkcs11.CKO_PUBLIC_KEY:
		enc, err := PublicKeyEncoding(ctx, s, h, id.KeyType, a, true)
		if err != nil {
			return nil, err
		}
		return Sum(enc), nil
	case pkcs11.CKO_PRIVATE_KEY:
		enc, err := PublicKeyEncoding(ctx, s, h, id.KeyType, a, false)
		if err == nil {
			return Sum(enc), nil
		}
		if !errors.Is(err, ErrNoFingerprint) {
			return nil, err
		}
		if len(id.ID) == 0 {
			if enc, err := ownECPoint(ctx, s, h, id.KeyType, a); err == nil {
				return Sum(enc), nil
			}
			return nil, fmt.Errorf("%w: the token hides the public key of this private key and it has no CKA_ID to find its public half by", ErrNoFingerprint)
		}
		if pubs == nil {
			pubs = FindPublicHalves(s)
		}
		encs, err := pubs(ctx, id.KeyType, id.ID)
		if err != nil {
			return nil, err
		}
		encs = Distinct(encs)
		switch len(encs) {
		case 0:
			if enc, err := ownECPoint(ctx, s, h, id.KeyType, a); err == nil {
				return Sum(enc), nil
			}
			return nil, fmt.Errorf("%w: the token hides the public key of this private key and there is no public key with CKA_ID %x", ErrNoFingerprint, id.ID)
		case 1:
			return Sum(encs[0]), nil
		}
		return nil, fmt.Errorf("%w: %d different public keys carry CKA_ID %x", ErrNoFingerprint, len(encs), id.ID)
	case pkcs11.CKO_SECRET_KEY:
		if a.NonEmpty(pkcs11.CKA_CHECK_VALUE) {
			return a[pkcs11.CKA_CHECK_VALUE], nil
		}
		return ComputeKCV(ctx, s, h, id.KeyType)
	default:
		v, err := ReadAttrs(ctx, s, h, []uint{pkcs11.CKA_VALUE})
		if err != nil {
			return nil, fmt.Errorf("read CKA_VALUE: %w", err)
		}
		if !v.Has(pkcs11.CKA_VALUE) {
			return nil, fmt.Errorf("%w: CKA_VALUE is not readable", ErrNoFingerprint)
		}
		return Sum(v[pkcs11.CKA_VALUE]), nil
	}
}

// Sum is the SHA-256 of b.
func Sum(b []byte) []byte { s := sha256.Sum256(b); return s[:] }

// Distinct drops repeated encodings.
func Distinct(encs [][]byte) [][]byte {
	var out [][]byte
next:
	for _, e := range encs {
		for _, o := range out {
			if bytes.Equal(e, o) {
				continue next
			}
		}
		out = append(out, e)
	}
	return out
}

// ownECPoint tries CKA_EC_POINT on an EC-type private key, which some
// tokens show (SoftHSM does not), as a last resort: asking costs a failed
// call where the attribute does not exist.
func ownECPoint(ctx context.Context, s Store, h pkcs11.ObjectHandle, keyType uint, a Attrs) ([]byte, error) {
	switch keyType {
	case pkcs11.CKK_EC, slot.CKKECEdwards, slot.CKKECMontgomery:
	default:
		return nil, ErrNoFingerprint
	}
	m, err := ReadAttrs(ctx, s, h, []uint{pkcs11.CKA_EC_PARAMS, pkcs11.CKA_EC_POINT})
	if err != nil {
		return nil, err
	}
	maps.Copy(a, m)
	return PublicKeyEncoding(ctx, s, h, keyType, a, false)
}

// FindPublicHalves looks the public halves up on the token.
func FindPublicHalves(s Store) PubIndex {
	return func(ctx context.Context, keyType uint, id []byte) ([][]byte, error) {
		hs, err := s.FindObjects(ctx, []*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_PUBLIC_KEY),
			pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, keyType),
			pkcs11.NewAttribute(pkcs11.CKA_ID, id),
		})
		if err != nil {
			return nil, fmt.Errorf("find public half: %w", err)
		}
		var encs [][]byte
		for _, h := range hs {
			a, err := ReadAttrs(ctx, s, h, materialTypes(pkcs11.CKO_PUBLIC_KEY, keyType))
			if err != nil {
				return nil, fmt.Errorf("read public half %d: %w", h, err)
			}
			enc, err := PublicKeyEncoding(ctx, s, h, keyType, a, true)
			if errors.Is(err, ErrNoFingerprint) {
				continue
			}
			if err != nil {
				return nil, err
			}
			encs = append(encs, enc)
		}
		return encs, nil
	}
}

var (
	oidRSA        = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 1, 1}
	oidECPublic   = asn1.ObjectIdentifier{1, 2, 840, 10045, 2, 1}
	oidX25519     = asn1.ObjectIdentifier{1, 3, 101, 110}
	oidX448       = asn1.ObjectIdentifier{1, 3, 101, 111}
	oidEd25519    = asn1.ObjectIdentifier{1, 3, 101, 112}
	oidEd448      = asn1.ObjectIdentifier{1, 3, 101, 113}
	curveByName   = map[string]asn1.ObjectIdentifier{"edwards25519": oidEd25519, "edwards448": oidEd448, "curve25519": oidX25519, "curve448": oidX448}
	fallbackLabel = []byte("hagroup public key v1")
)

type spki struct {
	Algorithm pkix.AlgorithmIdentifier
	PublicKey asn1.BitString
}

// PublicKeyEncoding returns the canonical encoding of the public key the
// attributes describe: a DER SubjectPublicKeyInfo where the key type is
// known, so that the fingerprint is the one openssl and others compute.
// isPublic says the object is a public key, whose CKA_VALUE (DSA, DH) may
// be read; a private key's never is.
func PublicKeyEncoding(ctx context.Context, s Store, h pkcs11.ObjectHandle, keyType uint, a Attrs, isPublic bool) ([]byte, error) {
	switch keyType {
	case pkcs11.CKK_RSA:
		if a.NonEmpty(pkcs11.CKA_MODULUS) && a.NonEmpty(pkcs11.CKA_PUBLIC_EXPONENT) {
			return rsaSPKI(a[pkcs11.CKA_MODULUS], a[pkcs11.CKA_PUBLIC_EXPONENT])
		}
	case pkcs11.CKK_EC, slot.CKKECEdwards, slot.CKKECMontgomery:
		if a.NonEmpty(pkcs11.CKA_EC_PARAMS) && a.NonEmpty(pkcs11.CKA_EC_POINT) {
			return ecSPKI(keyType, a[pkcs11.CKA_EC_PARAMS], a[pkcs11.CKA_EC_POINT])
		}
	}
	if a.NonEmpty(pkcs11.CKA_PUBLIC_KEY_INFO) {
		var k spki
		rest, err := asn1.Unmarshal(a[pkcs11.CKA_PUBLIC_KEY_INFO], &k)
		if err != nil || len(rest) != 0 {
			return nil, fmt.Errorf("CKA_PUBLIC_KEY_INFO is not a DER SubjectPublicKeyInfo")
		}
		return asn1.Marshal(k)
	}
	if isPublic && keyType != pkcs11.CKK_RSA && keyType != pkcs11.CKK_EC && keyType != slot.CKKECEdwards && keyType != slot.CKKECMontgomery {
		// DSA, DH and others: the public value and domain parameters,
		// length-prefixed under a fixed label.
		v, err := ReadAttrs(ctx, s, h, []uint{pkcs11.CKA_PRIME, pkcs11.CKA_SUBPRIME, pkcs11.CKA_BASE, pkcs11.CKA_VALUE})
		if err != nil {
			return nil, fmt.Errorf("read public value: %w", err)
		}
		if v.NonEmpty(pkcs11.CKA_VALUE) {
			var b bytes.Buffer
			b.Write(fallbackLabel)
			binary.Write(&b, binary.BigEndian, uint64(keyType))
			for _, t := range []uint{pkcs11.CKA_PRIME, pkcs11.CKA_SUBPRIME, pkcs11.CKA_BASE, pkcs11.CKA_VALUE} {
				binary.Write(&b, binary.BigEndian, uint32(len(v[t])))
				b.Write(v[t])
			}
			return b.Bytes(), nil
		}
	}
	return nil, fmt.Errorf("%w: the token exposes no public key material on this object", ErrNoFingerprint)
}

func rsaSPKI(modulus, exponent []byte) ([]byte, error) {
	pub, err := asn1.Marshal(struct{ N, E *big.Int }{new(big.Int).SetBytes(modulus), new(big.Int).SetBytes(exponent)})
	if err != nil {
		return nil, err
	}
	return asn1.Marshal(spki{
		Algorithm: pkix.AlgorithmIdentifier{Algorithm: oidRSA, Parameters: asn1.NullRawValue},
		PublicKey: asn1.BitString{Bytes: pub, BitLength: 8 * len(pub)},
	})
}

// ECPoint returns the raw point of CKA_EC_POINT, which PKCS#11 says is a
// DER OCTET STRING (SoftHSM does so); some tokens return the raw point.
func ECPoint(v []byte) []byte {
	var raw []byte
	if rest, err := asn1.Unmarshal(v, &raw); err == nil && len(rest) == 0 {
		return raw
	}
	return v
}

func ecSPKI(keyType uint, params, point []byte) ([]byte, error) {
	raw := ECPoint(point)
	alg := pkix.AlgorithmIdentifier{}
	if keyType == pkcs11.CKK_EC {
		alg.Algorithm = oidECPublic
		alg.Parameters = asn1.RawValue{FullBytes: params}
	} else {
		oid, err := edCurve(params)
		if err != nil {
			return nil, err
		}
		alg.Algorithm = oid
	}
	return asn1.Marshal(spki{Algorithm: alg, PublicKey: asn1.BitString{Bytes: raw, BitLength: 8 * len(raw)}})
}

// edCurve names the curve of CKA_EC_PARAMS for EdDSA and Montgomery keys:
// an OID or a PrintableString curve name (SoftHSM stores the OID on the
// public half and "edwards25519" on the private half of one key pair).
func edCurve(params []byte) (asn1.ObjectIdentifier, error) {
	var oid asn1.ObjectIdentifier
	if rest, err := asn1.Unmarshal(params, &oid); err == nil && len(rest) == 0 {
		return oid, nil
	}
	var name string
	if rest, err := asn1.UnmarshalWithParams(params, &name, "printable"); err == nil && len(rest) == 0 {
		if oid, ok := curveByName[name]; ok {
			return oid, nil
		}
		return nil, fmt.Errorf("%w: unknown curve %q", ErrNoFingerprint, name)
	}
	return nil, fmt.Errorf("%w: CKA_EC_PARAMS %x names no known curve", ErrNoFingerprint, params)
}

// ComputeKCV computes a key check value where CKA_CHECK_VALUE is missing:
// the first 3 bytes of the ECB encryption of a zero block, when the key
// may encrypt.
func ComputeKCV(ctx context.Context, s Store, h pkcs11.ObjectHandle, keyType uint) ([]byte, error) {
	var mech uint
	var block int
	switch keyType {
	case pkcs11.CKK_AES:
		mech, block = pkcs11.CKM_AES_ECB, 16
	case pkcs11.CKK_DES3, pkcs11.CKK_DES2:
		mech, block = pkcs11.CKM_DES3_ECB, 8
	default:
		return nil, fmt.Errorf("%w: no CKA_CHECK_VALUE and no way to compute one for this key type", ErrNoFingerprint)
	}
	a, err := ReadAttrs(ctx, s, h, []uint{pkcs11.CKA_ENCRYPT, pkcs11.CKA_ALLOWED_MECHANISMS})
	if err != nil {
		return nil, fmt.Errorf("read CKA_ENCRYPT: %w", err)
	}
	if !a.Boolean(pkcs11.CKA_ENCRYPT) || !MechanismAllowed(a, mech) {
		return nil, fmt.Errorf("%w: no CKA_CHECK_VALUE and the key may not encrypt in ECB mode", ErrNoFingerprint)
	}
	kcv, err := kcvByEncrypt(ctx, s, h, mech, block)
	if err != nil && slot.ClassOf(err) == slot.ClassRequest {
		return nil, fmt.Errorf("%w: no CKA_CHECK_VALUE and %w", ErrNoFingerprint, err)
	}
	return kcv, err
}

func kcvByEncrypt(ctx context.Context, s Store, h pkcs11.ObjectHandle, mech uint, block int) ([]byte, error) {
	ct, err := s.Encrypt(ctx, pkcs11.NewMechanism(mech, nil), h, make([]byte, block))
	if err != nil {
		return nil, fmt.Errorf("compute key check value: %w", err)
	}
	if len(ct) < 3 {
		return nil, fmt.Errorf("compute key check value: %d-byte cipher text", len(ct))
	}
	return ct[:3], nil
}
