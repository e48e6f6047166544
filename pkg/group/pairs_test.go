package group

import (
	"bytes"
	"crypto/sha256"
	"slices"
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
// proves which ways carry which keys, and replication uses them: an AES
// key and an RSA key pair generated through the group are on both
// members, and each copy is the key (what one encrypts the other
// decrypts; what one signs the other's public key verifies). No way
// carries an EC private key into NSS: the group names the pair in an
// event and in CannotHold, does not offer EC generation, and refuses one
// before anything is written, blaming no member.
func TestTwoMakesReplicateByProvenWays(t *testing.T) {
	soft := testhsm.Take(t, 1)[0]
	nss := testhsm.NSS(t, "nss-pairs")
	f := setup(t, setupOpts{toks: []testhsm.Token{soft, nss}, noDomain: true})
	ctx := testContext(t)

	found := false
	for _, e := range f.events.byKind(KeysUnholdable, nss.Name) {
		msg := e.Err.Error()
		if strings.Contains(msg, "no proven way carries private keys from member "+soft.Name+" to member "+nss.Name) {
			found = true
		}
		if strings.Contains(msg, "secret key") || strings.Contains(msg, "RSA private key") {
			t.Errorf("a keys_unholdable event says a kind travels that a proven way carries: %v", e.Err)
		}
	}
	if !found {
		t.Errorf("no keys_unholdable event names EC private keys from %s to %s: %v", soft.Name, nss.Name, f.events.byKind(KeysUnholdable, nss.Name))
	}
	if got := strings.Join(f.g.CannotHold(nss.Name), "; "); !strings.Contains(got, "private keys from "+soft.Name+" (no proven way)") || strings.Contains(got, "secret") {
		t.Errorf("CannotHold(%s) = %q, want private keys from %s and no secret keys", nss.Name, got, soft.Name)
	}
	mechs, err := f.g.Mechanisms(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for m, want := range map[uint]bool{pkcs11.CKM_AES_KEY_GEN: true, pkcs11.CKM_RSA_PKCS_KEY_PAIR_GEN: true, pkcs11.CKM_EC_KEY_PAIR_GEN: false} {
		if got := slices.Contains(mechs, m); got != want {
			t.Errorf("the virtual slot offers mechanism 0x%x: %v, want %v", m, got, want)
		}
	}

	s := openSession(t, f.g)
	if _, err := s.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), []*pkcs11.Attribute{
		attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_VALUE_LEN, 32), attr(pkcs11.CKA_LABEL, "aes-pair"),
		attr(pkcs11.CKA_ENCRYPT, true), attr(pkcs11.CKA_DECRYPT, true), attr(pkcs11.CKA_EXTRACTABLE, true)}); err != nil {
		t.Fatalf("AES generation through a SoftHSM+NSS group: %v", err)
	}
	if _, _, err := s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_MODULUS_BITS, 2048), attr(pkcs11.CKA_PUBLIC_EXPONENT, []byte{1, 0, 1}),
			attr(pkcs11.CKA_VERIFY, true), attr(pkcs11.CKA_LABEL, "rsa-pair")},
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SIGN, true),
			attr(pkcs11.CKA_EXTRACTABLE, true), attr(pkcs11.CKA_LABEL, "rsa-pair")}); err != nil {
		t.Fatalf("RSA generation through a SoftHSM+NSS group: %v", err)
	}
	direct := map[string]*slot.Slot{soft.Name: openDirect(t, soft), nss.Name: openDirect(t, nss)}
	keyOf := func(name, label string, class uint) pkcs11.ObjectHandle {
		t.Helper()
		hs, err := direct[name].FindObjects(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_CLASS, class)})
		if err != nil || len(hs) != 1 {
			t.Fatalf("%s holds %d %s objects of class %d (%v), want 1", name, len(hs), label, class, err)
		}
		return hs[0]
	}
	iv := bytes.Repeat([]byte{9}, 16)
	msg := []byte("a message of 32 bytes, two block")
	cbc := pkcs11.NewMechanism(pkcs11.CKM_AES_CBC, iv)
	sha := pkcs11.NewMechanism(pkcs11.CKM_SHA256_RSA_PKCS, nil)
	for _, pair := range [][2]string{{soft.Name, nss.Name}, {nss.Name, soft.Name}} {
		a, b := direct[pair[0]], direct[pair[1]]
		ct, err := a.Encrypt(ctx, cbc, keyOf(pair[0], "aes-pair", pkcs11.CKO_SECRET_KEY), msg)
		if err != nil {
			t.Fatalf("encrypt on %s: %v", pair[0], err)
		}
		if pt, err := b.Decrypt(ctx, cbc, keyOf(pair[1], "aes-pair", pkcs11.CKO_SECRET_KEY), ct); err != nil || !bytes.Equal(pt, msg) {
			t.Errorf("%s's copy of the AES key decrypts what %s encrypted as %q, %v", pair[1], pair[0], pt, err)
		}
		sig, err := a.Sign(ctx, sha, keyOf(pair[0], "rsa-pair", pkcs11.CKO_PRIVATE_KEY), msg)
		if err != nil {
			t.Fatalf("sign on %s: %v", pair[0], err)
		}
		if err := b.Verify(ctx, sha, keyOf(pair[1], "rsa-pair", pkcs11.CKO_PUBLIC_KEY), msg, sig); err != nil {
			t.Errorf("%s's copy of the RSA public key does not verify %s's signature: %v", pair[1], pair[0], err)
		}
	}

	_, _, err = s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_EC_PARAMS, p256), attr(pkcs11.CKA_LABEL, "ec-pair")},
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_LABEL, "ec-pair")})
	if code := CodeOf(err); code != pkcs11.CKR_MECHANISM_INVALID {
		t.Fatalf("EC generation through a SoftHSM+NSS group: %v (0x%x), want CKR_MECHANISM_INVALID", err, code)
	}
	if !strings.Contains(err.Error(), "no proven way carries private keys") {
		t.Errorf("the refusal does not say why: %v", err)
	}
	for _, tok := range []testhsm.Token{soft, nss} {
		if n := len(findDirect(t, direct[tok.Name], "ec-pair")); n != 0 {
			t.Errorf("%s holds %d ec-pair objects after the refusal, want 0", tok.Name, n)
		}
		if m, _ := f.g.Member(tok.Name); memberState(f.g, tok.Name) != member.Active {
			t.Errorf("member %s is %v after the copies, want active", m.Name(), memberState(f.g, tok.Name))
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

// otherMake is a fresh token of the named make other than SoftHSM: NSS
// softokn in process, the opencryptoki soft token served by hsmserve (with
// its own PIN), tpm2-pkcs11 on swtpm in process.
func otherMake(t testing.TB, make string) testhsm.Token {
	t.Helper()
	switch make {
	case "nss":
		return testhsm.NSS(t, "nss-bench")
	case "opencryptoki":
		tok := testhsm.ServeOCK(t, "ock-bench").Token()
		tok.UserPIN = testhsm.OCKUserPIN
		return tok
	case "tpm":
		return testhsm.TPM(t, "tpm-bench")
	}
	t.Fatalf("no make %q", make)
	return testhsm.Token{}
}

// sha256DigestInfo prefixes a SHA-256 digest for CKM_RSA_PKCS (PKCS #1
// v1.5 signing of a digest made by the caller).
var sha256DigestInfo = []byte{0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05, 0x00, 0x04, 0x20}

// BenchmarkSignTwoMakes compares signing on a bare SoftHSM token, on a
// bare token of another make, and through a group of the two (round-robin,
// a key provisioned on both out of band), for each other make: ECDSA
// P-256, or RSA-2048 PKCS #1 v1.5 with a make that holds no EC key (the
// opencryptoki soft token). tpm2-pkcs11 takes no private key from outside
// (C_CreateObject makes RSA public keys and data objects only), so no key
// is on both: the bare TPM signs with a key made on it, and the group
// with the SoftHSM member's key, which the sign-only TPM member is never
// sent, and with the TPM's key, which only the TPM member is sent.
func BenchmarkSignTwoMakes(b *testing.B) {
	for _, c := range []struct {
		make string
		rsa  bool
	}{{"nss", false}, {"opencryptoki", true}, {"tpm", false}} {
		b.Run("make="+c.make, func(b *testing.B) {
			toks := []testhsm.Token{testhsm.Take(b, 1)[0], otherMake(b, c.make)}
			digest := sha256.Sum256([]byte("bench"))
			mech, input := ecdsaMech, digest[:]
			labels := []string{"bench-two", "bench-two"} // the key's on each token; the group's is labels[0]
			ctx := testContext(b)
			switch {
			case c.rsa:
				importRSA(b, toks, "bench-two")
				mech, input = pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS, nil), append(slices.Clip(sha256DigestInfo), digest[:]...)
			case c.make == "tpm":
				importEC(b, toks[:1], "bench-two")
				labels[1] = "bench-tpm"
				if _, _, err := openDirect(b, toks[1]).GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
					[]*pkcs11.Attribute{attr(pkcs11.CKA_EC_PARAMS, p256), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_VERIFY, true), attr(pkcs11.CKA_LABEL, labels[1])},
					[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_LABEL, labels[1])}); err != nil {
					b.Fatalf("EC key pair on the TPM: %v", err)
				}
			default:
				importEC(b, toks, "bench-two")
			}
			f := setup(b, setupOpts{toks: toks, noDomain: true, policy: config.PolicyRoundRobin})
			privateKey := func(label string) []*pkcs11.Attribute {
				return []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY), attr(pkcs11.CKA_LABEL, label)}
			}
			hs, err := f.g.Find(ctx, privateKey(labels[0]))
			if err != nil || len(hs) != 1 {
				b.Fatalf("find the key through the group: %v, %d found", err, len(hs))
			}
			for i, tok := range toks {
				d := openDirect(b, tok)
				ks, err := d.FindObjects(ctx, privateKey(labels[i]))
				if err != nil || len(ks) != 1 {
					b.Fatalf("find the key on %s: %v, %d found", tok.Name, err, len(ks))
				}
				kind := "softhsm"
				if i > 0 {
					kind = c.make
				}
				b.Run("mode=bare-"+kind, func(b *testing.B) {
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							if _, err := d.Sign(ctx, mech, ks[0], input); err != nil {
								b.Error(err)
								return
							}
						}
					})
				})
			}
			groupKeys := map[string]ObjectHandle{"": hs[0]}
			if labels[1] != labels[0] {
				// The key only the TPM holds, which the group serves from it.
				ths, err := f.g.Find(ctx, privateKey(labels[1]))
				if err != nil || len(ths) != 1 {
					b.Fatalf("find the TPM's key through the group: %v, %d found", err, len(ths))
				}
				groupKeys["-tpm-key"] = ths[0]
			}
			for suffix, h := range groupKeys {
				b.Run("mode=group-softhsm+"+c.make+suffix, func(b *testing.B) {
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							if _, err := f.g.Sign(ctx, mech, h, input); err != nil {
								b.Error(err)
								return
							}
						}
					})
				})
			}
		})
	}
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

