// Package signer is a crypto.Signer (and, for RSA keys, a
// crypto.Decrypter) on a key of an HA group, built on pkg/group's public
// API: each call is one single-part operation the group schedules on a
// healthy member, with its failover.
package signer

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/asn1"
	"errors"
	"fmt"
	"io"
	"math/big"

	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// KeySelector names a private key for New: by CKA_ID, by CKA_LABEL, or
// both. The public half is found by the private key's CKA_ID (or by the
// label when the key has no ID).
type KeySelector struct {
	ID    []byte
	Label string
}

// Signer is a crypto.Signer (and, for RSA keys, a crypto.Decrypter) on a
// group key. Every call is a single-part operation scheduled on a healthy
// member with transparent failover, so a long-lived Signer keeps working
// while members fail and return. It needs the group to be logged in.
// Safe for concurrent use.
type Signer struct {
	g    *group.Group
	priv group.ObjectHandle
	pub  crypto.PublicKey
}

// New returns a Signer on g for the private key sel names. The key must
// be unique: two matches are an error (CKR_KEY_HANDLE_INVALID, as none).
func New(ctx context.Context, g *group.Group, sel KeySelector) (*Signer, error) {
	if len(sel.ID) == 0 && sel.Label == "" {
		return nil, errors.New("signer: empty key selector")
	}
	tmpl := []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY)}
	if len(sel.ID) > 0 {
		tmpl = append(tmpl, pkcs11.NewAttribute(pkcs11.CKA_ID, sel.ID))
	}
	if sel.Label != "" {
		tmpl = append(tmpl, pkcs11.NewAttribute(pkcs11.CKA_LABEL, sel.Label))
	}
	hs, err := g.Find(ctx, tmpl)
	if err != nil {
		return nil, fmt.Errorf("group %s: Signer: find private key: %w", g.Label(), err)
	}
	if len(hs) != 1 {
		return nil, &group.Error{Code: pkcs11.CKR_KEY_HANDLE_INVALID, Op: "Signer", Err: fmt.Errorf(
			"%w: %d private keys with id %x label %q, want 1", group.ErrKeyHandle, len(hs), sel.ID, sel.Label)}
	}
	id, err := g.Identity(hs[0])
	if err != nil {
		return nil, err
	}
	s := &Signer{g: g, priv: hs[0]}
	pubT := []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_PUBLIC_KEY),
		pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, id.KeyType),
	}
	if len(id.ID) > 0 {
		pubT = append(pubT, pkcs11.NewAttribute(pkcs11.CKA_ID, id.ID))
	} else {
		pubT = append(pubT, pkcs11.NewAttribute(pkcs11.CKA_LABEL, id.Label))
	}
	pubs, err := g.Find(ctx, pubT)
	if err == nil && len(pubs) == 0 && len(id.ID) > 0 && id.Label != "" {
		// Halves paired by label only.
		pubs, err = g.Find(ctx, []*pkcs11.Attribute{pubT[0], pubT[1], pkcs11.NewAttribute(pkcs11.CKA_LABEL, id.Label)})
	}
	if err != nil {
		return nil, fmt.Errorf("group %s: Signer: find public key: %w", g.Label(), err)
	}
	var src group.ObjectHandle
	switch {
	case len(pubs) == 1:
		src = pubs[0]
	case id.KeyType == pkcs11.CKK_RSA:
		src = hs[0] // an RSA private key carries its modulus and exponent
	default:
		return nil, fmt.Errorf("group %s: Signer: %d public keys for %v, want 1", g.Label(), len(pubs), id)
	}
	if s.pub, err = publicKey(ctx, g, src, id.KeyType); err != nil {
		return nil, fmt.Errorf("group %s: Signer: %v: %w", g.Label(), id, err)
	}
	return s, nil
}

func publicKey(ctx context.Context, g *group.Group, h group.ObjectHandle, keyType uint) (crypto.PublicKey, error) {
	switch keyType {
	case pkcs11.CKK_RSA:
		a, err := attrMap(ctx, g, h, pkcs11.CKA_MODULUS, pkcs11.CKA_PUBLIC_EXPONENT)
		if err != nil {
			return nil, err
		}
		e := new(big.Int).SetBytes(a[pkcs11.CKA_PUBLIC_EXPONENT])
		if !e.IsInt64() || e.Int64() > 1<<31-1 {
			return nil, errors.New("RSA public exponent too large")
		}
		return &rsa.PublicKey{N: new(big.Int).SetBytes(a[pkcs11.CKA_MODULUS]), E: int(e.Int64())}, nil
	case pkcs11.CKK_EC:
		a, err := attrMap(ctx, g, h, pkcs11.CKA_EC_PARAMS, pkcs11.CKA_EC_POINT)
		if err != nil {
			return nil, err
		}
		curve, err := curveOf(a[pkcs11.CKA_EC_PARAMS])
		if err != nil {
			return nil, err
		}
		pt := unwrapOctets(a[pkcs11.CKA_EC_POINT])
		// crypto/ecdh validates the point; crypto/ecdsa takes it from there.
		pk, err := ecdsa.ParseUncompressedPublicKey(curve, pt)
		if err != nil {
			return nil, fmt.Errorf("EC point: %w", err)
		}
		return pk, nil
	case slot.CKKECEdwards:
		a, err := attrMap(ctx, g, h, pkcs11.CKA_EC_POINT)
		if err != nil {
			return nil, err
		}
		pt := unwrapOctets(a[pkcs11.CKA_EC_POINT])
		if len(pt) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("EdDSA point of %d bytes: only Ed25519 is supported", len(pt))
		}
		return ed25519.PublicKey(pt), nil
	}
	return nil, fmt.Errorf("key type 0x%x not supported by Signer", keyType)
}

