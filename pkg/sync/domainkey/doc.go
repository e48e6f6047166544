// Package domainkey is the life of a group's domain key on its members:
// the AES-256 key labelled Label(serial) that private and secret keys
// travel wrapped under (Mechanism) between members of one make. Install
// and Replace are the ceremony (every member the same value, checked);
// Audit and AuditHandle tell a key that could do more than wrap and unwrap
// (WeakError); WrapOnlyFlaws tells a make that cannot keep such a key
// (NoWrapOnlyKeyError); Find and Lookup find it; Remove destroys it.
package domainkey
