package group

import (
	"crypto/sha256"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
)

// A group of a SoftHSM and an NSS member: both offer
// CKM_AES_KEY_WRAP_PAD, and they mean two things by it (SoftHSM RFC 5649,
// NSS PKCS#7 padding then RFC 3394). Trusted by name, replication would
// wrap on one and unwrap garbage or nothing on the other. The round trip
// proves the pair carries no key that way, so the group names the pair in
// events, offers no generation of secret or private keys, and refuses one
// before anything is written, blaming no member; it still signs with keys
// the members hold and makes what travels by attributes.
func TestPairWithoutACommonWay(t *testing.T) {
	soft := testhsm.Take(t, 1)[0]
	nss := testhsm.NSS(t, "nss-pairs")
	f := setup(t, setupOpts{toks: []testhsm.Token{soft, nss}, noDomain: true})
	ctx := testContext(t)

	for _, pair := range [][2]string{{soft.Name, nss.Name}, {nss.Name, soft.Name}} {
		found := false
		for _, e := range f.events.byKind(KeysUnholdable, pair[1]) {
			msg := e.Err.Error()
			if strings.Contains(msg, "from member "+pair[0]+" to member "+pair[1]) && strings.Contains(msg, "CKM_AES_KEY_WRAP_PAD does not carry them") {
				found = true
			}
		}
		if !found {
			t.Errorf("no keys_unholdable event names the pair %s -> %s: %v", pair[0], pair[1], f.events.byKind(KeysUnholdable, pair[1]))
		}
	}
	// listgroups' cannotHold names the pair on the receiving member.
	if got := strings.Join(f.g.CannotHold(nss.Name), "; "); !strings.Contains(got, "secret keys from "+soft.Name+" (no proven way)") {
		t.Errorf("CannotHold(%s) = %q, want it to name secret keys from %s", nss.Name, got, soft.Name)
	}
	mechs, err := f.g.Mechanisms(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []uint{pkcs11.CKM_AES_KEY_GEN, pkcs11.CKM_EC_KEY_PAIR_GEN} {
		for _, have := range mechs {
			if have == m {
				t.Errorf("the virtual slot offers mechanism 0x%x, whose keys no proven way carries between the members", m)
			}
		}
	}
	s := openSession(t, f.g)
	_, err = s.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), []*pkcs11.Attribute{
		attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_VALUE_LEN, 16), attr(pkcs11.CKA_LABEL, "aes-pair")})
	if code := CodeOf(err); code != pkcs11.CKR_MECHANISM_INVALID {
		t.Fatalf("AES generation through a SoftHSM+NSS group: %v (0x%x), want CKR_MECHANISM_INVALID", err, code)
	}
	if !strings.Contains(err.Error(), "no proven way carries secret keys") {
		t.Errorf("the refusal does not say why: %v", err)
	}
	for _, tok := range []testhsm.Token{soft, nss} {
		if n := len(findDirect(t, openDirect(t, tok), "aes-pair")); n != 0 {
			t.Errorf("%s holds %d aes-pair objects after the refusal, want 0", tok.Name, n)
		}
	}
}

// A group of two makes serves the keys both members hold (provisioned out
// of band, as an operator does for keys that cannot travel between them):
// work is spread over both, every signature verifies, and when the
// SoftHSM member fails under load the NSS member takes the rest, with no
// failed signature.
func TestTwoMakesSignWithAKeyBothHold(t *testing.T) {
	soft := testhsm.Take(t, 1)[0]
	nss := testhsm.NSS(t, "nss-signs")
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{toks: []testhsm.Token{soft, nss}, noDomain: true, policy: config.PolicyRoundRobin, interceptor: faults})
	k := importEC(t, f.toks, "both-makes")
	signer := ecKeyOf(t, f.g, "both-makes", &k.PublicKey)
	res := signLoad(t, signer, 400, 4, func(done int64) {
		if done == 200 {
			faults.FailAll(soft.Name, errDevice)
		}
	})
	reportErrs(t, res.errs)
	if res.sigs != 400 {
		t.Errorf("%d good signatures, want 400", res.sigs)
	}
	for _, name := range []string{soft.Name, nss.Name} {
		m, _ := f.g.Member(name)
		if m.Snapshot().Ops == 0 {
			t.Errorf("member %s took no work", name)
		}
	}
	if st := memberState(f.g, soft.Name); st != member.Failed {
		t.Errorf("the failed SoftHSM member is %v, want failed", st)
	}
}

// BenchmarkSignTwoMakes compares ECDSA P-256 signing on a bare SoftHSM
// token, on a bare NSS token, and through a group of the two (round-robin,
// a key provisioned on both out of band).
func BenchmarkSignTwoMakes(b *testing.B) {
	soft := testhsm.Take(b, 1)[0]
	nss := testhsm.NSS(b, "nss-bench")
	f := setup(b, setupOpts{toks: []testhsm.Token{soft, nss}, noDomain: true, policy: config.PolicyRoundRobin})
	importEC(b, f.toks, "bench-two")
	hs, err := f.g.Find(testContext(b), []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY), attr(pkcs11.CKA_LABEL, "bench-two")})
	if err != nil || len(hs) != 1 {
		b.Fatalf("find the key through the group: %v, %d found", err, len(hs))
	}
	digest := sha256.Sum256([]byte("bench"))
	ctx := testContext(b)
	for _, tok := range []testhsm.Token{soft, nss} {
		d := openDirect(b, tok)
		ks := findDirect(b, d, "bench-two")
		var key pkcs11.ObjectHandle
		for _, h := range ks {
			a, err := d.GetAttributes(ctx, h, []uint{pkcs11.CKA_CLASS})
			if err == nil && len(a) == 1 && a[0].Value != nil && a[0].Value[0] == pkcs11.CKO_PRIVATE_KEY {
				key = h
			}
		}
		if key == 0 {
			b.Fatalf("no private key bench-two on %s", tok.Name)
		}
		kind := "softhsm"
		if tok.Module == testhsm.NSSModule {
			kind = "nss"
		}
		b.Run("mode=bare-"+kind, func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := d.Sign(ctx, ecdsaMech, key, digest[:]); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
	b.Run("mode=group-softhsm+nss", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := f.g.Sign(ctx, ecdsaMech, hs[0], digest[:]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// A sign-only member (tpm2-pkcs11 on a software TPM: no wrap at all)
// beside a SoftHSM member: a key only the SoftHSM member holds is signed
// with every time, and the TPM member is never sent a signature with it
// (any signing call reaching it fails as a device error, which would fail
// the member).
func TestSignOnlyMemberNeverGetsAKeyItLacks(t *testing.T) {
	soft := testhsm.Take(t, 1)[0]
	tpm := testhsm.TPM(t, "tpm-member")
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{toks: []testhsm.Token{soft, tpm}, noDomain: true, policy: config.PolicyRoundRobin, interceptor: faults})
	k := importEC(t, []testhsm.Token{soft}, "soft-only")
	signer := ecKeyOf(t, f.g, "soft-only", &k.PublicKey)
	for _, op := range []slot.Op{slot.OpSign, slot.OpSignInit} {
		faults.Fail(tpm.Name, op, errDevice)
	}
	res := signLoad(t, signer, 100, 2, nil)
	reportErrs(t, res.errs)
	if res.sigs != 100 {
		t.Errorf("%d good signatures, want 100", res.sigs)
	}
	if st := memberState(f.g, tpm.Name); st != member.Active {
		t.Errorf("the TPM member is %v: it was sent a signature with a key it lacks", st)
	}
}
