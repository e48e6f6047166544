package conformance

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/hex"
	"fmt"
	"math/big"
	"strings"
	"sync"
	"testing"

	p "github.com/miekg/pkcs11"
)

// step is one PKCS#11 call of the sequence: the driver line (with $name
// for a value an earlier step saved), what to save from its answer, and
// which fields of the answer are not compared (random outputs; handles,
// the fields h and h2, never are).
type step struct {
	name string
	call string
	save map[string]string // variable -> answer field
	skip []string
	// op names the multi-part operation the step is part of, from its
	// *Init to its end: a member's death in it may end it with
	// CKR_DEVICE_ERROR (docs/DESIGN.md, Failover).
	op string
}

func st(name, call string, args ...any) step {
	return step{name: name, call: fmt.Sprintf(call, args...)}
}

// saving saves answer fields: "var=field" pairs.
func (s step) saving(pairs ...string) step {
	s.save = map[string]string{}
	for _, pr := range pairs {
		v, f, _ := strings.Cut(pr, "=")
		s.save[v] = f
	}
	return s
}

func (s step) skipping(fields ...string) step { s.skip = fields; return s }
func (s step) in(op string) step              { s.op = op; return s }

// Template items and mechanisms in the driver's notation.
func tb(t uint, v bool) string {
	if v {
		return fmt.Sprintf("0x%x=t", t)
	}
	return fmt.Sprintf("0x%x=f", t)
}
func tu(t, v uint) string        { return fmt.Sprintf("0x%x=u%d", t, v) }
func tx(t uint, v []byte) string { return fmt.Sprintf("0x%x=x%x", t, v) }
func ts(t uint, v string) string { return fmt.Sprintf("0x%x=s%s", t, v) }
func tpl(items ...string) string {
	if len(items) == 0 {
		return "."
	}
	return strings.Join(items, ",")
}

// gq asks an attribute's length (NULL value), gb gives it a buffer.
func gq(t uint) string        { return fmt.Sprintf("0x%x", t) }
func gb(t uint, n int) string { return fmt.Sprintf("0x%x#%d", t, n) }

func mech(m uint, param ...string) string {
	return strings.Join(append([]string{fmt.Sprintf("0x%x", m)}, param...), "/")
}

// keys are the key values every configuration imports, made once per test
// binary so that deterministic outputs compare byte for byte.
type keys struct {
	rsa     *rsa.PrivateKey
	ec      *ecdsa.PrivateKey
	ecPeer  *ecdsa.PrivateKey
	aes     []byte
	hmac    []byte
	hmacBad []byte // too short for CKM_SHA256_HMAC on SoftHSM
}

var (
	keysOnce sync.Once
	theKeys  keys
)

func testKeys(t testing.TB) keys {
	keysOnce.Do(func() {
		var err error
		k := keys{aes: seq(16, 0x40), hmac: seq(32, 0x80), hmacBad: seq(4, 0x10)}
		if k.rsa, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
		if k.ec, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			panic(err)
		}
		if k.ecPeer, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			panic(err)
		}
		theKeys = k
	})
	return theKeys
}

// seq returns n bytes counting up from start.
func seq(n int, start byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = start + byte(i)
	}
	return b
}

func point(k *ecdsa.PublicKey) []byte {
	b, err := k.Bytes()
	if err != nil {
		panic(err)
	}
	return b
}

func be(n *big.Int) []byte { return n.Bytes() }

var p256 = []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}

const (
	rw       = p.CKF_SERIAL_SESSION | p.CKF_RW_SESSION
	ro       = p.CKF_SERIAL_SESSION
	badH     = 0x7ffffff0 // a handle no token gave
	bigBuf   = 4096
	ckaBogus = 0x7fff0001 // an attribute type no token knows
)

