// Package secret holds PINs so that they cannot leak by accident: a PIN
// prints as a fixed mask in fmt, %v, %#v, JSON and slog, and can be zeroed
// once it is no longer needed.
package secret

import (
	"crypto/subtle"
	"fmt"
	"log/slog"
)

const mask = "[redacted]"

// PIN is a token PIN. The zero value is the empty PIN. Copies share the
// underlying bytes, so Zero on one clears all of them; use Clone for an
// independent copy.
type PIN struct {
	b []byte
}

// NewPIN returns a PIN holding a copy of b.
func NewPIN(b []byte) PIN {
	return PIN{b: append([]byte(nil), b...)}
}

// PINFromString returns a PIN holding the bytes of s.
func PINFromString(s string) PIN {
	return PIN{b: []byte(s)}
}

// Bytes returns the PIN's bytes. Callers must not keep or log them.
func (p PIN) Bytes() []byte { return p.b }

// Reveal returns the PIN as a string for APIs that take one (miekg/pkcs11's
// Login). Callers must not keep or log it.
func (p PIN) Reveal() string { return string(p.b) }

// Empty reports whether the PIN has no bytes.
func (p PIN) Empty() bool { return len(p.b) == 0 }

// Clone returns an independent copy of p.
// Equal reports whether p and q are the same PIN, in time that does not
// depend on where they differ.
func (p PIN) Equal(q PIN) bool { return subtle.ConstantTimeCompare(p.b, q.b) == 1 }

func (p PIN) Clone() PIN { return NewPIN(p.b) }

// Zero overwrites the PIN's bytes with zeros.
func (p PIN) Zero() {
	clear(p.b)
}

// String returns a mask, never the PIN.
func (p PIN) String() string { return mask }

// GoString returns a mask, never the PIN.
func (p PIN) GoString() string { return mask }

// Format prints a mask for every verb, so %s, %v, %+v, %#v, %x and %q never
// show the PIN.
func (p PIN) Format(f fmt.State, _ rune) { fmt.Fprint(f, mask) }

// LogValue keeps the PIN out of slog output.
func (p PIN) LogValue() slog.Value { return slog.StringValue(mask) }

// MarshalText keeps the PIN out of JSON, TOML and other text encodings.
func (p PIN) MarshalText() ([]byte, error) { return []byte(mask), nil }