func attrMap(ctx context.Context, g *group.Group, h group.ObjectHandle, types ...uint) (map[uint][]byte, error) {
	attrs, err := g.GetAttributes(ctx, h, types)
	if err != nil {
		return nil, err
	}
	m := make(map[uint][]byte, len(attrs))
	for _, a := range attrs {
		if a.Status != pkcs11.CKR_OK {
			return nil, fmt.Errorf("attribute 0x%x: %w", a.Type, pkcs11.Error(a.Status))
		}
		m[a.Type] = a.Value
	}
	return m, nil
}

// unwrapOctets strips the DER OCTET STRING PKCS#11 puts around CKA_EC_POINT
// (some tokens return the bare point).
func unwrapOctets(b []byte) []byte {
	var inner []byte
	if rest, err := asn1.Unmarshal(b, &inner); err == nil && len(rest) == 0 {
		return inner
	}
	return b
}

func curveOf(params []byte) (elliptic.Curve, error) {
	var oid asn1.ObjectIdentifier
	if _, err := asn1.Unmarshal(params, &oid); err != nil {
		return nil, fmt.Errorf("EC params: %w", err)
	}
	switch {
	case oid.Equal(asn1.ObjectIdentifier{1, 2, 840, 10045, 3, 1, 7}):
		return elliptic.P256(), nil
	case oid.Equal(asn1.ObjectIdentifier{1, 3, 132, 0, 34}):
		return elliptic.P384(), nil
	case oid.Equal(asn1.ObjectIdentifier{1, 3, 132, 0, 35}):
		return elliptic.P521(), nil
	}
	return nil, fmt.Errorf("EC curve %v not supported", oid)
}

// Public returns the public key: *rsa.PublicKey, *ecdsa.PublicKey or
// ed25519.PublicKey.
func (s *Signer) Public() crypto.PublicKey { return s.pub }

// Handle returns the private key's virtual handle.
func (s *Signer) Handle() group.ObjectHandle { return s.priv }

// Sign signs digest like the crypto/ecdsa, crypto/rsa and crypto/ed25519
// signers do: ECDSA signatures are ASN.1 DER; RSA uses PKCS #1 v1.5, or
// PSS when opts is *rsa.PSSOptions (PSSSaltLengthAuto means the largest
// salt); Ed25519 signs the message itself (opts.HashFunc() must be 0).
// rand is not used: the token draws its own randomness.
func (s *Signer) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	return s.SignContext(context.Background(), digest, opts)
}

// SignContext is Sign with a context.
func (s *Signer) SignContext(ctx context.Context, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	if opts == nil {
		opts = crypto.Hash(0)
	}
	switch pub := s.pub.(type) {
	case *ecdsa.PublicKey:
		raw, err := s.g.Sign(ctx, pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil), s.priv, digest)
		if err != nil {
			return nil, err
		}
		n := (pub.Curve.Params().BitSize + 7) / 8
		if len(raw) != 2*n {
			return nil, fmt.Errorf("signer: ECDSA signature of %d bytes, want %d", len(raw), 2*n)
		}
		return asn1.Marshal(struct{ R, S *big.Int }{new(big.Int).SetBytes(raw[:n]), new(big.Int).SetBytes(raw[n:])})
	case *rsa.PublicKey:
		if pss, ok := opts.(*rsa.PSSOptions); ok {
			return s.signPSS(ctx, pub, digest, pss)
		}
		h := opts.HashFunc()
		prefix, ok := digestInfoPrefix(h)
		if !ok {
			return nil, fmt.Errorf("signer: RSA PKCS#1 v1.5 with hash %v not supported", h)
		}
		if h != 0 && len(digest) != h.Size() {
			return nil, fmt.Errorf("signer: digest of %d bytes for %v", len(digest), h)
		}
		return s.g.Sign(ctx, pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS, nil), s.priv, append(append([]byte(nil), prefix...), digest...))
	case ed25519.PublicKey:
		if opts.HashFunc() != 0 {
			return nil, errors.New("signer: Ed25519 signs the message itself: opts.HashFunc() must be 0 (Ed25519ph is not supported)")
		}
		return s.g.Sign(ctx, pkcs11.NewMechanism(slot.CKMEdDSA, nil), s.priv, digest)
	}
	return nil, fmt.Errorf("signer: unsupported public key %T", s.pub)
}

