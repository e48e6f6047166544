package slot_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdh"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"errors"
	"math/big"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/internal/testhsm/objrace"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/dispatch"
	"github.com/miekg/pkcs11"
)

func TestSignAndVerify(t *testing.T) {
	t.Parallel()
	eachDispatch(t, func(t *testing.T, d dispatch.Dispatch) {
		spec := specOf(testhsm.Take(t, 1)[0])
		spec.Dispatch = d
		testSignAndVerify(t, open(t, spec))
	})
}

func testSignAndVerify(t *testing.T, s *slot.Slot) {
	ctx := ctxT(t)
	if !s.LoggedIn() {
		t.Fatalf("LoggedIn() = false after Open with a PIN")
	}
	pub, priv := newECKey(t, s, "sig")
	msg := []byte("hello, token")
	sig, err := signDigest(ctx, s, priv, msg)
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	checkSig(t, ecPublic(t, s, pub), msg, sig)

	h := sha256.Sum256(msg)
	if err := s.Verify(ctx, ecdsaMech, pub, h[:], sig); err != nil {
		t.Fatalf("Verify of a good signature: %v", err)
	}
	sig[0] ^= 0xff
	err = s.Verify(ctx, ecdsaMech, pub, h[:], sig)
	if !errors.Is(err, pkcs11.Error(pkcs11.CKR_SIGNATURE_INVALID)) {
		t.Fatalf("Verify of a bad signature: %v, want CKR_SIGNATURE_INVALID", err)
	}
	if c := slot.ClassOf(err); c != slot.ClassRequest {
		t.Fatalf("ClassOf(bad signature) = %v, want request", c)
	}
	if st := s.Stats(); st.Discarded != 0 {
		t.Fatalf("a request error discarded a session: %+v", st)
	}
	// A key that is no key is the module's request error, on either path
	// (SoftHSM's C_SignInit answers CKR_OBJECT_HANDLE_INVALID).
	_, err = s.Sign(ctx, ecdsaMech, 0xdead, h[:])
	if !errors.Is(err, pkcs11.Error(pkcs11.CKR_OBJECT_HANDLE_INVALID)) || slot.ClassOf(err) != slot.ClassRequest {
		t.Fatalf("Sign with a bad key handle: %v, want CKR_OBJECT_HANDLE_INVALID (request)", err)
	}
	// The pooled session is still good after the failed C_SignInit.
	if _, err := signDigest(ctx, s, priv, msg); err != nil {
		t.Fatalf("Sign after a failed one: %v", err)
	}
}

// Mechanism parameters reach the module intact under either dispatch: a
// salt length the module did not get would not verify in Go.
func TestMechanismParameters(t *testing.T) {
	t.Parallel()
	eachDispatch(t, testMechanismParameters)
}

func testMechanismParameters(t *testing.T, d dispatch.Dispatch) {
	spec := specOf(testhsm.Take(t, 1)[0])
	spec.Dispatch = d
	s := open(t, spec)
	ctx := ctxT(t)
	pub, priv, rsaPub := newRSAKey(t, s)

	msg := []byte("salted")
	h := sha256.Sum256(msg)
	for _, salt := range []uint{0, 32, 64} {
		m := pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS_PSS, pkcs11.NewPSSParams(pkcs11.CKM_SHA256, pkcs11.CKG_MGF1_SHA256, salt))
		sig, err := s.Sign(ctx, m, priv, h[:])
		if err != nil {
			t.Fatalf("PSS sign, salt %d: %v", salt, err)
		}
		if err := rsa.VerifyPSS(rsaPub, crypto.SHA256, h[:], sig, &rsa.PSSOptions{SaltLength: int(salt)}); err != nil {
			t.Fatalf("PSS signature with salt %d does not verify in Go: %v", salt, err)
		}
		if err := s.Verify(ctx, m, pub, h[:], sig); err != nil {
			t.Fatalf("PSS verify, salt %d: %v", salt, err)
		}
	}
}