// sequence is the call sequence every configuration runs: every function
// of the v2.40 list, the buffer conventions, error cases and multi-part
// operations with length queries. Token objects it makes it destroys, so
// it can run again on the same tokens.
func sequence(t testing.TB) []step {
	k := testKeys(t)
	data32 := hex.EncodeToString(seq(32, 0))
	data20 := hex.EncodeToString(seq(20, 0xa0))
	data5 := hex.EncodeToString([]byte("hello"))
	iv := seq(16, 0xc0)
	var steps []step
	add := func(s ...step) { steps = append(steps, s...) }

	// The library, the slot, the token, the mechanisms.
	add(
		st("info before init", "info"),
		st("init", "init"),
		st("init again", "init"),
		st("info", "info"),
		st("select slot", "slot %s", label),
		st("slot list query", "slots 1 -"),
		st("slot list too small", "slots 1 0"),
		st("slot info", "slotinfo"),
		st("token info", "tokeninfo"),
		st("mechanism list query", "mechs -"),
		st("mechanism list too small", "mechs 1"),
		st("mechanism list", "mechs 1024"),
		st("mechanism info AES-CBC-PAD", "mechinfo 0x%x", p.CKM_AES_CBC_PAD),
		st("mechanism info SHA256-HMAC", "mechinfo 0x%x", p.CKM_SHA256_HMAC),
		st("mechanism info ECDSA", "mechinfo 0x%x", p.CKM_ECDSA),
		st("mechanism info RSA-PKCS", "mechinfo 0x%x", p.CKM_RSA_PKCS),
		st("mechanism info invalid", "mechinfo 0x%x", 0x8fffff01),
		st("slot event", "waitevent 0x%x", p.CKF_DONT_BLOCK),
	)
	// Sessions and login states.
	add(
		st("open without serial flag", "open 0"),
		st("open read-only", "open 0x%x", ro).saving("ro=h"),
		st("open read-write", "open 0x%x", rw).saving("s=h"),
		st("session info RO public", "sessinfo $ro"),
		st("session info RW public", "sessinfo $s"),
		st("session info bad handle", "sessinfo %d", badH),
		st("token info session counts", "tokeninfo"),
		st("private object before login", "create $s %s", tpl(tu(p.CKA_CLASS, p.CKO_DATA), tb(p.CKA_TOKEN, false), tb(p.CKA_PRIVATE, true), ts(p.CKA_LABEL, "early"))),
		st("logout before login", "logout $s"),
		st("login wrong PIN", "login $s 1 bad"),
		st("login user", "login $s 1 user"),
		st("login user twice", "login $s 1 user"),
		st("open operation session", "open 0x%x", rw).saving("o=h"),
		st("login SO while user", "login $s 0 so"),
		st("session info RO user", "sessinfo $ro"),
		st("session info RW user", "sessinfo $s"),
		st("open second RW", "open 0x%x", rw).saving("s2=h"),
		st("second session info", "sessinfo $s2"),
		st("close second", "close $s2"),
		st("close second again", "close $s2"),
		st("function status", "funcstatus $s"),
		st("cancel function", "cancel $s"),
		st("seed random", "seed $s %s", data5),
		st("generate random", "random $s 32").skipping("out"),
		st("generate random none", "random $s 0"),
	)
	// Objects: create, attributes, copy, size, search, template errors.
	dataObj := tpl(tu(p.CKA_CLASS, p.CKO_DATA), tb(p.CKA_TOKEN, true), tb(p.CKA_PRIVATE, true),
		ts(p.CKA_LABEL, "cf-data"), ts(p.CKA_APPLICATION, "conform"), tx(p.CKA_VALUE, []byte("hello")))
	add(
		st("create data object", "create $s %s", dataObj).saving("d=h"),
		st("create token object read-only", "create $ro %s", dataObj),
		st("create duplicate data object", "create $s %s", dataObj).saving("dup=h"),
		st("destroy duplicate", "destroy $s $dup"),
		st("object size", "objsize $s $d"),
		st("object size bad handle", "objsize $s %d", badH),
		st("attribute lengths", "getattr $s $d %s", tpl(gq(p.CKA_CLASS), gq(p.CKA_LABEL), gq(p.CKA_VALUE), gq(p.CKA_APPLICATION))),
		st("attribute values", "getattr $s $d %s", tpl(gb(p.CKA_CLASS, 8), gb(p.CKA_LABEL, 64), gb(p.CKA_VALUE, 64), gb(p.CKA_TOKEN, 1), gb(p.CKA_PRIVATE, 1), gb(p.CKA_MODIFIABLE, 1))),
		st("attribute too small", "getattr $s $d %s", tpl(gb(p.CKA_LABEL, 2), gb(p.CKA_CLASS, 8))),
		st("attribute type invalid", "getattr $s $d %s", tpl(gb(ckaBogus, 8), gb(p.CKA_VALUE, 64))),
		st("attribute bad object", "getattr $s %d %s", badH, tpl(gq(p.CKA_CLASS))),
		st("set label", "setattr $s $d %s", tpl(ts(p.CKA_LABEL, "cf-data2"))),
		st("label after set", "getattr $s $d %s", tpl(gb(p.CKA_LABEL, 64))),
		st("set class", "setattr $s $d %s", tpl(tu(p.CKA_CLASS, p.CKO_SECRET_KEY))),
		st("copy object", "copy $s $d %s", tpl(ts(p.CKA_LABEL, "cf-copy"))).saving("dc=h"),
		st("copy attributes", "getattr $s $dc %s", tpl(gb(p.CKA_LABEL, 64), gb(p.CKA_VALUE, 64), gb(p.CKA_TOKEN, 1))),
		st("copy bad object", "copy $s %d %s", badH, tpl(ts(p.CKA_LABEL, "x"))),
		st("find init", "findinit $s %s", tpl(ts(p.CKA_APPLICATION, "conform"))),
		st("find init twice", "findinit $s %s", tpl(ts(p.CKA_APPLICATION, "conform"))),
		st("find", "find $s 10"),
		st("find more", "find $s 10"),
		st("find final", "findfin $s"),
		st("find after final", "find $s 10"),
		st("find final again", "findfin $s"),
		st("destroy copy", "destroy $s $dc"),
		st("destroy copy again", "destroy $s $dc"),
		st("find after destroy", "findinit $s %s", tpl(ts(p.CKA_APPLICATION, "conform"))),
		st("find count after destroy", "find $s 10"),
		st("find final after destroy", "findfin $s"),
		st("secret key without key type", "create $s %s", tpl(tu(p.CKA_CLASS, p.CKO_SECRET_KEY), tb(p.CKA_TOKEN, false), tx(p.CKA_VALUE, k.aes))),
		st("AES key of 7 bytes", "create $s %s", tpl(tu(p.CKA_CLASS, p.CKO_SECRET_KEY), tu(p.CKA_KEY_TYPE, p.CKK_AES), tb(p.CKA_TOKEN, false), tx(p.CKA_VALUE, seq(7, 1)))),
		st("object with bogus attribute", "create $s %s", tpl(tu(p.CKA_CLASS, p.CKO_DATA), tb(p.CKA_TOKEN, false), tx(ckaBogus, []byte{1}))),
		st("certificate without type", "create $s %s", tpl(tu(p.CKA_CLASS, p.CKO_CERTIFICATE), tb(p.CKA_TOKEN, false), tx(p.CKA_VALUE, []byte{0x30, 0}))),
		st("create empty template", "create $s ."),
		st("create NULL template", "create $s -"),
	)
	// Keys of fixed value, on the token.
	secret := func(lbl string, kt uint, v []byte, extra ...string) string {
		return tpl(append([]string{tu(p.CKA_CLASS, p.CKO_SECRET_KEY), tu(p.CKA_KEY_TYPE, kt), tb(p.CKA_TOKEN, true),
			tb(p.CKA_PRIVATE, true), ts(p.CKA_LABEL, lbl), tx(p.CKA_VALUE, v)}, extra...)...)
	}
	r := k.rsa
	add(
		st("import AES key", "create $s %s", secret("cf-aes", p.CKK_AES, k.aes, tb(p.CKA_ENCRYPT, true), tb(p.CKA_DECRYPT, true),
			tb(p.CKA_WRAP, true), tb(p.CKA_UNWRAP, true), tb(p.CKA_SENSITIVE, false), tb(p.CKA_EXTRACTABLE, true))).saving("aes=h"),
		st("import sensitive AES key", "create $s %s", secret("cf-aes-s", p.CKK_AES, seq(32, 0x21), tb(p.CKA_ENCRYPT, true),
			tb(p.CKA_SENSITIVE, true), tb(p.CKA_EXTRACTABLE, false))).saving("saes=h"),
		st("import HMAC key", "create $s %s", secret("cf-hmac", p.CKK_GENERIC_SECRET, k.hmac, tb(p.CKA_SIGN, true), tb(p.CKA_VERIFY, true),
			tb(p.CKA_SENSITIVE, false), tb(p.CKA_EXTRACTABLE, true))).saving("hmac=h"),
		st("import short HMAC key", "create $s %s", secret("cf-hmac4", p.CKK_GENERIC_SECRET, k.hmacBad, tb(p.CKA_SIGN, true))).saving("hmac4=h"),
		st("import RSA private key", "create $s %s", tpl(tu(p.CKA_CLASS, p.CKO_PRIVATE_KEY), tu(p.CKA_KEY_TYPE, p.CKK_RSA), tb(p.CKA_TOKEN, true),
			tb(p.CKA_PRIVATE, true), ts(p.CKA_LABEL, "cf-rsa"), tb(p.CKA_SIGN, true), tb(p.CKA_DECRYPT, true), tb(p.CKA_SENSITIVE, true),
			tb(p.CKA_EXTRACTABLE, false), tx(p.CKA_MODULUS, be(r.N)), tx(p.CKA_PUBLIC_EXPONENT, be(big.NewInt(int64(r.E)))),
			tx(p.CKA_PRIVATE_EXPONENT, be(r.D)), tx(p.CKA_PRIME_1, be(r.Primes[0])), tx(p.CKA_PRIME_2, be(r.Primes[1])),
			tx(p.CKA_EXPONENT_1, be(r.Precomputed.Dp)), tx(p.CKA_EXPONENT_2, be(r.Precomputed.Dq)), tx(p.CKA_COEFFICIENT, be(r.Precomputed.Qinv)))).saving("rsa=h"),
		st("import RSA public key", "create $s %s", tpl(tu(p.CKA_CLASS, p.CKO_PUBLIC_KEY), tu(p.CKA_KEY_TYPE, p.CKK_RSA), tb(p.CKA_TOKEN, true),
			ts(p.CKA_LABEL, "cf-rsa"), tb(p.CKA_VERIFY, true), tb(p.CKA_ENCRYPT, true),
			tx(p.CKA_MODULUS, be(r.N)), tx(p.CKA_PUBLIC_EXPONENT, be(big.NewInt(int64(r.E)))))).saving("rsapub=h"),
		st("import EC private key", "create $s %s", tpl(tu(p.CKA_CLASS, p.CKO_PRIVATE_KEY), tu(p.CKA_KEY_TYPE, p.CKK_EC), tb(p.CKA_TOKEN, true),
			tb(p.CKA_PRIVATE, true), ts(p.CKA_LABEL, "cf-ec"), tb(p.CKA_SIGN, true), tb(p.CKA_DERIVE, true), tb(p.CKA_SENSITIVE, true),
			tx(p.CKA_EC_PARAMS, p256), tx(p.CKA_VALUE, k.ec.D.FillBytes(make([]byte, 32))))).saving("ec=h"),
		st("import EC public key", "create $s %s", tpl(tu(p.CKA_CLASS, p.CKO_PUBLIC_KEY), tu(p.CKA_KEY_TYPE, p.CKK_EC), tb(p.CKA_TOKEN, true),
			ts(p.CKA_LABEL, "cf-ec"), tb(p.CKA_VERIFY, true), tx(p.CKA_EC_PARAMS, p256),
			tx(p.CKA_EC_POINT, append([]byte{0x04, 65}, point(&k.ec.PublicKey)...)))).saving("ecpub=h"),
		st("sensitive value", "getattr $s $saes %s", tpl(gb(p.CKA_VALUE, 64), gb(p.CKA_SENSITIVE, 1), gb(p.CKA_ALWAYS_SENSITIVE, 1), gb(p.CKA_NEVER_EXTRACTABLE, 1))),
		st("sensitive value length", "getattr $s $saes %s", tpl(gq(p.CKA_VALUE), gq(p.CKA_VALUE_LEN))),
		st("RSA private attributes", "getattr $s $rsa %s", tpl(gb(p.CKA_MODULUS, 512), gb(p.CKA_PRIVATE_EXPONENT, 512), gb(p.CKA_SIGN, 1), gb(p.CKA_LOCAL, 1), gb(p.CKA_EXTRACTABLE, 1))),
		st("EC private attributes", "getattr $s $ec %s", tpl(gb(p.CKA_EC_PARAMS, 64), gb(p.CKA_VALUE, 64), gb(p.CKA_DERIVE, 1))),
		st("EC public point", "getattr $s $ecpub %s", tpl(gb(p.CKA_EC_POINT, 128))),
		st("AES key attributes", "getattr $s $aes %s", tpl(gb(p.CKA_VALUE, 64), gb(p.CKA_VALUE_LEN, 8), gb(p.CKA_KEY_TYPE, 8), gb(p.CKA_LOCAL, 1), gb(p.CKA_CHECK_VALUE, 8))),
		st("AES key size", "objsize $s $aes"),
		st("make sensitive key extractable", "setattr $s $saes %s", tpl(tb(p.CKA_EXTRACTABLE, true))),
		st("make sensitive key non-sensitive", "setattr $s $saes %s", tpl(tb(p.CKA_SENSITIVE, false))),
	)
	// Encryption: AES-ECB single part, AES-CBC-PAD multi-part with length
	// queries, AES-GCM, errors at Init, operation state errors.
	cbc := mech(p.CKM_AES_CBC_PAD, "x", hex.EncodeToString(iv))
	add(
		st("encrypt without init", "enc $s %s 64", data32),
		st("ECB encrypt init", "encinit $s %s $aes", mech(p.CKM_AES_ECB)).in("ecb"),
		st("ECB encrypt init twice", "encinit $s %s $aes", mech(p.CKM_AES_ECB)).in("ecb"),
		st("ECB encrypt query", "enc $s %s -", data32).in("ecb"),
		st("ECB encrypt too small", "enc $s %s 4", data32).in("ecb"),
		st("ECB encrypt", "enc $s %s 64", data32).in("ecb"),
		st("ECB encrypt ended", "enc $s %s 64", data32).in("ecb"),
		st("ECB encrypt 20 bytes init", "encinit $s %s $aes", mech(p.CKM_AES_ECB)).in("ecb20"),
		st("ECB encrypt 20 bytes", "enc $s %s 64", data20).in("ecb20"),
		st("ECB after data length error", "enc $s %s 64", data32).in("ecb20"),
		st("CBC-PAD IV of 8 bytes", "encinit $s %s $aes", mech(p.CKM_AES_CBC_PAD, "x", hex.EncodeToString(seq(8, 1)))),
		st("CBC-PAD without IV", "encinit $s %s $aes", mech(p.CKM_AES_CBC_PAD)),
		st("encrypt with bad key handle", "encinit $s %s %d", cbc, badH),
		st("encrypt with HMAC key", "encinit $s %s $hmac", cbc),
		st("encrypt with sign-only mechanism", "encinit $s %s $aes", mech(p.CKM_SHA256_HMAC)),
		st("encrypt with unknown mechanism", "encinit $s %s $aes", mech(0x8fffff01)),
		st("CBC-PAD encrypt init", "encinit $s %s $aes", cbc).in("cbc-enc"),
		st("CBC-PAD encrypt update query", "encupd $s %s -", data20).in("cbc-enc"),
		st("CBC-PAD encrypt update", "encupd $s %s 64", data20).in("cbc-enc"),
		st("CBC-PAD encrypt update 2 query", "encupd $s %s -", data32).in("cbc-enc"),
		st("CBC-PAD encrypt update 2 too small", "encupd $s %s 1", data32).in("cbc-enc"),
		st("CBC-PAD encrypt update 2", "encupd $s %s 64", data32).in("cbc-enc"),
		st("CBC-PAD operation state", "getopstate $s -").in("cbc-enc"),
		st("CBC-PAD encrypt final query", "encfin $s -").in("cbc-enc"),
		st("CBC-PAD encrypt final too small", "encfin $s 1").in("cbc-enc"),
		st("CBC-PAD encrypt final", "encfin $s 64").in("cbc-enc"),
		st("CBC-PAD encrypt final again", "encfin $s 64").in("cbc-enc"),
		st("CBC-PAD one-shot init", "encinit $s %s $aes", cbc).in("cbc1"),
		st("CBC-PAD one-shot", "enc $s %s 128", data20+data32).in("cbc1").saving("ct=out"),
		st("CBC-PAD decrypt init", "decinit $s %s $aes", cbc).in("cbc-dec"),
		st("CBC-PAD decrypt update query", "decupd $s $ct -").in("cbc-dec"),
		st("CBC-PAD decrypt update", "decupd $s $ct 128").in("cbc-dec"),
		st("CBC-PAD decrypt final query", "decfin $s -").in("cbc-dec"),
		st("CBC-PAD decrypt final", "decfin $s 64").in("cbc-dec"),
		st("GCM encrypt init", "encinit $s %s $aes", mech(p.CKM_AES_GCM, "gcm", "cafebabefacedbaddecaf888", "feedface", "128")).in("gcm"),
		st("GCM encrypt query", "enc $s %s -", data20).in("gcm"),
		st("GCM encrypt", "enc $s %s 128", data20).in("gcm").saving("gct=out"),
		st("GCM decrypt init", "decinit $s %s $aes", mech(p.CKM_AES_GCM, "gcm", "cafebabefacedbaddecaf888", "feedface", "128")).in("gcm-dec"),
		st("GCM decrypt", "dec $s $gct 128").in("gcm-dec"),
		st("GCM bad tag length", "encinit $s %s $aes", mech(p.CKM_AES_GCM, "gcm", "cafebabefacedbaddecaf888", ".", "17")),
		st("encrypt with sensitive unextractable key", "encinit $s %s $saes", mech(p.CKM_AES_ECB)).in("ecb-s"),
		st("ECB with sensitive key", "enc $s %s 64", data32).in("ecb-s"),
		st("dual digest encrypt", "dencupd $s %s 64", data32),
		st("dual decrypt digest", "ddecupd $s %s 64", data32),
		st("dual sign encrypt", "sencupd $s %s 64", data32),
		st("dual decrypt verify", "dverupd $s %s 64", data32),
	)
	// Digests, C_DigestKey, operation state.
	add(
		st("digest without init", "dig $s %s 64", data5),
		st("digest init", "diginit $s %s", mech(p.CKM_SHA256)).in("dig"),
		st("digest query", "dig $s %s -", data5).in("dig"),
		st("digest too small", "dig $s %s 8", data5).in("dig"),
		st("digest", "dig $s %s 64", data5).in("dig"),
		st("digest multi init", "diginit $s %s", mech(p.CKM_SHA256)).in("digm"),
		st("digest update", "digupd $s %s", data5).in("digm"),
		st("digest key", "digkey $s $aes").in("digm"),
		st("digest key bad handle", "digkey $s %d", badH).in("digm"),
		st("digest operation state", "getopstate $s -").in("digm"),
		st("digest set operation state", "setopstate $s %s", data5).in("digm"),
		st("digest final query", "digfin $s -").in("digm"),
		st("digest final", "digfin $s 64").in("digm"),
		st("digest key without init", "digkey $s $aes"),
		st("digest sensitive key init", "diginit $s %s", mech(p.CKM_SHA256)).in("digs"),
		st("digest sensitive key", "digkey $s $saes").in("digs"),
		st("digest after sensitive key", "digfin $s 64").in("digs"),
		st("digest with parameter", "diginit $s %s", mech(p.CKM_SHA256, "x", "01")),
	)
	// Signatures: HMAC (deterministic), RSA PKCS#1 v1.5 (deterministic),
	// PSS and ECDSA (random: verified), recovery, errors at Init.
	add(
		st("HMAC with short key", "signinit $s %s $hmac4", mech(p.CKM_SHA256_HMAC)),
		st("HMAC sign init", "signinit $s %s $hmac", mech(p.CKM_SHA256_HMAC)).in("hmac"),
		st("HMAC sign query", "sign $s %s -", data32).in("hmac"),
		st("HMAC sign too small", "sign $s %s 4", data32).in("hmac"),
		st("HMAC sign", "sign $s %s 64", data32).in("hmac").saving("mac=out"),
		st("HMAC verify init", "verinit $s %s $hmac", mech(p.CKM_SHA256_HMAC)).in("hmacv"),
		st("HMAC verify", "ver $s %s $mac", data32).in("hmacv"),
		st("HMAC verify wrong init", "verinit $s %s $hmac", mech(p.CKM_SHA256_HMAC)).in("hmacw"),
		st("HMAC verify wrong", "ver $s %s $mac", data20).in("hmacw"),
		st("HMAC verify short init", "verinit $s %s $hmac", mech(p.CKM_SHA256_HMAC)).in("hmacl"),
		st("HMAC verify short", "ver $s %s 0102", data32).in("hmacl"),
		st("HMAC multi init", "signinit $s %s $hmac", mech(p.CKM_SHA256_HMAC)).in("hmacm"),
		st("HMAC update", "signupd $s %s", data20).in("hmacm"),
		st("HMAC update 2", "signupd $s %s", data32).in("hmacm"),
		st("HMAC final query", "signfin $s -").in("hmacm"),
		st("HMAC final", "signfin $s 64").in("hmacm").saving("mmac=out"),
		st("HMAC multi verify init", "verinit $s %s $hmac", mech(p.CKM_SHA256_HMAC)).in("hmacmv"),
		st("HMAC verify update", "verupd $s %s", data20+data32).in("hmacmv"),
		st("HMAC verify final", "verfin $s $mmac").in("hmacmv"),
		st("sign final without init", "signfin $s 64"),
		st("RSA sign with public key", "signinit $s %s $rsapub", mech(p.CKM_SHA256_RSA_PKCS)),
		st("RSA sign init", "signinit $s %s $rsa", mech(p.CKM_SHA256_RSA_PKCS)).in("rsa"),
		st("RSA sign query", "sign $s %s -", data32).in("rsa"),
		st("RSA sign", "sign $s %s 512", data32).in("rsa").saving("rsig=out"),
		st("RSA verify init", "verinit $s %s $rsapub", mech(p.CKM_SHA256_RSA_PKCS)).in("rsav"),
		st("RSA verify", "ver $s %s $rsig", data32).in("rsav"),
		st("RSA raw PKCS sign init", "signinit $s %s $rsa", mech(p.CKM_RSA_PKCS)).in("rsa1"),
		st("RSA raw PKCS sign", "sign $s %s 512", data20).in("rsa1"),
		st("RSA PSS bad parameters", "signinit $s %s $rsa", mech(p.CKM_SHA256_RSA_PKCS_PSS, "x", "0102")),
		st("RSA PSS sign init", "signinit $s %s $rsa", mech(p.CKM_SHA256_RSA_PKCS_PSS, "pss", "0x250", "2", "32")).in("pss"),
		st("RSA PSS sign", "sign $s %s 512", data32).in("pss").saving("psig=out").skipping("out"),
		st("RSA PSS verify init", "verinit $s %s $rsapub", mech(p.CKM_SHA256_RSA_PKCS_PSS, "pss", "0x250", "2", "32")).in("pssv"),
		st("RSA PSS verify", "ver $s %s $psig", data32).in("pssv"),
		st("sign recover init", "srinit $s %s $rsa", mech(p.CKM_RSA_PKCS)).in("sr"),
		st("sign recover", "sr $s %s 512", data20).in("sr"),
		st("verify recover init", "vrinit $s %s $rsapub", mech(p.CKM_RSA_PKCS)).in("vr"),
		st("verify recover", "vr $s $rsig 512").in("vr"),
		st("ECDSA sign init", "signinit $s %s $ec", mech(p.CKM_ECDSA)).in("ecdsa"),
		st("ECDSA sign query", "sign $s %s -", data32).in("ecdsa"),
		st("ECDSA sign", "sign $s %s 128", data32).in("ecdsa").saving("esig=out").skipping("out"),
		st("ECDSA verify init", "verinit $s %s $ecpub", mech(p.CKM_ECDSA)).in("ecdsav"),
		st("ECDSA verify", "ver $s %s $esig", data32).in("ecdsav"),
		st("ECDSA verify tampered init", "verinit $s %s $ecpub", mech(p.CKM_ECDSA)).in("ecdsat"),
		st("ECDSA verify tampered", "ver $s %s $esig", data20).in("ecdsat"),
		st("ECDSA with AES key", "signinit $s %s $aes", mech(p.CKM_ECDSA)),
	)
	// RSA OAEP (random ciphertext: decrypted), OAEP parameter errors.
	oaep := mech(p.CKM_RSA_PKCS_OAEP, "oaep", "0x220", "1") // SHA-1, MGF1-SHA1
	add(
		st("OAEP encrypt init", "encinit $s %s $rsapub", oaep).in("oaep"),
		st("OAEP encrypt query", "enc $s %s -", data20).in("oaep"),
		st("OAEP encrypt", "enc $s %s 512", data20).in("oaep").saving("oct=out").skipping("out"),
		st("OAEP decrypt init", "decinit $s %s $rsa", oaep).in("oaepd"),
		st("OAEP decrypt query", "dec $s $oct -").in("oaepd"),
		st("OAEP decrypt", "dec $s $oct 512").in("oaepd"),
		st("OAEP mismatched hash", "decinit $s %s $rsa", mech(p.CKM_RSA_PKCS_OAEP, "oaep", "0x250", "1")),
		st("OAEP with SHA-256", "encinit $s %s $rsapub", mech(p.CKM_RSA_PKCS_OAEP, "oaep", "0x250", "2")),
		st("OAEP without parameters", "decinit $s %s $rsa", mech(p.CKM_RSA_PKCS_OAEP)),
	)
	// Key generation, wrap and unwrap, derive (ECDH).
	sessionSecret := tpl(tu(p.CKA_CLASS, p.CKO_SECRET_KEY), tu(p.CKA_KEY_TYPE, p.CKK_GENERIC_SECRET), tb(p.CKA_TOKEN, false),
		tb(p.CKA_SENSITIVE, false), tb(p.CKA_EXTRACTABLE, true), tb(p.CKA_SIGN, true), tb(p.CKA_VERIFY, true))
	add(
		st("generate AES key", "genkey $s %s %s", mech(p.CKM_AES_KEY_GEN), tpl(tu(p.CKA_VALUE_LEN, 16), tb(p.CKA_TOKEN, false), tb(p.CKA_ENCRYPT, true), ts(p.CKA_LABEL, "cf-gen"))).saving("gen=h"),
		st("generated key attributes", "getattr $s $gen %s", tpl(gb(p.CKA_VALUE_LEN, 8), gb(p.CKA_LOCAL, 1), gb(p.CKA_KEY_GEN_MECHANISM, 8), gb(p.CKA_CLASS, 8), gq(p.CKA_VALUE))),
		st("generate AES key without length", "genkey $s %s %s", mech(p.CKM_AES_KEY_GEN), tpl(tb(p.CKA_TOKEN, false))),
		st("generate AES key of 3 bytes", "genkey $s %s %s", mech(p.CKM_AES_KEY_GEN), tpl(tu(p.CKA_VALUE_LEN, 3), tb(p.CKA_TOKEN, false))),
		st("generate with inconsistent class", "genkey $s %s %s", mech(p.CKM_AES_KEY_GEN), tpl(tu(p.CKA_VALUE_LEN, 16), tu(p.CKA_CLASS, p.CKO_PRIVATE_KEY), tb(p.CKA_TOKEN, false))),
		st("generate EC key pair", "genkp $s %s %s %s", mech(p.CKM_EC_KEY_PAIR_GEN), tpl(tx(p.CKA_EC_PARAMS, p256), tb(p.CKA_TOKEN, false), tb(p.CKA_VERIFY, true)),
			tpl(tb(p.CKA_TOKEN, false), tb(p.CKA_SIGN, true), tb(p.CKA_SENSITIVE, true))).saving("gpub=h", "gpriv=h2"),
		st("generated EC point length", "getattr $s $gpub %s", tpl(gq(p.CKA_EC_POINT), gb(p.CKA_LOCAL, 1))),
		st("generated EC private value", "getattr $s $gpriv %s", tpl(gq(p.CKA_VALUE), gb(p.CKA_SIGN, 1), gb(p.CKA_ALWAYS_SENSITIVE, 1))),
		st("generate EC key pair without parameters", "genkp $s %s %s %s", mech(p.CKM_EC_KEY_PAIR_GEN), tpl(tb(p.CKA_TOKEN, false)), tpl(tb(p.CKA_TOKEN, false))),
		st("wrap query", "wrap $s %s $aes $hmac -", mech(p.CKM_AES_KEY_WRAP)),
		st("wrap too small", "wrap $s %s $aes $hmac 8", mech(p.CKM_AES_KEY_WRAP)),
		st("wrap", "wrap $s %s $aes $hmac 128", mech(p.CKM_AES_KEY_WRAP)).saving("wrapped=out"),
		st("wrap unextractable key", "wrap $s %s $aes $saes 128", mech(p.CKM_AES_KEY_WRAP)),
		st("wrap with bad wrapping key", "wrap $s %s %d $hmac 128", mech(p.CKM_AES_KEY_WRAP), badH),
		st("unwrap", "unwrap $s %s $aes $wrapped %s", mech(p.CKM_AES_KEY_WRAP), sessionSecret).saving("uw=h"),
		st("unwrapped value", "getattr $s $uw %s", tpl(gb(p.CKA_VALUE, 64), gb(p.CKA_LOCAL, 1), gb(p.CKA_NEVER_EXTRACTABLE, 1))),
		st("unwrapped key signs as the original", "signinit $s %s $uw", mech(p.CKM_SHA256_HMAC)).in("uwsign"),
		st("unwrapped key signature", "sign $s %s 64", data32).in("uwsign"),
		st("unwrap without class", "unwrap $s %s $aes $wrapped %s", mech(p.CKM_AES_KEY_WRAP), tpl(tb(p.CKA_TOKEN, false))),
		st("ECDH derive", "derive $s %s $ec %s", mech(p.CKM_ECDH1_DERIVE, "ecdh", "1", hex.EncodeToString(point(&k.ecPeer.PublicKey))),
			tpl(tu(p.CKA_CLASS, p.CKO_SECRET_KEY), tu(p.CKA_KEY_TYPE, p.CKK_GENERIC_SECRET), tu(p.CKA_VALUE_LEN, 32), tb(p.CKA_TOKEN, false),
				tb(p.CKA_SENSITIVE, false), tb(p.CKA_EXTRACTABLE, true))).saving("dk=h"),
		st("ECDH derived value", "getattr $s $dk %s", tpl(gb(p.CKA_VALUE, 64), gb(p.CKA_LOCAL, 1))),
		st("derive with AES key", "derive $s %s $aes %s", mech(p.CKM_ECDH1_DERIVE, "ecdh", "1", hex.EncodeToString(point(&k.ecPeer.PublicKey))),
			tpl(tu(p.CKA_CLASS, p.CKO_SECRET_KEY), tu(p.CKA_KEY_TYPE, p.CKK_GENERIC_SECRET), tu(p.CKA_VALUE_LEN, 32), tb(p.CKA_TOKEN, false))),
	)
	// PINs and the token, cleanup, logout, close, finalize.
	add(
		st("destroy data object", "destroy $s $d"),
		st("destroy AES key", "destroy $s $aes"),
		st("destroy sensitive AES key", "destroy $s $saes"),
		st("destroy HMAC key", "destroy $s $hmac"),
		st("destroy short HMAC key", "destroy $s $hmac4"),
		st("destroy RSA private key", "destroy $s $rsa"),
		st("destroy RSA public key", "destroy $s $rsapub"),
		st("destroy EC private key", "destroy $s $ec"),
		st("destroy EC public key", "destroy $s $ecpub"),
		st("destroy generated key", "destroy $s $gen"),
		st("no objects left", "findinit $s %s", tpl(tb(p.CKA_TOKEN, true))),
		st("count objects left", "find $s 100"),
		st("end search", "findfin $s"),
		st("set PIN wrong old", "setpin $s bad new"),
		st("set PIN", "setpin $s user new"),
		st("set PIN back", "setpin $s new user"),
		st("init PIN as user", "initpin $s user"),
		st("logout", "logout $s"),
		st("logout twice", "logout $s"),
		st("session info after logout", "sessinfo $s"),
		st("login SO with RO session", "login $s 0 so"),
		st("init token with sessions", "inittoken bad %s", label),
		st("close all", "closeall"),
		st("session after close all", "sessinfo $s"),
		st("init token wrong SO PIN", "inittoken bad %s", label),
		st("token info at end", "tokeninfo"),
		st("finalize", "fin"),
		st("finalize again", "fin"),
	)
	return withOpSessions(steps)
}

