package opstate

import (
	"testing"

	"github.com/miekg/pkcs11"
)

// A proof holds while the change count stays and no Forget came; an Init
// with a mechanism parameter, given as bytes or built by miekg from a Go
// value, is never provable.
func TestProofs(t *testing.T) {
	var p Proofs[string]
	if p.Proven("sign", 0) {
		t.Fatal("proven before any Record")
	}
	p.Record("sign", 7)
	if !p.Proven("sign", 7) || p.Proven("sign", 8) || p.Proven("verify", 7) {
		t.Fatal("a proof must hold for its own Init at its own change count only")
	}
	p.Forget()
	if p.Proven("sign", 7) {
		t.Fatal("a proof survived Forget (a login or logout)")
	}
	if !Provable(pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil)) || Provable(nil) {
		t.Error("CKM_ECDSA without parameter must be provable, no mechanism not")
	}
	if Provable(pkcs11.NewMechanism(pkcs11.CKM_SHA256_HMAC_GENERAL, []byte{16})) {
		t.Error("a mechanism with a parameter was taken for provable")
	}
	if Provable(pkcs11.NewMechanism(pkcs11.CKM_AES_GCM, pkcs11.NewGCMParams(make([]byte, 12), nil, 128))) {
		t.Error("a GCM mechanism (parameter built from a Go value) was taken for provable")
	}
}
