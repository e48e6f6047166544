package sync

import (
	"crypto/sha256"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/miekg/pkcs11"
)

// tpm2-pkcs11 on a software TPM signs with keys made on it, and can wrap
// nothing: the probe finds it offers no CKM_AES_KEY_WRAP_PAD, so it could
// hold no private or secret key made through a group of two or more (a
// sign-only member), and a wrap on it is refused.
func TestTPMIsSignOnly(t *testing.T) {
	tok := testhsm.TPM(t, "tpm-sign")
	s := openSlot(t, tok, nil)
	ctx := testContext(t)
	if got := s.Token(); got.Label != "tpm-sign" {
		t.Fatalf("token %+v, want tpm-sign", got)
	}
	mechs := mechsOf(t, s)
	c, err := ProbeWrap(ctx, s, mechs)
	if err != nil {
		t.Fatalf("ProbeWrap: %v", err)
	}
	if c.Mechanism {
		t.Fatalf("tpm2-pkcs11 offers %s", domainkey.MechanismName(domainkey.Mechanism))
	}
	if un := c.Unholdable(); len(un) != 2 {
		t.Fatalf("Unholdable = %v, want private and secret keys", un)
	}
	pub, priv, err := s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, oidP256Params), pkcs11.NewAttribute(pkcs11.CKA_VERIFY, true),
			pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true), pkcs11.NewAttribute(pkcs11.CKA_LABEL, "tpm-key")},
		[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_SIGN, true), pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
			pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true), pkcs11.NewAttribute(pkcs11.CKA_LABEL, "tpm-key")})
	if err != nil {
		t.Fatalf("GenerateKeyPair on the TPM: %v", err)
	}
	digest := sha256.Sum256([]byte("signed in a TPM"))
	sig, err := s.Sign(ctx, pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil), priv, digest[:])
	if err != nil {
		t.Fatalf("Sign on the TPM: %v", err)
	}
	if err := s.Verify(ctx, pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil), pub, digest[:], sig); err != nil {
		t.Fatalf("Verify on the TPM: %v", err)
	}
	if _, err := s.WrapKey(ctx, kwp, priv, priv); err == nil {
		t.Fatal("the TPM wrapped a key")
	}
}
