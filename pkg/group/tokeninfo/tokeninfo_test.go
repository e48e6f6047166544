package tokeninfo

import (
	"slices"
	"testing"

	"github.com/miekg/pkcs11"
)

// softhsm is what a SoftHSM 2.6 token answers C_GetTokenInfo with (the
// figures that matter here).
var softhsm = pkcs11.TokenInfo{
	ManufacturerID: "SoftHSM project", Model: "SoftHSM v2",
	Flags: pkcs11.CKF_RNG | pkcs11.CKF_LOGIN_REQUIRED | pkcs11.CKF_USER_PIN_INITIALIZED |
		pkcs11.CKF_RESTORE_KEY_NOT_NEEDED | pkcs11.CKF_TOKEN_INITIALIZED,
	MaxSessionCount: Infinite, MaxRwSessionCount: Infinite, SessionCount: 1, RwSessionCount: 1,
	MaxPinLen: 255, MinPinLen: 4,
	TotalPublicMemory: Unavailable, FreePublicMemory: Unavailable,
	TotalPrivateMemory: Unavailable, FreePrivateMemory: Unavailable,
	HardwareVersion: pkcs11.Version{Major: 2, Minor: 6},
}

// A group of members of different models reports hagroup's own identity:
// no one token's quirks apply to it.
func TestModel(t *testing.T) {
	other := softhsm
	other.Model = "Luna K7"
	for _, c := range []struct {
		name  string
		infos []pkcs11.TokenInfo
		want  [2]string
	}{
		{"one member", []pkcs11.TokenInfo{softhsm}, [2]string{softhsm.ManufacturerID, softhsm.Model}},
		{"agreeing", []pkcs11.TokenInfo{softhsm, softhsm, softhsm}, [2]string{softhsm.ManufacturerID, softhsm.Model}},
		{"another model", []pkcs11.TokenInfo{softhsm, other}, [2]string{MixedManufacturer, MixedModel}},
	} {
		if man, model := Model(c.infos); [2]string{man, model} != c.want {
			t.Errorf("%s: %q %q, want %q", c.name, man, model, c.want)
		}
	}
}

// The virtual token has a flag every member must have only when all do,
// a PIN's trouble when any member has it; a virtual session may need a
// session on every member, so the maxima are the smallest member's and the
// counts add up; a figure one member cannot give is unavailable.
func TestMerge(t *testing.T) {
	limited := softhsm
	limited.Flags = softhsm.Flags&^pkcs11.CKF_RNG | pkcs11.CKF_USER_PIN_COUNT_LOW
	limited.MaxSessionCount, limited.MaxRwSessionCount = 16, 8
	limited.SessionCount, limited.RwSessionCount = 3, 2
	limited.MaxPinLen, limited.MinPinLen = 64, 6
	limited.TotalPublicMemory, limited.FreePublicMemory = 1000, 100
	limited.HardwareVersion = pkcs11.Version{Major: 7}
	got := Merge([]pkcs11.TokenInfo{softhsm, limited})
	if got.Flags&pkcs11.CKF_RNG != 0 || got.Flags&pkcs11.CKF_TOKEN_INITIALIZED == 0 {
		t.Errorf("flags %#x: CKF_RNG must go (one member lacks it), CKF_TOKEN_INITIALIZED stay", got.Flags)
	}
	if got.Flags&pkcs11.CKF_USER_PIN_COUNT_LOW == 0 || got.Flags&pkcs11.CKF_LOGIN_REQUIRED == 0 {
		t.Errorf("flags %#x: one member's CKF_USER_PIN_COUNT_LOW and CKF_LOGIN_REQUIRED must show", got.Flags)
	}
	if got.MaxSessionCount != 16 || got.MaxRwSessionCount != 8 || got.SessionCount != 4 || got.RwSessionCount != 3 {
		t.Errorf("sessions max %d/%d count %d/%d, want 16/8 and 4/3", got.MaxSessionCount, got.MaxRwSessionCount, got.SessionCount, got.RwSessionCount)
	}
	if got.MinPinLen != 6 || got.MaxPinLen != 64 {
		t.Errorf("PIN length %d..%d, want 6..64 (what every member accepts)", got.MinPinLen, got.MaxPinLen)
	}
	if got.TotalPublicMemory != Unavailable || got.FreePublicMemory != Unavailable {
		t.Errorf("public memory %d/%d, want unavailable (SoftHSM does not say)", got.TotalPublicMemory, got.FreePublicMemory)
	}
	if got.HardwareVersion != softhsm.HardwareVersion {
		t.Errorf("hardware version %v, want the first member's", got.HardwareVersion)
	}
	both := Merge([]pkcs11.TokenInfo{limited, limited})
	if both.TotalPublicMemory != 2000 || both.FreePublicMemory != 200 {
		t.Errorf("public memory %d/%d, want the sums 2000/200", both.TotalPublicMemory, both.FreePublicMemory)
	}
	if u := Unanswered(); u.FreePrivateMemory != Unavailable || u.Flags&pkcs11.CKF_TOKEN_INITIALIZED == 0 {
		t.Errorf("Unanswered: free memory %d, flags %#x", u.FreePrivateMemory, u.Flags)
	}
}

// Mechanisms keeps the primary's order and drops what any member lacks;
// MechanismInfo is what every member can do.
func TestMechanisms(t *testing.T) {
	primary := []uint{pkcs11.CKM_ECDSA, pkcs11.CKM_RSA_PKCS, pkcs11.CKM_AES_KEY_WRAP_PAD, pkcs11.CKM_SHA256}
	other := []uint{pkcs11.CKM_SHA256, pkcs11.CKM_RSA_PKCS, pkcs11.CKM_ECDSA}
	got := Mechanisms(primary, [][]uint{primary, other})
	if want := []uint{pkcs11.CKM_ECDSA, pkcs11.CKM_RSA_PKCS, pkcs11.CKM_SHA256}; !slices.Equal(got, want) {
		t.Errorf("Mechanisms = %#x, want %#x", got, want)
	}
	if primary[2] != pkcs11.CKM_AES_KEY_WRAP_PAD {
		t.Errorf("Mechanisms changed the primary's list")
	}
	mi := MechanismInfo([]pkcs11.MechanismInfo{
		{MinKeySize: 1024, MaxKeySize: 4096, Flags: pkcs11.CKF_SIGN | pkcs11.CKF_VERIFY | pkcs11.CKF_DECRYPT},
		{MinKeySize: 2048, MaxKeySize: 8192, Flags: pkcs11.CKF_SIGN | pkcs11.CKF_VERIFY},
	})
	if mi.MinKeySize != 2048 || mi.MaxKeySize != 4096 || mi.Flags != pkcs11.CKF_SIGN|pkcs11.CKF_VERIFY {
		t.Errorf("MechanismInfo = %+v, want 2048..4096 sign+verify", mi)
	}
}
