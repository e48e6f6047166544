package remote_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/internal/testhsm/objrace"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// Every family of calls pkg/slot makes, through hsmserve to SoftHSM.
func TestRoundTrips(t *testing.T) {
	srv := testhsm.ServeRemote(t, "rt")
	tok := srv.Token()
	s := open(t, tok, 20*time.Second)
	ctx := ctxT(t)

	t.Run("token", func(t *testing.T) {
		ti, err := s.TokenInfo(ctx)
		if err != nil {
			t.Fatalf("TokenInfo: %v", err)
		}
		if strings.TrimSpace(ti.Label) != tok.Label || strings.TrimSpace(ti.SerialNumber) != tok.Serial {
			t.Errorf("token %q serial %q, want %q serial %q", ti.Label, ti.SerialNumber, tok.Label, tok.Serial)
		}
		ms, err := s.Mechanisms(ctx)
		if err != nil {
			t.Fatalf("Mechanisms: %v", err)
		}
		for _, m := range []uint{pkcs11.CKM_AES_KEY_WRAP_PAD, pkcs11.CKM_ECDSA, pkcs11.CKM_AES_GCM, pkcs11.CKM_RSA_PKCS_OAEP} {
			if !slices.Contains(ms, m) {
				t.Errorf("mechanism 0x%X missing from the list", m)
			}
		}
		mi, err := s.MechanismInfo(ctx, pkcs11.CKM_AES_KEY_WRAP_PAD)
		if err != nil {
			t.Fatalf("MechanismInfo: %v", err)
		}
		if mi.Flags&(pkcs11.CKF_WRAP|pkcs11.CKF_UNWRAP) != pkcs11.CKF_WRAP|pkcs11.CKF_UNWRAP {
			t.Errorf("CKM_AES_KEY_WRAP_PAD flags 0x%X lack wrap and unwrap", mi.Flags)
		}
		toks, err := slot.ListModuleTokens(ctx, slot.ModuleRef{Path: tok.Module})
		if err != nil || len(toks) != 1 || toks[0].Label != tok.Label {
			t.Errorf("ListModuleTokens = %+v, %v; want the one served token", toks, err)
		}
	})

	t.Run("random+digest", func(t *testing.T) {
		r, err := s.GenerateRandom(ctx, 48)
		if err != nil || len(r) != 48 {
			t.Fatalf("GenerateRandom: %d bytes, %v", len(r), err)
		}
		data := []byte("the quick brown fox")
		want := sha256.Sum256(data)
		d, err := s.Digest(ctx, pkcs11.NewMechanism(pkcs11.CKM_SHA256, nil), data)
		if err != nil || !bytes.Equal(d, want[:]) {
			t.Fatalf("Digest = %x, %v; want %x", d, err, want)
		}
		ss := session(t, s)
		mustDo(t, "DigestInit", ss.Init(ctx, slot.KindDigest, pkcs11.NewMechanism(pkcs11.CKM_SHA256, nil), 0))
		mustDo(t, "DigestUpdate", errOf(ss.Update(ctx, slot.KindDigest, data[:5])))
		mustDo(t, "DigestUpdate", errOf(ss.Update(ctx, slot.KindDigest, data[5:])))
		d, err = ss.Final(ctx, slot.KindDigest, nil)
		if err != nil || !bytes.Equal(d, want[:]) {
			t.Fatalf("multi-part digest = %x, %v; want %x", d, err, want)
		}
		// C_DigestKey digests the key's value as if it were data.
		value := []byte("0123456789abcdef0123456789abcdef")
		k, err := s.CreateObject(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY),
			attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_GENERIC_SECRET), attr(pkcs11.CKA_TOKEN, false),
			attr(pkcs11.CKA_SENSITIVE, false), attr(pkcs11.CKA_VALUE, value)})
		if err != nil {
			t.Fatalf("CreateObject of a secret key: %v", err)
		}
		mustDo(t, "DigestInit", ss.Init(ctx, slot.KindDigest, pkcs11.NewMechanism(pkcs11.CKM_SHA256, nil), 0))
		mustDo(t, "DigestUpdate", errOf(ss.Update(ctx, slot.KindDigest, data)))
		mustDo(t, "DigestKey", ss.DigestKey(ctx, k))
		d, err = ss.Final(ctx, slot.KindDigest, nil)
		if want := sha256.Sum256(append(slices.Clone(data), value...)); err != nil || !bytes.Equal(d, want[:]) {
			t.Fatalf("digest of data and key = %x, %v; want %x", d, err, want)
		}
		mustDo(t, "DigestInit", ss.Init(ctx, slot.KindDigest, pkcs11.NewMechanism(pkcs11.CKM_SHA256, nil), 0))
		if err := ss.DigestKey(ctx, k+1000); !errors.Is(err, pkcs11.Error(pkcs11.CKR_KEY_HANDLE_INVALID)) {
			t.Errorf("DigestKey of no key: %v, want CKR_KEY_HANDLE_INVALID", err)
		}
	})

	t.Run("objects", func(t *testing.T) {
		h, err := s.CreateObject(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA),
			attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_LABEL, "data-1"), attr(pkcs11.CKA_VALUE, []byte("payload"))})
		if err != nil {
			t.Fatalf("CreateObject: %v", err)
		}
		mustDo(t, "SetAttributes", s.SetAttributes(ctx, h, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, "data-2")}))
		as, err := s.GetAttributes(ctx, h, []uint{pkcs11.CKA_LABEL, pkcs11.CKA_VALUE, pkcs11.CKA_MODULUS})
		if err != nil {
			t.Fatalf("GetAttributes: %v", err)
		}
		if string(as[0].Value) != "data-2" || string(as[1].Value) != "payload" || as[2].Status != pkcs11.CKR_ATTRIBUTE_TYPE_INVALID {
			t.Errorf("attributes %+v: want label data-2, value payload, no modulus", as)
		}
		c, err := s.CopyObject(ctx, h, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, "data-copy")})
		if err != nil {
			t.Fatalf("CopyObject: %v", err)
		}
		if got := findOne(t, s, "data-copy", pkcs11.CKO_DATA); got != c {
			t.Errorf("found copy %d, made %d", got, c)
		}
		for _, x := range []pkcs11.ObjectHandle{h, c} {
			mustDo(t, "DestroyObject", s.DestroyObject(ctx, x))
		}
		hs, err := s.FindObjects(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA)})
		if err != nil || len(hs) != 0 {
			t.Errorf("data objects after destroy: %v, %v", hs, err)
		}
		err = s.DestroyObject(ctx, h)
		if slot.CodeOf(err) != pkcs11.CKR_OBJECT_HANDLE_INVALID || slot.ClassOf(err) != slot.ClassRequest {
			t.Errorf("destroy twice: %v (class %v), want CKR_OBJECT_HANDLE_INVALID, a request error", err, slot.ClassOf(err))
		}
		// More objects than one C_FindObjects batch hands back.
		for i := range 300 {
			if _, err := s.CreateObject(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA),
				attr(pkcs11.CKA_TOKEN, false), attr(pkcs11.CKA_LABEL, "many"), attr(pkcs11.CKA_VALUE, []byte{byte(i)})}); err != nil {
				t.Fatalf("create %d: %v", i, err)
			}
		}
	})

	t.Run("session objects", func(t *testing.T) {
		ss := session(t, s)
		h, err := ss.CreateObject(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA),
			attr(pkcs11.CKA_TOKEN, false), attr(pkcs11.CKA_LABEL, "sess-obj")})
		if err != nil {
			t.Fatalf("CreateObject in session: %v", err)
		}
		hs, err := ss.FindObjects(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, "sess-obj")})
		if err != nil || len(hs) != 1 || hs[0] != h {
			t.Fatalf("find session object: %v, %v", hs, err)
		}
		ss.Close()
		hs, err = s.FindObjects(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, "sess-obj")})
		if err != nil || len(hs) != 0 {
			t.Errorf("session object outlived its session: %v, %v", hs, err)
		}
	})

	t.Run("ec", func(t *testing.T) {
		pub, priv := genEC(t, s, "ec-rt")
		signVerify(t, s, priv, s, pub)
		digest := make([]byte, 32)
		sig, err := s.Sign(ctx, pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil), priv, digest)
		if err != nil {
			t.Fatalf("sign: %v", err)
		}
		sig[0] ^= 1
		err = s.Verify(ctx, pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil), pub, digest, sig)
		if slot.CodeOf(err) != pkcs11.CKR_SIGNATURE_INVALID || slot.ClassOf(err) != slot.ClassRequest {
			t.Errorf("verify a bad signature: %v, want CKR_SIGNATURE_INVALID, a request error", err)
		}
	})

	t.Run("hmac multi-part", func(t *testing.T) {
		k, err := s.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_GENERIC_SECRET_KEY_GEN, nil), []*pkcs11.Attribute{
			attr(pkcs11.CKA_TOKEN, false), attr(pkcs11.CKA_VALUE_LEN, 32), attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_VERIFY, true)})
		if err != nil {
			t.Fatalf("GenerateKey: %v", err)
		}
		ss := session(t, s)
		m := pkcs11.NewMechanism(pkcs11.CKM_SHA256_HMAC, nil)
		mustDo(t, "SignInit", ss.Init(ctx, slot.KindSign, m, k))
		mustDo(t, "SignUpdate", errOf(ss.Update(ctx, slot.KindSign, []byte("part one, "))))
		mustDo(t, "SignUpdate", errOf(ss.Update(ctx, slot.KindSign, []byte("part two"))))
		sig, err := ss.Final(ctx, slot.KindSign, nil)
		if err != nil {
			t.Fatalf("SignFinal: %v", err)
		}
		mustDo(t, "VerifyInit", ss.Init(ctx, slot.KindVerify, m, k))
		mustDo(t, "VerifyUpdate", errOf(ss.Update(ctx, slot.KindVerify, []byte("part one, part two"))))
		mustDo(t, "VerifyFinal", errOf(ss.Final(ctx, slot.KindVerify, sig)))
		if err := s.Verify(ctx, m, k, []byte("part one, part two"), sig); err != nil {
			t.Errorf("single-part verify of a multi-part MAC: %v", err)
		}
	})

	t.Run("ecdh derive", func(t *testing.T) {
		// Parameters holding pointers (CK_ECDH1_DERIVE_PARAMS) travel as
		// values and are rebuilt by the server.
		pubA, privA := genEC(t, s, "ecdh-a")
		pubB, privB := genEC(t, s, "ecdh-b")
		point := func(h pkcs11.ObjectHandle) []byte {
			as, err := s.GetAttributes(ctx, h, []uint{pkcs11.CKA_EC_POINT})
			if err != nil {
				t.Fatalf("read EC point: %v", err)
			}
			return as[0].Value
		}
		derive := func(priv pkcs11.ObjectHandle, peer []byte) []byte {
			h, err := s.DeriveKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_ECDH1_DERIVE, pkcs11.NewECDH1DeriveParams(pkcs11.CKD_NULL, nil, peer)), priv,
				[]*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_GENERIC_SECRET),
					attr(pkcs11.CKA_TOKEN, false), attr(pkcs11.CKA_SENSITIVE, false), attr(pkcs11.CKA_EXTRACTABLE, true),
					attr(pkcs11.CKA_VALUE_LEN, 32)})
			if err != nil {
				t.Fatalf("DeriveKey (ECDH): %v", err)
			}
			as, err := s.GetAttributes(ctx, h, []uint{pkcs11.CKA_VALUE})
			if err != nil {
				t.Fatalf("read derived value: %v", err)
			}
			return as[0].Value
		}
		a, b := derive(privA, point(pubB)), derive(privB, point(pubA))
		if len(a) != 32 || !bytes.Equal(a, b) {
			t.Errorf("ECDH secrets differ: %x vs %x", a, b)
		}
	})

	t.Run("aes", func(t *testing.T) {
		k, err := s.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), []*pkcs11.Attribute{
			attr(pkcs11.CKA_TOKEN, false), attr(pkcs11.CKA_VALUE_LEN, 32), attr(pkcs11.CKA_ENCRYPT, true), attr(pkcs11.CKA_DECRYPT, true)})
		if err != nil {
			t.Fatalf("GenerateKey: %v", err)
		}
		plain := bytes.Repeat([]byte("0123456789"), 10)
		iv := bytes.Repeat([]byte{9}, 16)
		cbc := pkcs11.NewMechanism(pkcs11.CKM_AES_CBC_PAD, iv)
		ct, err := s.Encrypt(ctx, cbc, k, plain)
		if err != nil {
			t.Fatalf("Encrypt CBC_PAD: %v", err)
		}
		pt, err := s.Decrypt(ctx, cbc, k, ct)
		if err != nil || !bytes.Equal(pt, plain) {
			t.Fatalf("Decrypt CBC_PAD: %q, %v", pt, err)
		}
		ss := session(t, s)
		mustDo(t, "EncryptInit", ss.Init(ctx, slot.KindEncrypt, cbc, k))
		var mp []byte
		for _, part := range [][]byte{plain[:33], plain[33:]} {
			out, err := ss.Update(ctx, slot.KindEncrypt, part)
			if err != nil {
				t.Fatalf("EncryptUpdate: %v", err)
			}
			mp = append(mp, out...)
		}
		out, err := ss.Final(ctx, slot.KindEncrypt, nil)
		if err != nil {
			t.Fatalf("EncryptFinal: %v", err)
		}
		if mp = append(mp, out...); !bytes.Equal(mp, ct) {
			t.Errorf("multi-part ciphertext differs from single-part")
		}
		mustDo(t, "DecryptInit", ss.Init(ctx, slot.KindDecrypt, cbc, k))
		var back []byte
		for _, part := range [][]byte{ct[:20], ct[20:]} {
			out, err := ss.Update(ctx, slot.KindDecrypt, part)
			if err != nil {
				t.Fatalf("DecryptUpdate: %v", err)
			}
			back = append(back, out...)
		}
		out, err = ss.Final(ctx, slot.KindDecrypt, nil)
		if err != nil {
			t.Fatalf("DecryptFinal: %v", err)
		}
		if back = append(back, out...); !bytes.Equal(back, plain) {
			t.Errorf("multi-part decrypt = %q", back)
		}

		// GCM: miekg builds CK_GCM_PARAMS (pointers) at call time.
		gcmIV, aad := bytes.Repeat([]byte{3}, 12), []byte("header")
		ct, err = s.Encrypt(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_GCM, pkcs11.NewGCMParams(gcmIV, aad, 128)), k, plain)
		if err != nil {
			t.Fatalf("Encrypt GCM: %v", err)
		}
		if len(ct) != len(plain)+16 {
			t.Fatalf("GCM ciphertext %d bytes, want %d", len(ct), len(plain)+16)
		}
		pt, err = s.Decrypt(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_GCM, pkcs11.NewGCMParams(gcmIV, aad, 128)), k, ct)
		if err != nil || !bytes.Equal(pt, plain) {
			t.Fatalf("Decrypt GCM: %q, %v", pt, err)
		}
		_, err = s.Decrypt(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_GCM, pkcs11.NewGCMParams(gcmIV, []byte("other"), 128)), k, ct)
		if err == nil {
			t.Errorf("GCM decrypt with other AAD succeeded: the AAD did not travel")
		}
	})

	t.Run("raw parameters", func(t *testing.T) {
		// A C application's CK_GCM_PARAMS, copied as bytes as
		// cmd/hapkcs11 does: its pointers are valid only here, so the
		// client sends what they point at.
		k, err := s.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), []*pkcs11.Attribute{
			attr(pkcs11.CKA_TOKEN, false), attr(pkcs11.CKA_VALUE_LEN, 16), attr(pkcs11.CKA_ENCRYPT, true), attr(pkcs11.CKA_DECRYPT, true)})
		if err != nil {
			t.Fatalf("GenerateKey: %v", err)
		}
		iv, aad, plain := bytes.Repeat([]byte{1}, 12), []byte("aad"), []byte("raw gcm")
		raw := rawGCM(iv, aad, 128)
		ct, err := s.Encrypt(ctx, &pkcs11.Mechanism{Mechanism: pkcs11.CKM_AES_GCM, Parameter: raw}, k, plain)
		runtime.KeepAlive(iv)
		runtime.KeepAlive(aad)
		if err != nil {
			t.Fatalf("Encrypt with raw CK_GCM_PARAMS: %v", err)
		}
		pt, err := s.Decrypt(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_GCM, pkcs11.NewGCMParams(iv, aad, 128)), k, ct)
		if err != nil || !bytes.Equal(pt, plain) {
			t.Fatalf("Decrypt: %q, %v", pt, err)
		}
		// A structure given with a length that is not its size reaches
		// the module as zeroes of that length (never with foreign
		// pointers in it), which it refuses as in process: SoftHSM
		// answers a CK_GCM_PARAMS of another size CKR_ARGUMENTS_BAD.
		_, err = s.Encrypt(ctx, &pkcs11.Mechanism{Mechanism: pkcs11.CKM_AES_GCM, Parameter: raw[:47]}, k, plain)
		if slot.CodeOf(err) != pkcs11.CKR_ARGUMENTS_BAD {
			t.Errorf("raw parameters of another length: %v, want SoftHSM's CKR_ARGUMENTS_BAD", err)
		}
		if _, err := s.GenerateRandom(ctx, 8); err != nil {
			t.Errorf("the server after refusing raw pointers: %v", err)
		}
	})

	t.Run("rsa oaep", func(t *testing.T) {
		pub, priv, err := s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS_KEY_PAIR_GEN, nil),
			[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, false), attr(pkcs11.CKA_ENCRYPT, true),
				attr(pkcs11.CKA_MODULUS_BITS, 2048), attr(pkcs11.CKA_PUBLIC_EXPONENT, []byte{1, 0, 1})},
			[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, false), attr(pkcs11.CKA_DECRYPT, true), attr(pkcs11.CKA_SENSITIVE, true)})
		if err != nil {
			t.Fatalf("generate RSA: %v", err)
		}
		oaep := func(label []byte) *pkcs11.Mechanism {
			return pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS_OAEP,
				pkcs11.NewOAEPParams(pkcs11.CKM_SHA_1, pkcs11.CKG_MGF1_SHA1, pkcs11.CKZ_DATA_SPECIFIED, label))
		}
		ct, err := s.Encrypt(ctx, oaep(nil), pub, []byte("secret"))
		if err != nil {
			t.Fatalf("OAEP encrypt: %v", err)
		}
		pt, err := s.Decrypt(ctx, oaep(nil), priv, ct)
		if err != nil || string(pt) != "secret" {
			t.Fatalf("OAEP decrypt: %q, %v", pt, err)
		}
	})

	t.Run("login", func(t *testing.T) {
		mustDo(t, "Logout", s.Logout(ctx))
		if hs, err := s.FindObjects(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY)}); err != nil || len(hs) != 0 {
			t.Errorf("private keys visible after logout: %v, %v", hs, err)
		}
		err := s.Login(ctx, pkcs11.CKU_USER, secret.PINFromString("wrong-pin"))
		if !errors.Is(err, slot.ErrPINIncorrect) || slot.ClassOf(err) != slot.ClassLogin {
			t.Errorf("wrong PIN: %v, want ErrPINIncorrect, a login error", err)
		}
		if err != nil && strings.Contains(err.Error(), "wrong-pin") {
			t.Errorf("the error shows the PIN: %v", err)
		}
		mustDo(t, "Login", s.Login(ctx, pkcs11.CKU_USER, secret.PINFromString(tok.UserPIN)))
		if hs, err := s.FindObjects(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY)}); err != nil || len(hs) == 0 {
			t.Errorf("no private keys after login: %v, %v", hs, err)
		}
	})
}