func TestGetAttributesPerAttributeStatus(t *testing.T) {
	t.Parallel()
	s := open(t, specOf(testhsm.Take(t, 1)[0]))
	ctx := ctxT(t)
	_, priv := newECKey(t, s, "attrs")

	// CKA_VALUE of a sensitive private key is sensitive; CKA_MODULUS is not
	// an attribute of an EC key; CKA_LABEL is readable.
	got, err := s.GetAttributes(ctx, priv, []uint{pkcs11.CKA_LABEL, pkcs11.CKA_VALUE, pkcs11.CKA_MODULUS, pkcs11.CKA_SIGN})
	if err != nil {
		t.Fatalf("GetAttributes: %v", err)
	}
	want := []struct {
		typ    uint
		status uint
		value  []byte
	}{
		{pkcs11.CKA_LABEL, pkcs11.CKR_OK, []byte("attrs")},
		{pkcs11.CKA_VALUE, pkcs11.CKR_ATTRIBUTE_SENSITIVE, nil},
		{pkcs11.CKA_MODULUS, pkcs11.CKR_ATTRIBUTE_TYPE_INVALID, nil},
		{pkcs11.CKA_SIGN, pkcs11.CKR_OK, []byte{1}},
	}
	for i, w := range want {
		g := got[i]
		if g.Type != w.typ || g.Status != w.status || !bytes.Equal(g.Value, w.value) {
			t.Errorf("attribute %d: got {type %#x status %#x value %x}, want {type %#x status %#x value %x}",
				i, g.Type, g.Status, g.Value, w.typ, w.status, w.value)
		}
	}

	// All readable: one call, all OK.
	got, err = s.GetAttributes(ctx, priv, []uint{pkcs11.CKA_LABEL, pkcs11.CKA_KEY_TYPE})
	if err != nil || got[0].Status != pkcs11.CKR_OK || string(got[0].Value) != "attrs" || got[1].Status != pkcs11.CKR_OK {
		t.Fatalf("GetAttributes of readable attributes: %+v, %v", got, err)
	}
	// A handle that does not exist fails the whole call, as a request error.
	_, err = s.GetAttributes(ctx, priv+1000, []uint{pkcs11.CKA_LABEL})
	if !errors.Is(err, pkcs11.Error(pkcs11.CKR_OBJECT_HANDLE_INVALID)) || slot.ClassOf(err) != slot.ClassRequest {
		t.Fatalf("GetAttributes of a bad handle: %v (class %v), want CKR_OBJECT_HANDLE_INVALID, request", err, slot.ClassOf(err))
	}
}

