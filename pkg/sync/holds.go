package sync

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// What a member can hold of the keys made through a group, for pkg/group's
// creation promise (an object made through the group exists on every
// serving member before the call succeeds): the kind of key a generation
// mechanism makes, and the refusal of a member that cannot hold a kind.

// keygenKinds is the kind of key each generation mechanism makes (the
// private half, for a key pair).
var keygenKinds = map[uint]Kind{
	pkcs11.CKM_RSA_PKCS_KEY_PAIR_GEN:  {Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_RSA},
	pkcs11.CKM_RSA_X9_31_KEY_PAIR_GEN: {Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_RSA},
	pkcs11.CKM_EC_KEY_PAIR_GEN:        {Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_EC},
	slot.CKMECEdwardsKeyPairGen:       {Class: pkcs11.CKO_PRIVATE_KEY, KeyType: slot.CKKECEdwards},
	slot.CKMECMontgomeryKeyPairGen:    {Class: pkcs11.CKO_PRIVATE_KEY, KeyType: slot.CKKECMontgomery},
	pkcs11.CKM_DSA_KEY_PAIR_GEN:       {Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_DSA},
	pkcs11.CKM_DH_PKCS_KEY_PAIR_GEN:   {Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_DH},
	pkcs11.CKM_GOSTR3410_KEY_PAIR_GEN: {Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_GOSTR3410},
	pkcs11.CKM_AES_KEY_GEN:            {Class: pkcs11.CKO_SECRET_KEY, KeyType: pkcs11.CKK_AES},
	pkcs11.CKM_GENERIC_SECRET_KEY_GEN: {Class: pkcs11.CKO_SECRET_KEY, KeyType: pkcs11.CKK_GENERIC_SECRET},
	pkcs11.CKM_DES_KEY_GEN:            {Class: pkcs11.CKO_SECRET_KEY, KeyType: pkcs11.CKK_DES},
	pkcs11.CKM_DES2_KEY_GEN:           {Class: pkcs11.CKO_SECRET_KEY, KeyType: pkcs11.CKK_DES2},
	pkcs11.CKM_DES3_KEY_GEN:           {Class: pkcs11.CKO_SECRET_KEY, KeyType: pkcs11.CKK_DES3},
	pkcs11.CKM_GOST28147_KEY_GEN:      {Class: pkcs11.CKO_SECRET_KEY, KeyType: pkcs11.CKK_GOST28147},
}

// GeneratedKind returns the kind of key mech generates (the private half,
// for a key pair); false when mech is no key generation we know.
func GeneratedKind(mech uint) (Kind, bool) {
	k, ok := keygenKinds[mech]
	return k, ok
}

// KindOf returns the kind of key of an object with identity id.
func KindOf(id object.Identity) Kind { return Kind{Class: id.Class, KeyType: id.KeyType} }

// Same reports whether c and o hold the same: both offer the mechanism or
// neither, and they cannot hold the same kinds.
func (c WrapCapability) Same(o WrapCapability) bool {
	return c.Mechanism == o.Mechanism && slices.Equal(c.Unholdable(), o.Unholdable())
}

// Explain names the kinds c cannot hold ("EdDSA private keys") and says
// why for the first; none when c holds every kind.
func (c WrapCapability) Explain() (names string, why string) {
	var all []string
	for _, k := range c.Unholdable() {
		all = append(all, k.String()+"s")
		if why == "" {
			why = c.Holds(k).Error()
		}
	}
	return strings.Join(all, ", "), why
}

// Refusal is why one member cannot hold a kind of key.
type Refusal struct {
	Member string
	Kind   Kind
	Err    error
}

func (r Refusal) Error() string {
	return fmt.Sprintf("member %s cannot hold %ss made through the group: %v", r.Member, r.Kind, r.Err)
}

// Refusals is the error of a creation or replication some members cannot
// hold.
type Refusals []Refusal

func (rs Refusals) Error() string { return errors.Join(rs.Unwrap()...).Error() }

// Unwrap returns each refusal.
func (rs Refusals) Unwrap() []error {
	out := make([]error, len(rs))
	for i, r := range rs {
		out[i] = r
	}
	return out
}