func (s *Signer) signPSS(ctx context.Context, pub *rsa.PublicKey, digest []byte, opts *rsa.PSSOptions) ([]byte, error) {
	h := opts.Hash
	hmech, hmgf, ok := hashMechs(h)
	if !ok {
		return nil, fmt.Errorf("signer: RSA-PSS with hash %v not supported", h)
	}
	if len(digest) != h.Size() {
		return nil, fmt.Errorf("signer: digest of %d bytes for %v", len(digest), h)
	}
	salt := opts.SaltLength
	switch salt {
	case rsa.PSSSaltLengthAuto:
		salt = (pub.N.BitLen()-1+7)/8 - h.Size() - 2
	case rsa.PSSSaltLengthEqualsHash:
		salt = h.Size()
	}
	if salt < 0 {
		return nil, fmt.Errorf("signer: RSA-PSS salt length %d", opts.SaltLength)
	}
	params := pkcs11.NewPSSParams(hmech, hmgf, uint(salt))
	return s.g.Sign(ctx, pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS_PSS, params), s.priv, digest)
}

// Decrypt decrypts msg with an RSA key: OAEP when opts is *rsa.OAEPOptions,
// PKCS #1 v1.5 otherwise. Keys of other types return an error.
func (s *Signer) Decrypt(_ io.Reader, msg []byte, opts crypto.DecrypterOpts) ([]byte, error) {
	return s.DecryptContext(context.Background(), msg, opts)
}

// DecryptContext is Decrypt with a context.
func (s *Signer) DecryptContext(ctx context.Context, msg []byte, opts crypto.DecrypterOpts) ([]byte, error) {
	if _, ok := s.pub.(*rsa.PublicKey); !ok {
		return nil, fmt.Errorf("signer: Decrypt needs an RSA key, have %T", s.pub)
	}
	switch o := opts.(type) {
	case *rsa.OAEPOptions:
		mgfHash := o.MGFHash
		if mgfHash == 0 {
			mgfHash = o.Hash
		}
		hmech, _, ok := hashMechs(o.Hash)
		_, mgf, ok2 := hashMechs(mgfHash)
		if !ok || !ok2 {
			return nil, fmt.Errorf("signer: RSA-OAEP with hash %v / MGF %v not supported", o.Hash, mgfHash)
		}
		params := pkcs11.NewOAEPParams(hmech, mgf, pkcs11.CKZ_DATA_SPECIFIED, o.Label)
		return s.g.Decrypt(ctx, pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS_OAEP, params), s.priv, msg)
	case nil, *rsa.PKCS1v15DecryptOptions:
		return s.g.Decrypt(ctx, pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS, nil), s.priv, msg)
	}
	return nil, fmt.Errorf("signer: Decrypt options %T not supported", opts)
}

// digestInfoPrefix returns the DER DigestInfo header PKCS #1 v1.5 puts
// before a digest of h (hash 0: the caller's data is signed as is).
func digestInfoPrefix(h crypto.Hash) ([]byte, bool) {
	switch h {
	case 0:
		return nil, true
	case crypto.SHA1:
		return []byte{0x30, 0x21, 0x30, 0x09, 0x06, 0x05, 0x2b, 0x0e, 0x03, 0x02, 0x1a, 0x05, 0x00, 0x04, 0x14}, true
	case crypto.SHA224:
		return []byte{0x30, 0x2d, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x04, 0x05, 0x00, 0x04, 0x1c}, true
	case crypto.SHA256:
		return []byte{0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05, 0x00, 0x04, 0x20}, true
	case crypto.SHA384:
		return []byte{0x30, 0x41, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x02, 0x05, 0x00, 0x04, 0x30}, true
	case crypto.SHA512:
		return []byte{0x30, 0x51, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x03, 0x05, 0x00, 0x04, 0x40}, true
	}
	return nil, false
}

// hashMechs returns the CKM_ digest mechanism and CKG_MGF1_ function of h.
func hashMechs(h crypto.Hash) (mech, mgf uint, ok bool) {
	switch h {
	case crypto.SHA1:
		return pkcs11.CKM_SHA_1, pkcs11.CKG_MGF1_SHA1, true
	case crypto.SHA224:
		return pkcs11.CKM_SHA224, pkcs11.CKG_MGF1_SHA224, true
	case crypto.SHA256:
		return pkcs11.CKM_SHA256, pkcs11.CKG_MGF1_SHA256, true
	case crypto.SHA384:
		return pkcs11.CKM_SHA384, pkcs11.CKG_MGF1_SHA384, true
	case crypto.SHA512:
		return pkcs11.CKM_SHA512, pkcs11.CKG_MGF1_SHA512, true
	}
	return 0, 0, false
}

var (
	_ crypto.Signer    = (*Signer)(nil)
	_ crypto.Decrypter = (*Signer)(nil)
)