func TestMultiPartOnSession(t *testing.T) {
	t.Parallel()
	s := open(t, specOf(testhsm.Take(t, 1)[0]))
	ctx := ctxT(t)
	ss, err := s.OpenSession(ctx)
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	defer ss.Close()

	// A session AES key, a multi-part CBC-PAD encryption, a single-part
	// decryption on the same session.
	key, err := ss.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false),
		pkcs11.NewAttribute(pkcs11.CKA_VALUE_LEN, 32),
		pkcs11.NewAttribute(pkcs11.CKA_ENCRYPT, true),
		pkcs11.NewAttribute(pkcs11.CKA_DECRYPT, true),
	})
	if err != nil {
		t.Fatalf("GenerateKey: %v", err)
	}
	iv := bytes.Repeat([]byte{7}, 16)
	mech := pkcs11.NewMechanism(pkcs11.CKM_AES_CBC_PAD, iv)
	plain := bytes.Repeat([]byte("0123456789abcdef"), 5)
	if err := ss.Init(ctx, slot.KindEncrypt, mech, key); err != nil {
		t.Fatalf("EncryptInit: %v", err)
	}
	var ct []byte
	for _, part := range [][]byte{plain[:7], plain[7:40], plain[40:]} {
		out, err := ss.Update(ctx, slot.KindEncrypt, part)
		if err != nil {
			t.Fatalf("EncryptUpdate: %v", err)
		}
		ct = append(ct, out...)
	}
	last, err := ss.Final(ctx, slot.KindEncrypt, nil)
	if err != nil {
		t.Fatalf("EncryptFinal: %v", err)
	}
	ct = append(ct, last...)
	pt, err := ss.Decrypt(ctx, mech, key, ct)
	if err != nil {
		t.Fatalf("Decrypt: %v", err)
	}
	if !bytes.Equal(pt, plain) {
		t.Fatalf("multi-part encryption then decryption gave %q, want %q", pt, plain)
	}

	// Multi-part decryption too.
	if err := ss.Init(ctx, slot.KindDecrypt, mech, key); err != nil {
		t.Fatalf("DecryptInit: %v", err)
	}
	p1, err := ss.Update(ctx, slot.KindDecrypt, ct[:32])
	if err != nil {
		t.Fatalf("DecryptUpdate: %v", err)
	}
	p2, err := ss.Update(ctx, slot.KindDecrypt, ct[32:])
	if err != nil {
		t.Fatalf("DecryptUpdate: %v", err)
	}
	p3, err := ss.Final(ctx, slot.KindDecrypt, nil)
	if err != nil {
		t.Fatalf("DecryptFinal: %v", err)
	}
	if got := append(append(p1, p2...), p3...); !bytes.Equal(got, plain) {
		t.Fatalf("multi-part decryption gave %q, want %q", got, plain)
	}

	// Multi-part digest equals Go's SHA-256.
	if err := ss.Init(ctx, slot.KindDigest, pkcs11.NewMechanism(pkcs11.CKM_SHA256, nil), 0); err != nil {
		t.Fatalf("DigestInit: %v", err)
	}
	for _, part := range [][]byte{plain[:10], plain[10:]} {
		if _, err := ss.Update(ctx, slot.KindDigest, part); err != nil {
			t.Fatalf("DigestUpdate: %v", err)
		}
	}
	d, err := ss.Final(ctx, slot.KindDigest, nil)
	if err != nil {
		t.Fatalf("DigestFinal: %v", err)
	}
	if want := sha256.Sum256(plain); !bytes.Equal(d, want[:]) {
		t.Fatalf("DigestFinal = %x, want %x", d, want)
	}

	// Multi-part HMAC-SHA256 equals the single-part one, and verifies
	// multi-part.
	mac, err := ss.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_GENERIC_SECRET_KEY_GEN, nil), []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false),
		pkcs11.NewAttribute(pkcs11.CKA_VALUE_LEN, 32),
		pkcs11.NewAttribute(pkcs11.CKA_SIGN, true),
		pkcs11.NewAttribute(pkcs11.CKA_VERIFY, true),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, "mp"),
	})
	if err != nil {
		t.Fatalf("GenerateKey(generic secret): %v", err)
	}
	sm := pkcs11.NewMechanism(pkcs11.CKM_SHA256_HMAC, nil)
	if err := ss.Init(ctx, slot.KindSign, sm, mac); err != nil {
		t.Fatalf("SignInit: %v", err)
	}
	if _, err := ss.Update(ctx, slot.KindSign, plain[:33]); err != nil {
		t.Fatalf("SignUpdate: %v", err)
	}
	if _, err := ss.Update(ctx, slot.KindSign, plain[33:]); err != nil {
		t.Fatalf("SignUpdate: %v", err)
	}
	sig, err := ss.Final(ctx, slot.KindSign, nil)
	if err != nil {
		t.Fatalf("SignFinal: %v", err)
	}
	one, err := ss.Sign(ctx, sm, mac, plain)
	if err != nil || !bytes.Equal(one, sig) {
		t.Fatalf("single-part HMAC %x (%v) differs from multi-part %x", one, err, sig)
	}
	if err := ss.Init(ctx, slot.KindVerify, sm, mac); err != nil {
		t.Fatalf("VerifyInit: %v", err)
	}
	if _, err := ss.Update(ctx, slot.KindVerify, plain); err != nil {
		t.Fatalf("VerifyUpdate: %v", err)
	}
	if _, err := ss.Final(ctx, slot.KindVerify, sig); err != nil {
		t.Fatalf("VerifyFinal: %v", err)
	}

	// Session objects are visible on their session only, and go with it.
	found, err := ss.FindObjects(ctx, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_LABEL, "mp")})
	if err != nil || len(found) != 1 {
		t.Fatalf("FindObjects of the session key on its session: %v, %v", found, err)
	}
	if err := ss.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	found, err = s.FindObjects(ctx, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_LABEL, "mp")})
	if err != nil || len(found) != 0 {
		t.Fatalf("session objects outlived their session: %v, %v", found, err)
	}
	if _, err := ss.Digest(ctx, pkcs11.NewMechanism(pkcs11.CKM_SHA256, nil), plain); !errors.Is(err, slot.ErrClosed) {
		t.Fatalf("call on a closed Session: %v, want ErrClosed", err)
	}
}

