package sync

import (
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

func mechsOf(t *testing.T, s *slot.Slot) []uint {
	t.Helper()
	ms, err := s.Mechanisms(testContext(t))
	if err != nil {
		t.Fatalf("mechanisms of %s: %v", s.Name(), err)
	}
	return ms
}

func prove(t *testing.T, src, dst *slot.Slot) PairWays {
	t.Helper()
	p, err := ProvePair(testContext(t), src, dst, mechsOf(t, src), mechsOf(t, dst))
	if err != nil {
		t.Fatalf("ProvePair(%s -> %s): %v", src.Name(), dst.Name(), err)
	}
	t.Logf("%s -> %s: ways %v; failed %v", src.Name(), dst.Name(), p.Ways, p.Failed)
	return p
}

var (
	padWay = Way{pkcs11.CKM_AES_KEY_WRAP_PAD, pkcs11.CKM_AES_KEY_WRAP_PAD}
	// SoftHSM's _PAD is NSS's KWP, and the other way round.
	padToKWP = Way{pkcs11.CKM_AES_KEY_WRAP_PAD, CKMAESKeyWrapKWP}
)

// Between two SoftHSM tokens CKM_AES_KEY_WRAP_PAD carries both classes.
func TestProvePairSoftHSM(t *testing.T) {
	t.Parallel()
	toks := testhsm.Take(t, 2)
	a, b := openSlot(t, toks[0], nil), openSlot(t, toks[1], nil)
	p := prove(t, a, b)
	for _, class := range []uint{pkcs11.CKO_SECRET_KEY, pkcs11.CKO_PRIVATE_KEY} {
		if !p.Proven(class, padWay) {
			t.Errorf("SoftHSM -> SoftHSM: %s by %v not proven: %v", object.ClassName(class), padWay, p.Failed)
		}
		if best, _ := p.Best(class); best != padWay {
			t.Errorf("SoftHSM -> SoftHSM: best way for %s = %v, want %v", object.ClassName(class), best, padWay)
		}
	}
}

// SoftHSM and NSS both name CKM_AES_KEY_WRAP_PAD and mean two things by
// it: trusted by name, a key would arrive as garbage or not at all. The
// round trip proves that it carries no key between them either way, and
// finds the crossings that do: SoftHSM's _PAD is NSS's KWP (RFC 5649), and
// NSS's _PAD is PKCS#7 padding then RFC 3394, which SoftHSM's
// CKM_AES_KEY_WRAP unwraps (the DER of a private key ignores the padding).
// NSS 3.87 unwraps no EC private key (CKR_TEMPLATE_INCOMPLETE): no way
// carries one to it, and the pair says so.
func TestProvePairSoftHSMAndNSS(t *testing.T) {
	soft := openSlot(t, testhsm.Take(t, 1)[0], nil)
	nss := openSlot(t, testhsm.NSS(t, "nss-pair"), nil)
	secret, private := uint(pkcs11.CKO_SECRET_KEY), uint(pkcs11.CKO_PRIVATE_KEY)

	toNSS := prove(t, soft, nss)
	fromNSS := prove(t, nss, soft)
	for _, p := range []PairWays{toNSS, fromNSS} {
		for _, class := range []uint{secret, private} {
			if p.Proven(class, padWay) {
				t.Errorf("%s -> %s: %s by %v proven, but the two read it differently", p.Source, p.Target, object.ClassName(class), padWay)
			}
		}
	}
	if !toNSS.Proven(secret, padToKWP) {
		t.Errorf("SoftHSM -> NSS: secret keys by %v not proven: %v", padToKWP, toNSS.Failed)
	}
	if w, ok := toNSS.Best(private); ok {
		t.Errorf("SoftHSM -> NSS: private keys proven by %v, but NSS unwraps no EC private key", w)
	}
	nssPad := Way{pkcs11.CKM_AES_KEY_WRAP_PAD, pkcs11.CKM_AES_KEY_WRAP}
	if !fromNSS.Proven(private, nssPad) {
		t.Errorf("NSS -> SoftHSM: private keys by %v not proven: %v", nssPad, fromNSS.Failed)
	}
	// NSS with itself: its own name agrees with itself.
	if p := prove(t, nss, nss); !p.Proven(secret, padWay) {
		t.Errorf("NSS -> NSS: secret keys by %v not proven: %v", padWay, p.Failed)
	}
}
