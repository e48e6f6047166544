package sync

import (
	"errors"
	"strings"
	"testing"

	"github.com/miekg/pkcs11"
)

// A generation mechanism names the kind it makes; a capability says which
// kinds it refuses and why, and two probes that refuse alike are the same;
// a refusal names the member and the kind, and stays matchable inside
// Refusals.
func TestHoldRules(t *testing.T) {
	if k, ok := GeneratedKind(pkcs11.CKM_EC_KEY_PAIR_GEN); !ok || k != (Kind{pkcs11.CKO_PRIVATE_KEY, pkcs11.CKK_EC}) {
		t.Errorf("CKM_EC_KEY_PAIR_GEN makes %v, %v", k, ok)
	}
	if _, ok := GeneratedKind(pkcs11.CKM_ECDSA); ok {
		t.Errorf("CKM_ECDSA taken for a generation")
	}
	ed := Kind{pkcs11.CKO_PRIVATE_KEY, 0x40}
	refuses := WrapCapability{Mechanism: true, Probed: []Kind{ed}, Refused: map[Kind]error{ed: pkcs11.Error(pkcs11.CKR_KEY_NOT_WRAPPABLE)}}
	names, why := refuses.Explain()
	if names != ed.String()+"s" || !strings.Contains(why, "CKR_KEY_NOT_WRAPPABLE") {
		t.Errorf("Explain = %q, %q", names, why)
	}
	if names, _ := (WrapCapability{Mechanism: true, Probed: []Kind{ed}}).Explain(); names != "" {
		t.Errorf("a capability that holds every kind explains %q", names)
	}
	lacks := WrapCapability{}
	if refuses.Same(lacks) || !refuses.Same(refuses) {
		t.Errorf("Same: a refusal of one kind and a missing mechanism compare alike, or a probe differs from itself")
	}
	cause := refuses.Holds(ed)
	rs := Refusals{{Member: "hsm-b", Kind: ed, Err: cause}}
	var r Refusal
	if !strings.Contains(rs.Error(), "member hsm-b cannot hold") || !strings.Contains(rs.Error(), cause.Error()) ||
		!errors.As(rs, &r) || r.Member != "hsm-b" {
		t.Errorf("Refusals = %q; the member and the cause must be named, the refusal matchable", rs.Error())
	}
}
