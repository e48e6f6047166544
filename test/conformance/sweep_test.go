package conformance

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	_ "crypto/sha1" // the OAEP ciphertexts' hashes
	_ "crypto/sha256"
	_ "crypto/sha512"
	"encoding/hex"
	"fmt"
	"math/big"
	"sync"
	"testing"

	p "github.com/miekg/pkcs11"
)

// The sweeps: the parameter combinations of the mechanisms the token
// offers, every way a key is made crossed with the protection the
// application asks for, the latching and read-only attributes, and the
// sessions in every state. Each runs from its own C_Initialize on session
// objects (and token objects it destroys), after the main sequence.

// hashes are the digests OAEP and PSS name: mechanism, MGF1 of the same
// digest, and the Go hash.
var hashes = []struct {
	name string
	mech uint
	mgf  uint
	pss  uint // CKM_SHAx_RSA_PKCS_PSS
	hash crypto.Hash
}{
	{"SHA-1", p.CKM_SHA_1, p.CKG_MGF1_SHA1, p.CKM_SHA1_RSA_PKCS_PSS, crypto.SHA1},
	{"SHA-224", p.CKM_SHA224, p.CKG_MGF1_SHA224, p.CKM_SHA224_RSA_PKCS_PSS, crypto.SHA224},
	{"SHA-256", p.CKM_SHA256, p.CKG_MGF1_SHA256, p.CKM_SHA256_RSA_PKCS_PSS, crypto.SHA256},
	{"SHA-384", p.CKM_SHA384, p.CKG_MGF1_SHA384, p.CKM_SHA384_RSA_PKCS_PSS, crypto.SHA384},
	{"SHA-512", p.CKM_SHA512, p.CKG_MGF1_SHA512, p.CKM_SHA512_RSA_PKCS_PSS, crypto.SHA512},
}

var oaepLabel = []byte("hagroup-label")

// oaepCiphertexts are made once per test binary outside the token (as a
// client of the key's public half would), for each hash, without and with
// a label, so that every world decrypts the same bytes.
var (
	oaepOnce sync.Once
	oaepCT   map[string]string
)

func oaepCiphertexts(t testing.TB) map[string]string {
	k := testKeys(t)
	oaepOnce.Do(func() {
		oaepCT = map[string]string{}
		for _, h := range hashes {
			for _, label := range [][]byte{nil, oaepLabel} {
				ct, err := rsa.EncryptOAEP(h.hash.New(), rand.Reader, &k.rsa.PublicKey, []byte("oaep plaintext"), label)
				if err != nil {
					panic(err)
				}
				oaepCT[fmt.Sprintf("%s/%t", h.name, label != nil)] = hex.EncodeToString(ct)
			}
		}
	})
	return oaepCT
}

// sweepPreamble logs in and imports the sweep's keys as session objects.
func sweepPreamble(prefix string, k keys) []step {
	r := k.rsa
	return []step{
		st(prefix+": init", "init"),
		st(prefix+": select slot", "slot %s", label),
		st(prefix+": open", "open 0x%x", rw).saving("s=h"),
		st(prefix+": open operation session", "open 0x%x", rw).saving("o=h"),
		st(prefix+": login", "login $s 1 user"),
		st(prefix+": RSA private key", "create $s %s", tpl(tu(p.CKA_CLASS, p.CKO_PRIVATE_KEY), tu(p.CKA_KEY_TYPE, p.CKK_RSA), tb(p.CKA_TOKEN, false),
			tb(p.CKA_SIGN, true), tb(p.CKA_DECRYPT, true), tx(p.CKA_MODULUS, be(r.N)), tx(p.CKA_PUBLIC_EXPONENT, be(big.NewInt(int64(r.E)))),
			tx(p.CKA_PRIVATE_EXPONENT, be(r.D)), tx(p.CKA_PRIME_1, be(r.Primes[0])), tx(p.CKA_PRIME_2, be(r.Primes[1])),
			tx(p.CKA_EXPONENT_1, be(r.Precomputed.Dp)), tx(p.CKA_EXPONENT_2, be(r.Precomputed.Dq)), tx(p.CKA_COEFFICIENT, be(r.Precomputed.Qinv)))).saving("rsa=h"),
		st(prefix+": RSA public key", "create $s %s", tpl(tu(p.CKA_CLASS, p.CKO_PUBLIC_KEY), tu(p.CKA_KEY_TYPE, p.CKK_RSA), tb(p.CKA_TOKEN, false),
			tb(p.CKA_VERIFY, true), tb(p.CKA_ENCRYPT, true), tx(p.CKA_MODULUS, be(r.N)), tx(p.CKA_PUBLIC_EXPONENT, be(big.NewInt(int64(r.E)))))).saving("rsapub=h"),
		st(prefix+": EC private key", "create $s %s", tpl(tu(p.CKA_CLASS, p.CKO_PRIVATE_KEY), tu(p.CKA_KEY_TYPE, p.CKK_EC), tb(p.CKA_TOKEN, false),
			tb(p.CKA_DERIVE, true), tb(p.CKA_SIGN, true), tx(p.CKA_EC_PARAMS, p256), tx(p.CKA_VALUE, k.ec.D.FillBytes(make([]byte, 32))))).saving("ec=h"),
		st(prefix+": AES key", "create $s %s", tpl(tu(p.CKA_CLASS, p.CKO_SECRET_KEY), tu(p.CKA_KEY_TYPE, p.CKK_AES), tb(p.CKA_TOKEN, false),
			tb(p.CKA_ENCRYPT, true), tb(p.CKA_DECRYPT, true), tb(p.CKA_WRAP, true), tb(p.CKA_UNWRAP, true), tb(p.CKA_DERIVE, true),
			tb(p.CKA_SENSITIVE, false), tb(p.CKA_EXTRACTABLE, true), tx(p.CKA_VALUE, k.aes))).saving("aes=h"),
	}
}

