package conformance

import (
	"encoding/hex"
	"fmt"
	"testing"

	p "github.com/miekg/pkcs11"
)

// operationStates mixes operations in one session, as the bare token
// sees them: an Init while another operation is active, single-part calls
// after an update and updates after a single-part call, a search during
// an operation, and keys used against their usage attributes.
func operationStates(t testing.TB) []step {
	k := testKeys(t)
	steps := sweepPreamble("ops", k)
	add := func(s ...step) { steps = append(steps, s...) }
	data := hex.EncodeToString(seq(32, 5))
	add(
		st("ops: HMAC key", "create $s %s", tpl(tu(p.CKA_CLASS, p.CKO_SECRET_KEY), tu(p.CKA_KEY_TYPE, p.CKK_GENERIC_SECRET), tb(p.CKA_TOKEN, false),
			tb(p.CKA_SIGN, true), tb(p.CKA_VERIFY, true), tx(p.CKA_VALUE, k.hmac))).saving("hmac=h"),
		st("ops: unusable AES key", "create $s %s", tpl(tu(p.CKA_CLASS, p.CKO_SECRET_KEY), tu(p.CKA_KEY_TYPE, p.CKK_AES), tb(p.CKA_TOKEN, false),
			tb(p.CKA_ENCRYPT, false), tb(p.CKA_DECRYPT, false), tb(p.CKA_WRAP, false), tb(p.CKA_UNWRAP, false), tb(p.CKA_SIGN, false),
			tb(p.CKA_VERIFY, false), tb(p.CKA_DERIVE, false), tx(p.CKA_VALUE, k.aes))).saving("bad=h"),
	)
	// Two operations at once in one session.
	for _, first := range []struct{ name, init, end string }{
		{"encrypt", fmt.Sprintf("encinit $s %s $aes", mech(p.CKM_AES_ECB)), fmt.Sprintf("enc $s %s 64", data)},
		{"decrypt", fmt.Sprintf("decinit $s %s $aes", mech(p.CKM_AES_ECB)), fmt.Sprintf("dec $s %s 64", data)},
		{"digest", fmt.Sprintf("diginit $s %s", mech(p.CKM_SHA256)), fmt.Sprintf("dig $s %s 64", data)},
		{"sign", fmt.Sprintf("signinit $s %s $hmac", mech(p.CKM_SHA256_HMAC)), fmt.Sprintf("sign $s %s 64", data)},
		{"find", fmt.Sprintf("findinit $s %s", tpl(tu(p.CKA_CLASS, p.CKO_SECRET_KEY))), "findfin $s"},
	} {
		name := "ops: " + first.name + " active"
		add(st(name+": init", "%s", first.init))
		for _, second := range []struct{ name, call string }{
			{"encrypt init", fmt.Sprintf("encinit $s %s $aes", mech(p.CKM_AES_ECB))},
			{"decrypt init", fmt.Sprintf("decinit $s %s $aes", mech(p.CKM_AES_ECB))},
			{"digest init", fmt.Sprintf("diginit $s %s", mech(p.CKM_SHA256))},
			{"sign init", fmt.Sprintf("signinit $s %s $hmac", mech(p.CKM_SHA256_HMAC))},
			{"verify init", fmt.Sprintf("verinit $s %s $hmac", mech(p.CKM_SHA256_HMAC))},
			{"find init", fmt.Sprintf("findinit $s %s", tpl(tu(p.CKA_CLASS, p.CKO_SECRET_KEY)))},
			{"generate key", fmt.Sprintf("genkey $s %s %s", mech(p.CKM_AES_KEY_GEN), tpl(tu(p.CKA_VALUE_LEN, 16), tb(p.CKA_TOKEN, false)))},
			{"random", "random $s 4"},
		} {
			s := st(name+": "+second.name, "%s", second.call)
			if second.name == "random" || second.name == "generate key" {
				s = s.skipping("out")
			}
			add(s)
		}
		add(st(name+": end", "%s", first.end).skipping("out"))
		// Whatever the second Init started, end it.
		add(
			st(name+": end encrypt", "enc $s %s 64", data),
			st(name+": end decrypt", "dec $s %s 64", data),
			st(name+": end digest", "dig $s %s 64", data),
			st(name+": end sign", "sign $s %s 64", data),
			st(name+": end verify", "ver $s %s %s", data, data),
			st(name+": end find", "findfin $s"),
		)
	}
	// Single-part after multi-part and back.
	add(
		st("ops: digest update then single init", "diginit $s %s", mech(p.CKM_SHA256)),
		st("ops: digest update then single update", "digupd $s %s", data),
		st("ops: digest update then single", "dig $s %s 64", data),
		st("ops: digest update then single final", "digfin $s 64"),
		st("ops: sign single then update init", "signinit $s %s $hmac", mech(p.CKM_SHA256_HMAC)),
		st("ops: sign single then update query", "sign $s %s -", data),
		st("ops: sign single then update", "signupd $s %s", data),
		st("ops: sign single then update final", "signfin $s 64"),
		st("ops: sign update then single init", "signinit $s %s $hmac", mech(p.CKM_SHA256_HMAC)),
		st("ops: sign update then single update", "signupd $s %s", data),
		st("ops: sign update then single", "sign $s %s 64", data),
		st("ops: sign update then single final", "signfin $s 64"),
		st("ops: encrypt update then single init", "encinit $s %s $aes", mech(p.CKM_AES_ECB)),
		st("ops: encrypt update then single update", "encupd $s %s 64", data),
		st("ops: encrypt update then single", "enc $s %s 64", data),
		st("ops: encrypt update then single final", "encfin $s 64"),
	)
	// Keys against their usage attributes.
	add(
		st("ops: encrypt without CKA_ENCRYPT", "encinit $s %s $bad", mech(p.CKM_AES_ECB)),
		st("ops: decrypt without CKA_DECRYPT", "decinit $s %s $bad", mech(p.CKM_AES_ECB)),
		st("ops: sign without CKA_SIGN", "signinit $s %s $bad", mech(p.CKM_AES_CMAC)),
		st("ops: verify without CKA_VERIFY", "verinit $s %s $bad", mech(p.CKM_AES_CMAC)),
		st("ops: verify without CKA_VERIFY, end", "ver $s %s %s", data, data),
		st("ops: wrap without CKA_WRAP", "wrap $s %s $bad $aes -", mech(p.CKM_AES_KEY_WRAP)),
		st("ops: wrapped without CKA_EXTRACTABLE", "wrap $s %s $aes $bad -", mech(p.CKM_AES_KEY_WRAP)),
		st("ops: derive without CKA_DERIVE", "derive $s %s $bad %s", mech(p.CKM_AES_ECB_ENCRYPT_DATA, "str", hex.EncodeToString(seq(16, 1))),
			tpl(tu(p.CKA_CLASS, p.CKO_SECRET_KEY), tu(p.CKA_KEY_TYPE, p.CKK_GENERIC_SECRET), tu(p.CKA_VALUE_LEN, 16), tb(p.CKA_TOKEN, false))),
		st("ops: digest with a sign mechanism", "diginit $s %s", mech(p.CKM_SHA256_HMAC)),
		st("ops: sign with a digest mechanism", "signinit $s %s $hmac", mech(p.CKM_SHA256)),
		st("ops: encrypt with the RSA public key and ECB", "encinit $s %s $rsapub", mech(p.CKM_AES_ECB)),
		st("ops: sign with the RSA public key", "signinit $s %s $rsapub", mech(p.CKM_SHA256_RSA_PKCS)),
		st("ops: verify with the RSA private key", "verinit $s %s $rsa", mech(p.CKM_SHA256_RSA_PKCS)),
		st("ops: decrypt with the RSA public key", "decinit $s %s $rsapub", mech(p.CKM_RSA_PKCS)),
	)
	add(sweepEnd("ops")...)
	return steps
}
