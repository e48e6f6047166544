package domainkey

import (
	"errors"
	"fmt"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// Mechanism is the mechanism private and secret keys travel under.
const Mechanism = pkcs11.CKM_AES_KEY_WRAP_PAD

// ErrMechanismUnavailable is wrapped by errors saying that a member cannot
// do what replication asks of it: wrap or unwrap with
// CKM_AES_KEY_WRAP_PAD. It says what the member is, not how it is: such a
// member can hold no replica of a private or secret key, and nothing is
// wrong with its health (p11-kit 0.24's client, for one, does not carry
// the mechanism). slot.ClassOf puts these errors in ClassRequest. Use
// errors.As with *MechanismError for the member and the mechanism.
var ErrMechanismUnavailable = errors.New("mechanism unavailable")

// MechanismError says that Member cannot Use Mechanism.
type MechanismError struct {
	Member    string
	Mechanism uint   // CKM_ value
	Use       string // "wrap", "unwrap" or "wrap and unwrap"
	// Err is the module's answer (CKR_MECHANISM_INVALID…); nil when the
	// module offers the mechanism but not for this use.
	Err error
}

func (e *MechanismError) Error() string {
	why := "the module does not offer it"
	if e.Err == nil {
		why = "the module offers it, but not to " + e.Use
	} else if slot.CodeOf(e.Err) != pkcs11.CKR_MECHANISM_INVALID {
		why = e.Err.Error()
	}
	return fmt.Sprintf("member %s: %v: it cannot %s with %s (%s), so it can neither give nor take replicas of private and secret keys",
		e.Member, ErrMechanismUnavailable, e.Use, MechanismName(e.Mechanism), why)
}

// Unwrap makes errors.Is(err, ErrMechanismUnavailable) true and keeps the
// module's answer (or CKR_MECHANISM_INVALID) in the chain for slot.ClassOf
// and slot.CodeOf.
func (e *MechanismError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrMechanismUnavailable, e.Err}
	}
	return []error{ErrMechanismUnavailable, pkcs11.Error(pkcs11.CKR_MECHANISM_INVALID)}
}

// MechanismName names m for messages.
func MechanismName(m uint) string {
	switch m {
	case pkcs11.CKM_AES_KEY_WRAP_PAD:
		return "CKM_AES_KEY_WRAP_PAD"
	case pkcs11.CKM_AES_KEY_WRAP:
		return "CKM_AES_KEY_WRAP"
	}
	return fmt.Sprintf("mechanism 0x%x", m)
}

// CheckMechanism returns nil when info (asked of member, with err) has
// every flag for Mechanism, and a *MechanismError when it does not.
func CheckMechanism(member string, info pkcs11.MechanismInfo, err error, flag uint) error {
	if err == nil && info.Flags&flag == flag {
		return nil
	}
	use := map[uint]string{pkcs11.CKF_WRAP: "wrap", pkcs11.CKF_UNWRAP: "unwrap"}[flag]
	if use == "" {
		use = "wrap and unwrap"
	}
	return &MechanismError{Member: member, Mechanism: Mechanism, Use: use, Err: err}
}