func TestObjectLifecycle(t *testing.T) {
	t.Parallel()
	s := open(t, specOf(testhsm.Take(t, 1)[0]))
	ctx := ctxT(t)
	h, err := s.CreateObject(ctx, []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_DATA),
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, "data-1"),
		pkcs11.NewAttribute(pkcs11.CKA_VALUE, []byte("payload")),
	})
	if err != nil {
		t.Fatalf("CreateObject: %v", err)
	}
	if err := s.SetAttributes(ctx, h, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_LABEL, "data-2")}); err != nil {
		t.Fatalf("SetAttributes: %v", err)
	}
	c, err := s.CopyObject(ctx, h, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_LABEL, "data-3")})
	if err != nil {
		t.Fatalf("CopyObject: %v", err)
	}
	if got := findOne(t, s, pkcs11.CKO_DATA, "data-2"); got != h {
		t.Fatalf("renamed object found as %d, want %d", got, h)
	}
	if got := findOne(t, s, pkcs11.CKO_DATA, "data-3"); got != c {
		t.Fatalf("copy found as %d, want %d", got, c)
	}
	attrs, err := s.GetAttributes(ctx, c, []uint{pkcs11.CKA_VALUE})
	if err != nil || string(attrs[0].Value) != "payload" {
		t.Fatalf("copy's value: %+v, %v", attrs, err)
	}
	for _, x := range []pkcs11.ObjectHandle{h, c} {
		if err := s.DestroyObject(ctx, x); err != nil {
			t.Fatalf("DestroyObject: %v", err)
		}
	}
	left, err := s.FindObjects(ctx, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_DATA)})
	if err != nil || len(left) != 0 {
		t.Fatalf("objects left after DestroyObject: %v, %v", left, err)
	}

	// Random, mechanisms, token info.
	r, err := s.GenerateRandom(ctx, 48)
	if err != nil || len(r) != 48 {
		t.Fatalf("GenerateRandom(48): %d bytes, %v", len(r), err)
	}
	ms, err := s.Mechanisms(ctx)
	if err != nil {
		t.Fatalf("Mechanisms: %v", err)
	}
	hasECDSA := false
	for _, m := range ms {
		hasECDSA = hasECDSA || m == pkcs11.CKM_ECDSA
	}
	if !hasECDSA {
		t.Fatalf("Mechanisms does not list CKM_ECDSA: %v", ms)
	}
	mi, err := s.MechanismInfo(ctx, pkcs11.CKM_ECDSA)
	if err != nil || mi.Flags&pkcs11.CKF_SIGN == 0 {
		t.Fatalf("MechanismInfo(CKM_ECDSA): %+v, %v", mi, err)
	}
	ti, err := s.TokenInfo(ctx)
	if err != nil || ti.Label != s.Token().Label {
		t.Fatalf("TokenInfo: %+v, %v; want label %q", ti, err, s.Token().Label)
	}
}

