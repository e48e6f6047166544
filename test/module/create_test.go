package module

import (
	"strings"
	"testing"
	"time"
)

// loginArgs are pkcs11-tool's arguments to log in to the virtual slot.
var loginArgs = []string{"--slot", virtualSlot, "--login", "--pin", "env:HA_PIN"}

// keypairgenFails runs pkcs11-tool --keypairgen on the virtual slot, which
// must fail, and returns its output. extra are more arguments.
func (r *rig) keypairgenFails(keyType, label, id string, extra ...string) string {
	r.t.Helper()
	args := append([]string{"--module", r.lib}, loginArgs...)
	args = append(args, "--keypairgen", "--key-type", keyType, "--label", label, "--id", id)
	args = append(args, extra...)
	out, err := r.run(2*time.Minute, nil, "pkcs11-tool", args...)
	if err == nil {
		r.t.Fatalf("pkcs11-tool --keypairgen --key-type %s on the virtual slot succeeded, want it refused:\n%s", keyType, out)
	}
	return out
}

// noMemberHolds fails the test for each member that holds an object with
// the label.
func (r *rig) noMemberHolds(label string) {
	r.t.Helper()
	for _, m := range r.members {
		if objs := r.direct(m, "--login", "--pin", "env:HA_PIN", "-O"); strings.Contains(objs, "label:      "+label) {
			r.t.Errorf("member %s holds an object of the refused creation %s:\n%s", m.Name, label, objs)
		}
	}
}

// TestEd25519NotOfferedOnSoftHSMMembers: SoftHSM 2.6 cannot wrap EdDSA
// private keys, so a group of three cannot replicate them. Through
// libhapkcs11.so the virtual slot does not list
// CKM_EC_EDWARDS_KEY_PAIR_GEN (each member's own slot does), and
// pkcs11-tool's Ed25519 generation is refused with CKR_MECHANISM_INVALID,
// never CKR_KEY_NOT_WRAPPABLE, leaving nothing on any member; EC keys are
// still made on every member.
func TestEd25519NotOfferedOnSoftHSMMembers(t *testing.T) {
	r := newRig(t, rigOpts{})
	const gen = "EC-EDWARDS-KEY-PAIR-GEN"
	if mechs := r.direct(r.members[0], "-M"); !strings.Contains(mechs, gen) {
		t.Fatalf("member %s does not list %s; the test needs a token that generates Ed25519 keys:\n%s", r.members[0].Name, gen, mechs)
	}
	if mechs := r.tool("--slot", virtualSlot, "-M"); strings.Contains(mechs, gen) {
		t.Errorf("the virtual slot lists %s, whose keys it cannot replicate:\n%s", gen, mechs)
	}
	out := r.keypairgenFails("EC:edwards25519", "ed-gen", "e1")
	if !strings.Contains(out, "mechanism 1055 not supported") {
		t.Errorf("Ed25519 generation through the virtual slot, want pkcs11-tool to find the mechanism not offered:\n%s", out)
	}
	// Named anyway, the generation reaches C_GenerateKeyPair: refused with
	// a code that function may return.
	out = r.keypairgenFails("EC:edwards25519", "ed-gen", "e1", "--mechanism", gen)
	if !strings.Contains(out, "C_GenerateKeyPair failed: rv = CKR_MECHANISM_INVALID") || strings.Contains(out, "CKR_KEY_NOT_WRAPPABLE") {
		t.Errorf("Ed25519 generation with --mechanism %s, want C_GenerateKeyPair to answer CKR_MECHANISM_INVALID:\n%s", gen, out)
	}
	r.noMemberHolds("ed-gen")
	r.keypair("ec-after", "e2")
	for _, m := range r.members {
		if objs := r.direct(m, "--login", "--pin", "env:HA_PIN", "-O"); !containsAll(objs, "Private Key Object; EC", "label:      ec-after") {
			t.Errorf("member %s does not hold the EC key made after the refusal:\n%s", m.Name, objs)
		}
	}
}

// TestServedMemberRefusesKeyCreation: with a member behind `p11-kit
// server` (p11-kit 0.24 carries no CKM_AES_KEY_WRAP_PAD), no private key
// can be on every member, so pkcs11-tool's EC key generation through
// libhapkcs11.so answers CKR_MECHANISM_INVALID and no member keeps
// anything — where before it answered CKR_OK with the private key on one
// member only.
func TestServedMemberRefusesKeyCreation(t *testing.T) {
	r := newRig(t, rigOpts{served: true})
	const gen = "ECDSA-KEY-PAIR-GEN"
	if mechs := r.tool("--slot", virtualSlot, "-M"); strings.Contains(mechs, gen) {
		t.Errorf("the virtual slot lists %s with a member that cannot hold the keys:\n%s", gen, mechs)
	}
	if out := r.keypairgenFails("EC:prime256v1", "served-gen", "f1"); !strings.Contains(out, "mechanism 1040 not supported") {
		t.Errorf("EC generation with a p11-kit member, want pkcs11-tool to find the mechanism not offered:\n%s", out)
	}
	out := r.keypairgenFails("EC:prime256v1", "served-gen", "f1", "--mechanism", gen)
	if !strings.Contains(out, "C_GenerateKeyPair failed: rv = CKR_MECHANISM_INVALID") {
		t.Errorf("EC generation with --mechanism %s, want C_GenerateKeyPair to answer CKR_MECHANISM_INVALID:\n%s", gen, out)
	}
	r.noMemberHolds("served-gen")
}
