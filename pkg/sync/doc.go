// Package sync keeps the members of an HA group holding the same objects:
// what an object is across members (identity, fingerprint), copying one
// between members, the group's domain key, planning a member's catch-up,
// and the group's state objects on the members.
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
// domain key (see InstallDomainKey) between members of one make, or by
// the way their pair proved (ProvePair) under a key agreed for the copy
// between two makes (Replicator.PairWay, agree.go); public objects by
// attributes. The copy is checked on the target and removed again on any
// failure. A key that cannot travel to a member gets ErrCannotCross.
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
// # What tokens were found to do
//
// The replication is shaped by what SoftHSM 2.6.1 and p11-kit 0.24 were
// found to do (attributes an unwrap refuses, keys they cannot wrap, the
// cost of a search): docs/BENCHMARKS.md, "What SoftHSM and p11-kit were
// found to do".
package sync