// A sign-only member serves the keys it holds: a key pair made on the
// TPM member alone (it can be sent none, nor send one) is found through
// the group beside a SoftHSM member, signed with every time, and the
// SoftHSM member, which lacks it, is never sent a signature with it.
func TestSignOnlyMemberServesTheKeysItHolds(t *testing.T) {
	soft := testhsm.Take(t, 1)[0]
	tpm := testhsm.TPM(t, "tpm-member")
	ctx := testContext(t)
	if _, _, err := openDirect(t, tpm).GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{attr(pkcs11.CKA_EC_PARAMS, p256), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_VERIFY, true), attr(pkcs11.CKA_LABEL, "tpm-only")},
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_LABEL, "tpm-only")}); err != nil {
		t.Fatalf("EC key pair on the TPM: %v", err)
	}
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{toks: []testhsm.Token{soft, tpm}, noDomain: true, policy: config.PolicyRoundRobin, interceptor: faults})
	pubs, err := f.g.Find(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_PUBLIC_KEY), attr(pkcs11.CKA_LABEL, "tpm-only")})
	if err != nil || len(pubs) != 1 {
		t.Fatalf("find the TPM's public key through the group: %d found, %v", len(pubs), err)
	}
	signer := ecKeyOf(t, f.g, "tpm-only", ecPublic(t, f.g, pubs[0]))
	for _, op := range []slot.Op{slot.OpSign, slot.OpSignInit} {
		faults.Fail(soft.Name, op, errDevice)
	}
	res := signLoad(t, signer, 100, 2, nil)
	reportErrs(t, res.errs)
	if res.sigs != 100 {
		t.Errorf("%d good signatures, want 100", res.sigs)
	}
	if st := memberState(f.g, soft.Name); st != member.Active {
		t.Errorf("the SoftHSM member is %v: it was sent a signature with a key it lacks", st)
	}
}