// generalErrors is the sequence of requests SoftHSM answers with
// CKR_GENERAL_ERROR (a blob that does not unwrap, a point not on the
// curve): a request error on a bare token, after which its sessions live
// on. It runs last, on session objects, and checks the session after each.
func generalErrors(t testing.TB) []step {
	k := testKeys(t)
	sessionSecret := tpl(tu(p.CKA_CLASS, p.CKO_SECRET_KEY), tu(p.CKA_KEY_TYPE, p.CKK_GENERIC_SECRET), tb(p.CKA_TOKEN, false),
		tb(p.CKA_SENSITIVE, false), tb(p.CKA_EXTRACTABLE, true), tb(p.CKA_SIGN, true))
	return []step{
		st("general: init", "init"),
		st("general: select slot", "slot %s", label),
		st("general: open", "open 0x%x", rw).saving("s=h"),
		st("general: login", "login $s 1 user"),
		st("general: session AES key", "create $s %s", tpl(tu(p.CKA_CLASS, p.CKO_SECRET_KEY), tu(p.CKA_KEY_TYPE, p.CKK_AES), tb(p.CKA_TOKEN, false),
			tb(p.CKA_UNWRAP, true), tb(p.CKA_DECRYPT, true), tb(p.CKA_WRAP, true), tx(p.CKA_VALUE, k.aes))).saving("aes=h"),
		st("general: session EC key", "create $s %s", tpl(tu(p.CKA_CLASS, p.CKO_PRIVATE_KEY), tu(p.CKA_KEY_TYPE, p.CKK_EC), tb(p.CKA_TOKEN, false),
			tb(p.CKA_DERIVE, true), tx(p.CKA_EC_PARAMS, p256), tx(p.CKA_VALUE, k.ec.D.FillBytes(make([]byte, 32))))).saving("ec=h"),
		st("general: unwrap garbage", "unwrap $s %s $aes %s %s", mech(p.CKM_AES_KEY_WRAP), hex.EncodeToString(seq(40, 3)), sessionSecret),
		st("general: session after unwrap garbage", "sessinfo $s"),
		// An empty blob (what the run under kill sent when the wrap before
		// it failed) crashed the member's server: CKR_DEVICE_ERROR, and the
		// group went down.
		st("general: unwrap an empty blob", "unwrap $s %s $aes . %s", mech(p.CKM_AES_KEY_WRAP), sessionSecret),
		st("general: unwrap no blob", "unwrap $s %s $aes - %s", mech(p.CKM_AES_KEY_WRAP), sessionSecret),
		st("general: unwrap a one-byte blob", "unwrap $s %s $aes 00 %s", mech(p.CKM_AES_KEY_WRAP), sessionSecret),
		st("general: session after short blobs", "sessinfo $s"),
		st("general: ECDH derive bad point", "derive $s %s $ec %s", mech(p.CKM_ECDH1_DERIVE, "ecdh", "1", "0102"),
			tpl(tu(p.CKA_CLASS, p.CKO_SECRET_KEY), tu(p.CKA_KEY_TYPE, p.CKK_GENERIC_SECRET), tu(p.CKA_VALUE_LEN, 32), tb(p.CKA_TOKEN, false))),
		st("general: session after bad point", "sessinfo $s"),
		st("general: decrypt with wrong padding init", "decinit $s %s $aes", mech(p.CKM_AES_CBC_PAD, "x", hex.EncodeToString(seq(16, 0xc0)))).in("cbc-bad"),
		st("general: decrypt with wrong padding", "dec $s %s 64", hex.EncodeToString(seq(32, 0))).in("cbc-bad"),
		st("general: session after wrong padding", "sessinfo $s"),
		st("general: random after errors", "random $s 16").skipping("out"),
		st("general: logout", "logout $s"),
		st("general: finalize", "fin"),
	}
}

