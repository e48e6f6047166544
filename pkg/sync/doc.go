// Package sync knows what an object is across the members of an HA group
// and moves single objects between members.
//
// # Identity and fingerprint
//
// An object on one member is the same object as one on another when their
// Identity (CKA_CLASS + CKA_KEY_TYPE + CKA_ID + CKA_LABEL) is equal. A
// Fingerprint of the key material tells two different keys under one
// identity apart (the duplicate-label hazard): SHA-256 of the DER
// SubjectPublicKeyInfo for public keys and the private halves of key
// pairs (the same value `openssl pkey -pubin -outform DER | sha256sum`
// gives), the 3-byte key check value for secret keys, SHA-256 of
// CKA_VALUE for certificates and data objects.
//
// # Replication
//
// Replicator.Replicate copies one object: keys wrapped under the group's
// domain key (see InstallDomainKey), public objects by attributes; the
// copy is checked on the target and removed again on any failure.
// Replicator.ReplicateEach copies one object to several members at once,
// reading and wrapping it once. A member that cannot wrap or unwrap with
// CKM_AES_KEY_WRAP_PAD gets ErrMechanismUnavailable (a request error, not
// a health one). A member whose domain key could do more than wrap and
// unwrap (see WeakDomainKeyError) gets ErrWeakDomainKey, and nothing is
// copied to or from it until ReplaceDomainKey puts a sound key everywhere.
//
// # Searches
//
// SoftHSM answers every C_FindObjects by visiting each object on the
// token, whatever the template, so a search costs in proportion to the
// token's size. A Replicator therefore remembers, per member slot and
// login epoch, the domain key's handle and the member's wrapping
// mechanism; a copy then searches only its target, once, for an existing
// copy, and not at all when the caller promises the identity is absent
// there (Target.Absent, e.g. from a plan's listing).
//
// # SoftHSM 2.6.1, measured
//
//   - EC and EdDSA private keys have no CKA_EC_POINT (type invalid) and an
//     empty CKA_PUBLIC_KEY_INFO; their fingerprint comes from the public
//     key with the same CKA_ID. RSA private keys show CKA_MODULUS and
//     CKA_PUBLIC_EXPONENT. The EdDSA private half stores CKA_EC_PARAMS as
//     the PrintableString "edwards25519" even when generated from the OID.
//   - CKA_CHECK_VALUE exists on generated and created AES, DES3 and
//     generic secret keys, but C_UnwrapKey leaves it empty (and
//     CKA_VALUE_LEN 0). It is refused in an unwrap template
//     (CKR_ATTRIBUTE_VALUE_INVALID, even when right); C_SetAttributeValue
//     checks it against the key: the right value is taken and a wrong one
//     refused for AES and DES3, both are refused for generic secret keys.
//   - CKA_EC_PARAMS, CKA_PUBLIC_EXPONENT, CKA_VALUE_LEN, CKA_LOCAL and
//     CKA_ALWAYS_SENSITIVE in an unwrap template: CKR_ATTRIBUTE_READ_ONLY.
//     An unwrapped key defaults to CKA_SENSITIVE=false and
//     CKA_EXTRACTABLE=false, so the template carries both.
//   - A key's CKA_UNWRAP_TEMPLATE is not merged into C_UnwrapKey's
//     template: each of its attributes must be there with the same value,
//     else CKR_TEMPLATE_INCONSISTENT.
//   - CKM_AES_KEY_WRAP_PAD is deterministic: wrapping an unwrapped copy
//     again under the same key gives the same blob (EC, RSA, AES, DES3,
//     generic secret), which is how a copy's material is proven equal.
//   - EdDSA private keys cannot be wrapped at all (CKR_KEY_NOT_WRAPPABLE),
//     so they cannot be replicated between SoftHSM members.
//   - ECDH-derived AES and DES3 keys carry a wrong CKA_CHECK_VALUE: the
//     first 3 bytes of SHA-1 over the derived secret (the generic-secret
//     rule), not the block cipher's. Replicate proves such a copy by its
//     material and puts the right check value on copy and source. For a
//     derived generic secret truncated by CKA_VALUE_LEN the stored value
//     covers the untruncated secret and the copy refuses it; no member
//     can compute the right one (no encryption with a generic secret).
//   - C_FindObjects visits every object, so its cost grows with the
//     token; creating a token object (C_CreateObject, C_UnwrapKey) costs
//     the same whatever the token's size (figures: docs/BENCHMARKS.md,
//     "SoftHSM costs the code is shaped by").
//
// # p11-kit 0.24, measured
//
//   - The client offers neither CKM_AES_KEY_WRAP_PAD nor CKM_AES_KEY_WRAP
//     (C_GetMechanismInfo: CKR_MECHANISM_INVALID), so private and secret
//     keys cannot be replicated through it.
//   - An object with a nested attribute (CKA_UNWRAP_TEMPLATE) can be
//     neither created nor read through it: CKR_DEVICE_ERROR, after which
//     the connection still works.
//   - A wrong key type in an unwrap template gives CKR_FUNCTION_FAILED; a
//     wrong unwrapping key CKR_GENERAL_ERROR.
package sync