func sweepEnd(prefix string) []step {
	return []step{
		st(prefix+": logout", "logout $s"),
		st(prefix+": finalize", "fin"),
	}
}

// parameterSweep crosses the parameters of the token's parameterised
// mechanisms: OAEP hash × MGF × label, PSS hash × MGF × salt length (raw
// and with each digest), GCM IV × tag length, CBC and CTR IVs, and the
// derive mechanisms with their KDFs and data.
func parameterSweep(t testing.TB) []step {
	k := testKeys(t)
	ct := oaepCiphertexts(t)
	steps := sweepPreamble("sweep", k)
	add := func(s ...step) { steps = append(steps, s...) }
	data := hex.EncodeToString([]byte("oaep plaintext"))

	for _, h := range hashes {
		for _, mgf := range hashes {
			for _, lbl := range []bool{false, true} {
				name := fmt.Sprintf("OAEP %s MGF1-%s label=%t", h.name, mgf.name, lbl)
				args := []string{"oaep", fmt.Sprintf("0x%x", h.mech), fmt.Sprint(mgf.mgf)}
				if lbl {
					args = append(args, hex.EncodeToString(oaepLabel))
				}
				m := mech(p.CKM_RSA_PKCS_OAEP, args...)
				add(
					st(name+": decrypt init", "decinit $s %s $rsa", m).in(name+" dec"),
					st(name+": decrypt", "dec $s %s 512", ct[fmt.Sprintf("%s/%t", h.name, lbl)]).in(name+" dec"),
					st(name+": encrypt init", "encinit $s %s $rsapub", m).in(name+" enc"),
					st(name+": encrypt", "enc $s %s 512", data).in(name+" enc").skipping("out"),
				)
			}
		}
	}

	digest := hex.EncodeToString(seq(32, 7))
	for _, sm := range append([]uint{p.CKM_RSA_PKCS_PSS}, p.CKM_SHA1_RSA_PKCS_PSS, p.CKM_SHA224_RSA_PKCS_PSS, p.CKM_SHA256_RSA_PKCS_PSS, p.CKM_SHA384_RSA_PKCS_PSS, p.CKM_SHA512_RSA_PKCS_PSS) {
		for _, h := range hashes {
			other := uint(p.CKG_MGF1_SHA1)
			if h.mgf == other {
				other = p.CKG_MGF1_SHA256
			}
			for _, mgf := range []uint{h.mgf, other} {
				for _, salt := range []int{0, h.hash.Size(), 300} {
					name := fmt.Sprintf("PSS 0x%x %s MGF %d salt %d", sm, h.name, mgf, salt)
					in := digest
					if sm == p.CKM_RSA_PKCS_PSS {
						in = hex.EncodeToString(seq(h.hash.Size(), 9))
					}
					m := mech(sm, "pss", fmt.Sprintf("0x%x", h.mech), fmt.Sprint(mgf), fmt.Sprint(salt))
					add(
						st(name+": sign init", "signinit $s %s $rsa", m).in(name+" sign"),
						st(name+": sign", "sign $s %s 512", in).in(name+" sign").saving("sig=out").skipping("out"),
						st(name+": verify init", "verinit $s %s $rsapub", m).in(name+" verify"),
						st(name+": verify", "ver $s %s $sig", in).in(name+" verify"),
					)
				}
			}
		}
	}

	plain := hex.EncodeToString(seq(48, 3))
	for _, iv := range []string{".", "01", hex.EncodeToString(seq(12, 1)), hex.EncodeToString(seq(16, 1)), hex.EncodeToString(seq(64, 1))} {
		for _, tag := range []int{0, 32, 64, 96, 104, 112, 120, 128, 136} {
			for _, aad := range []string{".", "feedface"} {
				name := fmt.Sprintf("GCM IV %d tag %d AAD %s", len(iv)/2, tag, aad)
				m := mech(p.CKM_AES_GCM, "gcm", iv, aad, fmt.Sprint(tag))
				add(
					st(name+": encrypt init", "encinit $s %s $aes", m).in(name+" enc"),
					st(name+": encrypt", "enc $s %s 256", plain).in(name+" enc").saving("gct=out"),
					st(name+": decrypt init", "decinit $s %s $aes", m).in(name+" dec"),
					st(name+": decrypt", "dec $s $gct 256").in(name+" dec"),
				)
			}
		}
	}

	for _, cm := range []uint{p.CKM_AES_ECB, p.CKM_AES_CBC, p.CKM_AES_CBC_PAD, p.CKM_AES_CTR} {
		for _, iv := range []string{"-", ".", "01", hex.EncodeToString(seq(15, 1)), hex.EncodeToString(seq(16, 1)), hex.EncodeToString(seq(17, 1)), hex.EncodeToString(ctrParams(128))} {
			name := fmt.Sprintf("cipher 0x%x IV %s", cm, iv)
			m := mech(cm)
			if iv != "-" {
				m = mech(cm, "x", iv)
			}
			add(
				st(name+": encrypt init", "encinit $s %s $aes", m).in(name+" enc"),
				st(name+": encrypt", "enc $s %s 256", plain).in(name+" enc").saving("ct=out"),
				st(name+": decrypt init", "decinit $s %s $aes", m).in(name+" dec"),
				st(name+": decrypt", "dec $s $ct 256").in(name+" dec"),
			)
		}
	}

	readable := func(n uint) string {
		return tpl(tu(p.CKA_CLASS, p.CKO_SECRET_KEY), tu(p.CKA_KEY_TYPE, p.CKK_GENERIC_SECRET), tu(p.CKA_VALUE_LEN, n), tb(p.CKA_TOKEN, false),
			tb(p.CKA_SENSITIVE, false), tb(p.CKA_EXTRACTABLE, true))
	}
	peer := hex.EncodeToString(point(&k.ecPeer.PublicKey))
	for _, kdf := range []uint{p.CKD_NULL, p.CKD_SHA1_KDF, p.CKD_SHA224_KDF, p.CKD_SHA256_KDF, p.CKD_SHA384_KDF, p.CKD_SHA512_KDF} {
		for _, shared := range []string{"", "0102030405"} {
			for _, n := range []uint{16, 32, 64} {
				name := fmt.Sprintf("ECDH KDF %d shared %q length %d", kdf, shared, n)
				args := []string{"ecdh", fmt.Sprint(kdf), peer}
				if shared != "" {
					args = append(args, shared)
				}
				add(
					st(name+": derive", "derive $s %s $ec %s", mech(p.CKM_ECDH1_DERIVE, args...), readable(n)).saving("dk=h"),
					st(name+": value", "getattr $s $dk %s", tpl(gb(p.CKA_VALUE, 128), gb(p.CKA_VALUE_LEN, 8))),
				)
			}
		}
	}
	for _, dm := range []struct {
		name string
		m    string
	}{
		{"AES-ECB-ENCRYPT-DATA 16", mech(p.CKM_AES_ECB_ENCRYPT_DATA, "str", hex.EncodeToString(seq(16, 2)))},
		{"AES-ECB-ENCRYPT-DATA 32", mech(p.CKM_AES_ECB_ENCRYPT_DATA, "str", hex.EncodeToString(seq(32, 2)))},
		{"AES-ECB-ENCRYPT-DATA 5", mech(p.CKM_AES_ECB_ENCRYPT_DATA, "str", hex.EncodeToString(seq(5, 2)))},
		{"AES-CBC-ENCRYPT-DATA 16", mech(p.CKM_AES_CBC_ENCRYPT_DATA, "cbcdata", hex.EncodeToString(seq(16, 4)), hex.EncodeToString(seq(16, 2)))},
		{"AES-CBC-ENCRYPT-DATA 32", mech(p.CKM_AES_CBC_ENCRYPT_DATA, "cbcdata", hex.EncodeToString(seq(16, 4)), hex.EncodeToString(seq(32, 2)))},
		{"AES-ECB-ENCRYPT-DATA without data", mech(p.CKM_AES_ECB_ENCRYPT_DATA)},
	} {
		add(
			st(dm.name+": derive", "derive $s %s $aes %s", dm.m, readable(16)).saving("dk=h"),
			st(dm.name+": value", "getattr $s $dk %s", tpl(gb(p.CKA_VALUE, 128), gb(p.CKA_VALUE_LEN, 8))),
		)
	}
	add(sweepEnd("sweep")...)
	return withOpSessions(steps)
}

// ctrParams is a CK_AES_CTR_PARAMS: the counter bits, then a 16-byte
// counter block (the driver's raw parameter, in the host's byte order).
func ctrParams(bits uint64) []byte {
	b := make([]byte, 8, 24)
	for i := range 8 {
		b[i] = byte(bits >> (8 * i))
	}
	return append(b, seq(16, 0x30)...)
}