func TestWrapUnwrapDerive(t *testing.T) {
	t.Parallel()
	s := open(t, specOf(testhsm.Take(t, 1)[0]))
	ctx := ctxT(t)
	aes := func(label string, extra ...*pkcs11.Attribute) pkcs11.ObjectHandle {
		tmpl := append([]*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false),
			pkcs11.NewAttribute(pkcs11.CKA_VALUE_LEN, 32),
			pkcs11.NewAttribute(pkcs11.CKA_LABEL, label),
		}, extra...)
		h, err := s.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), tmpl)
		if err != nil {
			t.Fatalf("GenerateKey(%s): %v", label, err)
		}
		return h
	}
	kek := aes("kek", pkcs11.NewAttribute(pkcs11.CKA_WRAP, true), pkcs11.NewAttribute(pkcs11.CKA_UNWRAP, true))
	key := aes("key", pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, true), pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, false),
		pkcs11.NewAttribute(pkcs11.CKA_ENCRYPT, true))
	wrapMech := pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP_PAD, nil)
	blob, err := s.WrapKey(ctx, wrapMech, kek, key)
	if err != nil {
		t.Fatalf("WrapKey: %v", err)
	}
	back, err := s.UnwrapKey(ctx, wrapMech, kek, blob, []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY),
		pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false),
		pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, false),
		pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, true),
	})
	if err != nil {
		t.Fatalf("UnwrapKey: %v", err)
	}
	vals, err := s.GetAttributes(ctx, key, []uint{pkcs11.CKA_VALUE})
	if err != nil {
		t.Fatalf("GetAttributes: %v", err)
	}
	vals2, err := s.GetAttributes(ctx, back, []uint{pkcs11.CKA_VALUE})
	if err != nil {
		t.Fatalf("GetAttributes: %v", err)
	}
	if !bytes.Equal(vals[0].Value, vals2[0].Value) || len(vals[0].Value) != 32 {
		t.Fatalf("unwrapped key value differs from the original")
	}
	// ECDH: the secret the token derives equals the one Go derives.
	pt, kt := ecKeyTemplates("ecdh", false)
	kt = append(kt, pkcs11.NewAttribute(pkcs11.CKA_DERIVE, true))
	tokPub, tokPriv, err := s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil), pt, kt)
	if err != nil {
		t.Fatalf("GenerateKeyPair: %v", err)
	}
	mine, err := ecdh.P256().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	params := pkcs11.NewECDH1DeriveParams(pkcs11.CKD_NULL, nil, mine.PublicKey().Bytes())
	derived, err := s.DeriveKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_ECDH1_DERIVE, params), tokPriv, []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY),
		pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_GENERIC_SECRET),
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false),
		pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, false),
		pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, true),
		pkcs11.NewAttribute(pkcs11.CKA_VALUE_LEN, 32),
	})
	if err != nil {
		t.Fatalf("DeriveKey: %v", err)
	}
	theirs := ecPublic(t, s, tokPub)
	theirsECDH, err := theirs.ECDH()
	if err != nil {
		t.Fatal(err)
	}
	want, err := mine.ECDH(theirsECDH)
	if err != nil {
		t.Fatal(err)
	}
	dv, err := s.GetAttributes(ctx, derived, []uint{pkcs11.CKA_VALUE})
	if err != nil || !bytes.Equal(dv[0].Value, want) {
		t.Fatalf("derived secret %x (%v), want %x", dv[0].Value, err, want)
	}
}

// SoftHSM 2.6 does not keep two threads of one process apart on one object
// file: a search or read refreshing an object while another thread writes
// it drops it half-made (it can stay without CKA_CLASS for good, answering
// CKR_ATTRIBUTE_VALUE_INVALID), and the write fails with
// CKR_GENERAL_ERROR. The slot keeps object writes and reads on one token
// apart: under concurrent creates and reads nothing fails and every object
// stays readable.
func TestCreatesAndReadsDoNotCorrupt(t *testing.T) {
	t.Parallel()
	tok := testhsm.Take(t, 1)[0]
	s := open(t, specOf(tok))
	objrace.Run(t, ctxT(t), s, 3*time.Second)
}

