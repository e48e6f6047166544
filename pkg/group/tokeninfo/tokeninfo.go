// Package tokeninfo holds the rules by which a group's virtual token
// describes itself from its members' answers: which token flags every
// member must have and which any member's count, how session counts and
// memory figures add up, which model the token claims, and which
// mechanisms (and what of each) the group offers. It is pure: pkg/group
// asks the members and passes their answers in.
package tokeninfo

import (
	"slices"

	"github.com/miekg/pkcs11"
)

const (
	// Unavailable is CK_UNAVAILABLE_INFORMATION.
	Unavailable = ^uint(0)
	// Infinite is CK_EFFECTIVELY_INFINITE.
	Infinite = 0
)

// Fallback token identity, for a group whose members are of different
// models (no one token's quirks apply to it) or were never reached.
const (
	MixedManufacturer = "hagroup"
	MixedModel        = "HA virtual slot"
)

// The flags the virtual token has when every member has them, and those it
// has when any member has them: a PIN's state on any member is the
// application's to see (a PIN is proved on one member, and that one counts
// the failures).
const (
	everyOf = uint(pkcs11.CKF_RNG | pkcs11.CKF_USER_PIN_INITIALIZED | pkcs11.CKF_TOKEN_INITIALIZED | pkcs11.CKF_RESTORE_KEY_NOT_NEEDED)
	anyOf   = uint(pkcs11.CKF_LOGIN_REQUIRED | pkcs11.CKF_WRITE_PROTECTED |
		pkcs11.CKF_USER_PIN_COUNT_LOW | pkcs11.CKF_USER_PIN_FINAL_TRY | pkcs11.CKF_USER_PIN_LOCKED | pkcs11.CKF_USER_PIN_TO_BE_CHANGED |
		pkcs11.CKF_SO_PIN_COUNT_LOW | pkcs11.CKF_SO_PIN_FINAL_TRY | pkcs11.CKF_SO_PIN_LOCKED | pkcs11.CKF_SO_PIN_TO_BE_CHANGED)
)

// Merge returns the token information of a group whose serving members
// answered infos (at least one): the flags of everyOf when every member
// has them, those of anyOf when any member has them; the PIN length range
// every member accepts; session counts summed and session maxima the
// smallest member's (each virtual session may need a session on every
// member); memory figures summed; the first member's versions; the
// members' model (Model). Label and serial are the caller's.
func Merge(infos []pkcs11.TokenInfo) pkcs11.TokenInfo {
	var ti pkcs11.TokenInfo
	ti.ManufacturerID, ti.Model = Model(infos)
	ti.Flags = everyOf
	ti.MaxPinLen = Unavailable
	ti.MaxSessionCount, ti.MaxRwSessionCount = Infinite, Infinite
	for i, in := range infos {
		ti.Flags &^= everyOf &^ in.Flags
		ti.Flags |= in.Flags & anyOf
		if in.MinPinLen > ti.MinPinLen {
			ti.MinPinLen = in.MinPinLen
		}
		if i == 0 || in.MaxPinLen < ti.MaxPinLen {
			ti.MaxPinLen = in.MaxPinLen
		}
		ti.MaxSessionCount = minCount(ti.MaxSessionCount, in.MaxSessionCount)
		ti.MaxRwSessionCount = minCount(ti.MaxRwSessionCount, in.MaxRwSessionCount)
		ti.SessionCount = sumCount(ti.SessionCount, in.SessionCount)
		ti.RwSessionCount = sumCount(ti.RwSessionCount, in.RwSessionCount)
		ti.TotalPublicMemory = sumCount(ti.TotalPublicMemory, in.TotalPublicMemory)
		ti.FreePublicMemory = sumCount(ti.FreePublicMemory, in.FreePublicMemory)
		ti.TotalPrivateMemory = sumCount(ti.TotalPrivateMemory, in.TotalPrivateMemory)
		ti.FreePrivateMemory = sumCount(ti.FreePrivateMemory, in.FreePrivateMemory)
		if i == 0 {
			ti.HardwareVersion, ti.FirmwareVersion = in.HardwareVersion, in.FirmwareVersion
		}
	}
	return ti
}

// Unanswered returns the token information of a group no member answered:
// the flags of an initialised token that needs a login, and unavailable
// figures. Label, serial and model are the caller's.
func Unanswered() pkcs11.TokenInfo {
	var ti pkcs11.TokenInfo
	ti.Flags = pkcs11.CKF_TOKEN_INITIALIZED | pkcs11.CKF_LOGIN_REQUIRED | pkcs11.CKF_USER_PIN_INITIALIZED
	ti.MaxSessionCount, ti.SessionCount = Unavailable, Unavailable
	ti.MaxRwSessionCount, ti.RwSessionCount = Unavailable, Unavailable
	ti.TotalPublicMemory, ti.FreePublicMemory = Unavailable, Unavailable
	ti.TotalPrivateMemory, ti.FreePrivateMemory = Unavailable, Unavailable
	ti.MaxPinLen, ti.MinPinLen = Unavailable, Unavailable
	return ti
}

// Model returns the manufacturer and model the virtual token reports for
// members that answered infos (at least one): theirs when they all agree,
// since the group passes every operation to them and an application
// working around a token's quirks by ManufacturerID meets exactly theirs;
// else MixedManufacturer and MixedModel.
func Model(infos []pkcs11.TokenInfo) (manufacturer, model string) {
	for _, in := range infos[1:] {
		if in.ManufacturerID != infos[0].ManufacturerID || in.Model != infos[0].Model {
			return MixedManufacturer, MixedModel
		}
	}
	return infos[0].ManufacturerID, infos[0].Model
}

func sumCount(a, b uint) uint {
	if a == Unavailable || b == Unavailable {
		return Unavailable
	}
	return a + b
}

// minCount is the smaller of two maxima where Infinite means unlimited.
func minCount(a, b uint) uint {
	switch {
	case a == Unavailable || b == Unavailable:
		return Unavailable
	case a == Infinite:
		return b
	case b == Infinite:
		return a
	}
	return min(a, b)
}

// Mechanisms returns the mechanisms of first (the primary's list, in its
// order: applications pick "the first mechanism that does X" as they
// would on the member token) that every list has.
func Mechanisms(first []uint, lists [][]uint) []uint {
	out := slices.Clone(first)
	for _, l := range lists {
		out = slices.DeleteFunc(out, func(x uint) bool { return !slices.Contains(l, x) })
	}
	return out
}

// MechanismInfo returns what every member that answered infos (at least
// one) can do with a mechanism: the flags all of them have and the key
// size range all of them accept.
func MechanismInfo(infos []pkcs11.MechanismInfo) pkcs11.MechanismInfo {
	out := infos[0]
	for _, in := range infos[1:] {
		out.Flags &= in.Flags
		out.MinKeySize = max(out.MinKeySize, in.MinKeySize)
		out.MaxKeySize = min(out.MaxKeySize, in.MaxKeySize)
	}
	return out
}