// A group of one TPM member makes key pairs as the bare TPM does: the
// group asks no CKA_EXTRACTABLE=true of a token that wraps nothing (the
// TPM refuses it with CKR_ATTRIBUTE_VALUE_INVALID), and the key it makes
// signs through the group and reads unextractable, as on the bare token.
func TestTPMGroupGeneratesKeys(t *testing.T) {
	tpm := testhsm.TPM(t, "tpm-member")
	f := setup(t, setupOpts{toks: []testhsm.Token{tpm}, noDomain: true})
	signer := ecSigner(t, f.g, "made-on-tpm")
	res := signLoad(t, signer, 20, 2, nil)
	reportErrs(t, res.errs)
	if res.sigs != 20 {
		t.Errorf("%d good signatures, want 20", res.sigs)
	}
	attrs, err := f.g.GetAttributes(testContext(t), signer.h, []uint{pkcs11.CKA_EXTRACTABLE})
	if err != nil || len(attrs) != 1 || len(attrs[0].Value) != 1 || attrs[0].Value[0] != 0 {
		t.Errorf("CKA_EXTRACTABLE of the key made through the group: %v, %v; want false", attrs, err)
	}
	if err := openSession(t, f.g).DestroyObject(testContext(t), signer.h); err != nil {
		t.Errorf("destroy the key made through the group: %v", err)
	}
}