// Calls from many goroutines share one connection and run concurrently.
func TestConcurrentCalls(t *testing.T) {
	srv := testhsm.ServeRemote(t, "conc")
	s := open(t, srv.Token(), 20*time.Second)
	pub, priv := genEC(t, s, "conc")
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil)
			for i := range 40 {
				d := bytes.Repeat([]byte{byte(i)}, 32)
				sig, err := s.Sign(ctxT(t), m, priv, d)
				if err == nil {
					err = s.Verify(ctxT(t), m, pub, d, sig)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent sign/verify: %v", err)
	}
	if st := s.Stats(); st.MaxOpen < 2 {
		t.Errorf("at most %d pooled session open at once: calls did not overlap", st.MaxOpen)
	}
}

func session(t *testing.T, s *slot.Slot) *slot.Session {
	t.Helper()
	ss, err := s.OpenSession(ctxT(t))
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	t.Cleanup(func() { ss.Close() })
	return ss
}

func mustDo(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// rawGCM lays out a PKCS#11 v2.40 CK_GCM_PARAMS as a C application would
// pass it: pointers to iv and aad (kept alive by the caller).
func rawGCM(iv, aad []byte, tagBits int) []byte {
	b := make([]byte, 48)
	for i, v := range []uint64{
		uint64(uintptr(unsafe.Pointer(unsafe.SliceData(iv)))), uint64(len(iv)), uint64(8 * len(iv)),
		uint64(uintptr(unsafe.Pointer(unsafe.SliceData(aad)))), uint64(len(aad)), uint64(tagBits),
	} {
		binary.NativeEndian.PutUint64(b[8*i:], v)
	}
	return b
}

// SoftHSM 2.6 does not keep two threads of one process apart on one object
// file (fcntl locks work between processes only): a search or a read that
// refreshes an object while another thread is still writing it drops
// what was written so far, and the object can stay without CKA_CLASS for
// good, answering CKR_ATTRIBUTE_VALUE_INVALID; the creation itself may
// fail with CKR_GENERAL_ERROR. The server serves every client from one
// process, so it keeps object writes apart from object reads: under
// concurrent creates and reads, no creation fails, no read sees a
// half-made object and every object stays readable.
func TestCreatesAndReadsDoNotCorrupt(t *testing.T) {
	srv := testhsm.ServeRemote(t, "objrace")
	s := open(t, srv.Token(), 20*time.Second)
	objrace.Run(t, ctxT(t), s, 3*time.Second)
}

// errOf is the error of a call whose output does not matter.
func errOf(_ []byte, err error) error { return err }
