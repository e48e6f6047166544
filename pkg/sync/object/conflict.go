package object

import (
	"errors"
	"fmt"
)

// ErrConflict is wrapped by errors saying that two members hold different
// objects under one identity (the duplicate-label hazard). It is reported,
// never resolved by guessing. Use errors.As with *ConflictError for the
// details.
var ErrConflict = errors.New("conflict")

// ConflictError says member Member holds Identity with fingerprint Have
// where the source has Want.
type ConflictError struct {
	Identity Identity
	Member   string
	Want     []byte // the source's fingerprint
	Have     []byte // the fingerprint on Member
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("member %s: %s: %v: it holds fingerprint %s, the source has %s",
		e.Member, e.Identity, ErrConflict, FormatFingerprint(e.Have), FormatFingerprint(e.Want))
}

// Unwrap makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Unwrap() error { return ErrConflict }