// cleanup destroys every object a user sees (between runs on one world).
func cleanup() []step {
	return []step{
		st("cleanup: init", "init"),
		st("cleanup: select slot", "slot %s", label),
		st("cleanup: open", "open 0x%x", rw).saving("s=h"),
		st("cleanup: login", "login $s 1 user"),
		st("cleanup: destroy all", "destroyall $s"),
		st("cleanup: finalize", "fin"),
	}
}

// withOpSessions runs each operation on the operation session $o and
// closes and reopens it after each (an Init one side refused and the other
// took must not change the steps after it). Every *Init is an operation,
// of its own unless it says which.
func withOpSessions(in []step) []step {
	var out []step
	for i, s := range in {
		verb, _, _ := strings.Cut(s.call, " ")
		if s.op == "" && strings.HasSuffix(verb, "init") && verb != "init" && verb != "findinit" {
			s.op = s.name
		}
		if s.op == "" {
			out = append(out, s)
			continue
		}
		s.call = strings.Replace(s.call, " $s ", " $o ", 1)
		if strings.HasSuffix(s.call, " $s") {
			s.call = strings.TrimSuffix(s.call, "$s") + "$o"
		}
		out = append(out, s)
		if i+1 == len(in) || in[i+1].op != s.op {
			out = append(out,
				st("end "+s.op+": close", "close $o"),
				st("end "+s.op+": open", "open 0x%x", rw).saving("o=h"))
		}
	}
	return out
}
