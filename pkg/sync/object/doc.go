// Package object says what an object of a member is, across members: its
// Identity (CKA_CLASS + CKA_KEY_TYPE + CKA_ID + CKA_LABEL), its
// Fingerprint, the attribute reads both come from (Attrs, ReadAttrs,
// Read), and whether it is the group's own (Hidden: a domain key or group
// state), which no application sees.
//
// An object on one member is the same object as one on another when their
// Identity is equal. A Fingerprint of the key material tells two
// different keys under one identity apart (the duplicate-label hazard):
// SHA-256 of the DER SubjectPublicKeyInfo for public keys and the private
// halves of key pairs (the same value `openssl pkey -pubin -outform DER |
// sha256sum` gives), the 3-byte key check value for secret keys, SHA-256
// of CKA_VALUE for certificates and data objects.
package object