// A session's single-part calls give outputs of every length whole, the
// first of each length too: a signature longer than the session's last
// one, and a ciphertext far longer than any signature, come back in full
// (the module answers CKR_BUFFER_TOO_SMALL to the first buffer tried and
// the call is made again), and an empty output stays empty.
func TestOutputsOfAnyLength(t *testing.T) {
	t.Parallel()
	eachDispatch(t, func(t *testing.T, d dispatch.Dispatch) {
		spec := specOf(testhsm.Take(t, 1)[0])
		spec.Dispatch = d
		s := open(t, spec)
		ctx := ctxT(t)
		ecPub, ecPriv := newECKey(t, s, "short")
		ss, err := s.OpenSession(ctx)
		if err != nil {
			t.Fatalf("OpenSession: %v", err)
		}
		defer ss.Close()
		msg := []byte("every length")
		h := sha256.Sum256(msg)
		ecSig, err := ss.Sign(ctx, ecdsaMech, ecPriv, h[:])
		if err != nil {
			t.Fatalf("ECDSA sign: %v", err)
		}
		checkSig(t, ecPublic(t, s, ecPub), msg, ecSig)

		_, priv, rsaPub := newRSAKey(t, ss)
		info := append([]byte{0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05, 0x00, 0x04, 0x20}, h[:]...)
		rsaSig, err := ss.Sign(ctx, pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS, nil), priv, info)
		if err != nil {
			t.Fatalf("RSA sign after an ECDSA one: %v", err)
		}
		if err := rsa.VerifyPKCS1v15(rsaPub, crypto.SHA256, h[:], rsaSig); err != nil {
			t.Fatalf("RSA signature of %d bytes after a %d-byte one does not verify: %v", len(rsaSig), len(ecSig), err)
		}

		key, err := ss.CreateObject(ctx, []*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY),
			pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
			pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false),
			pkcs11.NewAttribute(pkcs11.CKA_ENCRYPT, true),
			pkcs11.NewAttribute(pkcs11.CKA_DECRYPT, true),
			pkcs11.NewAttribute(pkcs11.CKA_VALUE, bytes.Repeat([]byte{7}, 32)),
		})
		if err != nil {
			t.Fatalf("create an AES key: %v", err)
		}
		cbc := pkcs11.NewMechanism(pkcs11.CKM_AES_CBC_PAD, make([]byte, 16))
		for _, n := range []int{5000, 0} {
			plain := bytes.Repeat([]byte{'p'}, n)
			ct, err := ss.Encrypt(ctx, cbc, key, plain)
			if err != nil || len(ct) != n+16-n%16 {
				t.Fatalf("encrypt %d bytes: %d bytes, %v; want %d", n, len(ct), err, n+16-n%16)
			}
			got, err := ss.Decrypt(ctx, cbc, key, ct)
			if err != nil || !bytes.Equal(got, plain) || got == nil {
				t.Fatalf("decrypt %d bytes: %d bytes (nil %v), %v; want the %d bytes encrypted", len(ct), len(got), got == nil, err, n)
			}
		}
		sum, err := ss.Digest(ctx, pkcs11.NewMechanism(pkcs11.CKM_SHA256, nil), msg)
		if err != nil || !bytes.Equal(sum, h[:]) {
			t.Fatalf("digest: %x, %v; want %x", sum, err, h)
		}
	})
}

// newRSAKey makes an RSA-2048 session key pair through k and reads back
// its public key.
func newRSAKey(t *testing.T, k interface {
	GenerateKeyPair(ctx context.Context, m *pkcs11.Mechanism, pub, priv []*pkcs11.Attribute) (pkcs11.ObjectHandle, pkcs11.ObjectHandle, error)
	GetAttributes(ctx context.Context, h pkcs11.ObjectHandle, types []uint) ([]slot.Attribute, error)
}) (pub, priv pkcs11.ObjectHandle, rsaPub *rsa.PublicKey) {
	t.Helper()
	ctx := ctxT(t)
	pub, priv, err := k.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false),
			pkcs11.NewAttribute(pkcs11.CKA_VERIFY, true),
			pkcs11.NewAttribute(pkcs11.CKA_MODULUS_BITS, 2048),
			pkcs11.NewAttribute(pkcs11.CKA_PUBLIC_EXPONENT, []byte{1, 0, 1}),
		},
		[]*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false),
			pkcs11.NewAttribute(pkcs11.CKA_SIGN, true),
			pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
		})
	if err != nil {
		t.Fatalf("GenerateKeyPair: %v", err)
	}
	attrs, err := k.GetAttributes(ctx, pub, []uint{pkcs11.CKA_MODULUS, pkcs11.CKA_PUBLIC_EXPONENT})
	if err != nil {
		t.Fatalf("read the public key: %v", err)
	}
	return pub, priv, &rsa.PublicKey{N: new(big.Int).SetBytes(attrs[0].Value), E: int(new(big.Int).SetBytes(attrs[1].Value).Int64())}
}
