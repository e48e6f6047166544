// Package sync keeps the members of an HA group holding the same objects:
// copying one between members, what a member can hold, and planning and
// applying a member's catch-up. Beneath it: what an object is across
// members (identity, fingerprint, attribute reads: pkg/sync/object), the
// group's domain key (pkg/sync/domainkey), and the group's state on the
// members (pkg/sync/state, with the tombstones in pkg/sync/tombstone).
//
// # Replication
//
// Replicator.Replicate copies one object: keys wrapped under the group's
// domain key (see domainkey.Install) between members of one make, or by
// the way their pair proved (ProvePair) under a key agreed for the copy
// between two makes (Replicator.PairWay, agree.go); public objects by
// attributes. The copy is checked on the target and removed again on any
// failure. A key that cannot travel to a member gets ErrCannotCross.
// Replicator.ReplicateEach copies one object to several members at once,
// reading and wrapping it once; Replicator.Share does the same for several
// objects, each copied when and where the caller asks (pkg/group copies a
// key pair's halves to each target in turn). A member that cannot wrap or unwrap with
// CKM_AES_KEY_WRAP_PAD gets domainkey.ErrMechanismUnavailable (a request
// error, not a health one). A member whose domain key could do more than wrap and
// unwrap (see domainkey.WeakError) gets domainkey.ErrWeak, and nothing is
// copied to or from it until domainkey.Replace puts a sound key everywhere.
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
