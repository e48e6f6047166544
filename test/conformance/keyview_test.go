package conformance

import (
	"encoding/hex"
	"fmt"
	"testing"

	"github.com/hagroup/hagroup/pkg/slot"
	p "github.com/miekg/pkcs11"
)

// asked is the protection a template asks for: "" leaves the attribute
// out (the token's default).
type asked struct{ sensitive, extractable string }

func (a asked) String() string {
	return fmt.Sprintf("sensitive=%s extractable=%s", or(a.sensitive, "-"), or(a.extractable, "-"))
}

func (a asked) items() []string {
	var out []string
	if a.sensitive != "" {
		out = append(out, tb(p.CKA_SENSITIVE, a.sensitive == "t"))
	}
	if a.extractable != "" {
		out = append(out, tb(p.CKA_EXTRACTABLE, a.extractable == "t"))
	}
	return out
}

func or(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// protections are every combination a template can ask for.
func protections() []asked {
	var out []asked
	for _, s := range []string{"", "f", "t"} {
		for _, e := range []string{"", "f", "t"} {
			out = append(out, asked{s, e})
		}
	}
	return out
}

// protectionAttrs reads what the application sees of a key's protection;
// value asks CKA_VALUE with a buffer (a value made outside the token) or
// with one byte of room (one the token chose: readable or not, whatever
// its length — SoftHSM gives an EC private value without its leading zero
// bytes, 31 bytes once in 256 keys).
func protectionAttrs(value bool) string {
	v := gb(p.CKA_VALUE, 1)
	if value {
		v = gb(p.CKA_VALUE, 128)
	}
	return tpl(v, gb(p.CKA_SENSITIVE, 1), gb(p.CKA_ALWAYS_SENSITIVE, 1), gb(p.CKA_EXTRACTABLE, 1), gb(p.CKA_NEVER_EXTRACTABLE, 1))
}

// keyViews makes keys every way (create, generate, generate pair, unwrap,
// derive, copy) with every protection a template can ask, reads what the
// application sees of them, moves the latching attributes both ways, tries
// every read-only attribute, and wraps what is left extractable.
func keyViews(t testing.TB) []step {
	k := testKeys(t)
	steps := sweepPreamble("keys", k)
	add := func(s ...step) { steps = append(steps, s...) }
	secret := func(extra ...string) string {
		return tpl(append([]string{tu(p.CKA_CLASS, p.CKO_SECRET_KEY), tb(p.CKA_TOKEN, false), tb(p.CKA_SIGN, true), tb(p.CKA_VERIFY, true)}, extra...)...)
	}
	// A blob of a readable generic secret under $aes (deterministic: the
	// value and the wrapping key are fixed).
	add(
		st("keys: readable key to wrap", "create $s %s", secret(tu(p.CKA_KEY_TYPE, p.CKK_GENERIC_SECRET), tb(p.CKA_SENSITIVE, false), tb(p.CKA_EXTRACTABLE, true),
			tx(p.CKA_VALUE, k.hmac))).saving("plain=h"),
		st("keys: wrap it", "wrap $s %s $aes $plain 128", mech(p.CKM_AES_KEY_WRAP)).saving("blob=out"),
	)
	peer := hex.EncodeToString(point(&k.ecPeer.PublicKey))
	for _, a := range protections() {
		makers := []struct {
			how, call string
			value     bool
		}{
			{"create", fmt.Sprintf("create $s %s", secret(append([]string{tu(p.CKA_KEY_TYPE, p.CKK_AES), tx(p.CKA_VALUE, k.aes)}, a.items()...)...)), true},
			{"generate", fmt.Sprintf("genkey $s %s %s", mech(p.CKM_AES_KEY_GEN), secret(append([]string{tu(p.CKA_VALUE_LEN, 32)}, a.items()...)...)), false},
			{"generate generic secret", fmt.Sprintf("genkey $s %s %s", mech(p.CKM_GENERIC_SECRET_KEY_GEN), secret(append([]string{tu(p.CKA_VALUE_LEN, 32)}, a.items()...)...)), false},
			{"unwrap", fmt.Sprintf("unwrap $s %s $aes $blob %s", mech(p.CKM_AES_KEY_WRAP), secret(append([]string{tu(p.CKA_KEY_TYPE, p.CKK_GENERIC_SECRET)}, a.items()...)...)), true},
			{"derive", fmt.Sprintf("derive $s %s $ec %s", mech(p.CKM_ECDH1_DERIVE, "ecdh", "1", peer),
				secret(append([]string{tu(p.CKA_KEY_TYPE, p.CKK_GENERIC_SECRET), tu(p.CKA_VALUE_LEN, 32)}, a.items()...)...)), true},
			{"copy", fmt.Sprintf("copy $s $plain %s", tpl(a.items()...)), true},
		}
		for _, m := range makers {
			name := fmt.Sprintf("keys: %s %s", m.how, a)
			add(
				st(name, "%s", m.call).saving("k=h"),
				st(name+": protection", "getattr $s $k %s", protectionAttrs(m.value)),
				st(name+": wrap", "wrap $s %s $aes $k -", mech(p.CKM_AES_KEY_WRAP)),
			)
		}
		for _, kp := range []struct{ how, call string }{
			{"EC pair", fmt.Sprintf("genkp $s %s %s %s", mech(p.CKM_EC_KEY_PAIR_GEN), tpl(tx(p.CKA_EC_PARAMS, p256), tb(p.CKA_TOKEN, false)),
				tpl(append([]string{tb(p.CKA_TOKEN, false), tb(p.CKA_SIGN, true)}, a.items()...)...))},
			{"EC import", fmt.Sprintf("create $s %s", tpl(append([]string{tu(p.CKA_CLASS, p.CKO_PRIVATE_KEY), tu(p.CKA_KEY_TYPE, p.CKK_EC), tb(p.CKA_TOKEN, false),
				tb(p.CKA_SIGN, true), tx(p.CKA_EC_PARAMS, p256), tx(p.CKA_VALUE, k.ec.D.FillBytes(make([]byte, 32)))}, a.items()...)...))},
		} {
			name := fmt.Sprintf("keys: %s %s", kp.how, a)
			add(
				st(name, "%s", kp.call).saving("k=h", "kp=h2"),
				st(name+": protection", "getattr $s $kp %s", protectionAttrs(false)),
			)
		}
	}
	// Imported in a read-only session.
	add(
		st("keys: open read-only", "open 0x%x", ro).saving("ro=h"),
		st("keys: import in read-only session", "create $ro %s", secret(tu(p.CKA_KEY_TYPE, p.CKK_AES), tx(p.CKA_VALUE, k.aes), tb(p.CKA_SENSITIVE, true))).saving("rok=h"),
		st("keys: read-only import protection", "getattr $ro $rok %s", protectionAttrs(true)),
		st("keys: close read-only", "close $ro"),
	)
	// Latching: each starting point, each way, read back after each.
	for _, a := range []asked{{"f", "t"}, {"t", "t"}, {"f", "f"}, {"t", "f"}} {
		for _, how := range []string{"create", "generate"} {
			name := fmt.Sprintf("latch: %s %s", how, a)
			call := fmt.Sprintf("create $s %s", secret(append([]string{tu(p.CKA_KEY_TYPE, p.CKK_GENERIC_SECRET), tx(p.CKA_VALUE, k.hmac)}, a.items()...)...))
			if how == "generate" {
				call = fmt.Sprintf("genkey $s %s %s", mech(p.CKM_GENERIC_SECRET_KEY_GEN), secret(append([]string{tu(p.CKA_VALUE_LEN, 32)}, a.items()...)...))
			}
			v := how == "create"
			add(
				st(name, "%s", call).saving("k=h"),
				st(name+": sensitive on", "setattr $s $k %s", tpl(tb(p.CKA_SENSITIVE, true))),
				st(name+": after sensitive on", "getattr $s $k %s", protectionAttrs(v)),
				st(name+": sensitive off", "setattr $s $k %s", tpl(tb(p.CKA_SENSITIVE, false))),
				st(name+": after sensitive off", "getattr $s $k %s", protectionAttrs(v)),
				st(name+": extractable off", "setattr $s $k %s", tpl(tb(p.CKA_EXTRACTABLE, false))),
				st(name+": after extractable off", "getattr $s $k %s", protectionAttrs(v)),
				st(name+": extractable on", "setattr $s $k %s", tpl(tb(p.CKA_EXTRACTABLE, true))),
				st(name+": after extractable on", "getattr $s $k %s", protectionAttrs(v)),
				st(name+": wrap", "wrap $s %s $aes $k -", mech(p.CKM_AES_KEY_WRAP)),
				st(name+": copy made sensitive", "copy $s $k %s", tpl(tb(p.CKA_SENSITIVE, true))).saving("kc=h"),
				st(name+": copy's protection", "getattr $s $kc %s", protectionAttrs(v)),
				st(name+": copy made extractable", "copy $s $k %s", tpl(tb(p.CKA_EXTRACTABLE, true))),
				st(name+": copy made readable", "copy $s $k %s", tpl(tb(p.CKA_SENSITIVE, false))),
			)
		}
	}
	// Every read-only attribute, and the attributes that only move one
	// way, on a token secret key and an imported RSA key.
	add(st("read-only: token key", "create $s %s", tpl(tu(p.CKA_CLASS, p.CKO_SECRET_KEY), tu(p.CKA_KEY_TYPE, p.CKK_GENERIC_SECRET), tb(p.CKA_TOKEN, true),
		tb(p.CKA_PRIVATE, true), ts(p.CKA_LABEL, "cf-latch"), tb(p.CKA_SIGN, true), tb(p.CKA_SENSITIVE, false), tb(p.CKA_EXTRACTABLE, true),
		tx(p.CKA_VALUE, k.hmac))).saving("tk=h"))
	for _, a := range []struct {
		name string
		item string
	}{
		{"class", tu(p.CKA_CLASS, p.CKO_DATA)},
		{"key type", tu(p.CKA_KEY_TYPE, p.CKK_AES)},
		{"token", tb(p.CKA_TOKEN, false)},
		{"private", tb(p.CKA_PRIVATE, false)},
		{"local", tb(p.CKA_LOCAL, true)},
		{"always sensitive", tb(p.CKA_ALWAYS_SENSITIVE, true)},
		{"never extractable", tb(p.CKA_NEVER_EXTRACTABLE, true)},
		{"key gen mechanism", tu(p.CKA_KEY_GEN_MECHANISM, p.CKM_AES_KEY_GEN)},
		{"value", tx(p.CKA_VALUE, seq(32, 1))},
		{"value length", tu(p.CKA_VALUE_LEN, 16)},
		{"check value", tx(p.CKA_CHECK_VALUE, seq(3, 1))},
		{"trusted", tb(p.CKA_TRUSTED, true)},
		{"wrap with trusted on", tb(p.CKA_WRAP_WITH_TRUSTED, true)},
		{"wrap with trusted off", tb(p.CKA_WRAP_WITH_TRUSTED, false)},
		{"copyable on", tb(p.CKA_COPYABLE, true)},
		{"destroyable", tb(p.CKA_DESTROYABLE, false)},
		{"label", ts(p.CKA_LABEL, "cf-latch")},
		{"sign off", tb(p.CKA_SIGN, false)},
		{"sensitive on", tb(p.CKA_SENSITIVE, true)},
		{"sensitive off", tb(p.CKA_SENSITIVE, false)},
		{"extractable off", tb(p.CKA_EXTRACTABLE, false)},
		{"extractable on", tb(p.CKA_EXTRACTABLE, true)},
		{"copyable off", tb(p.CKA_COPYABLE, false)},
		{"copyable on again", tb(p.CKA_COPYABLE, true)},
		{"modifiable off", tb(p.CKA_MODIFIABLE, false)},
		{"label when not modifiable", ts(p.CKA_LABEL, "cf-latch2")},
	} {
		add(st("read-only: set "+a.name, "setattr $s $tk %s", tpl(a.item)))
	}
	add(
		st("read-only: token key at end", "getattr $s $tk %s", tpl(gq(p.CKA_VALUE), gb(p.CKA_SENSITIVE, 1), gb(p.CKA_ALWAYS_SENSITIVE, 1),
			gb(p.CKA_EXTRACTABLE, 1), gb(p.CKA_NEVER_EXTRACTABLE, 1), gb(p.CKA_COPYABLE, 1), gb(p.CKA_MODIFIABLE, 1), gb(p.CKA_SIGN, 1), gb(p.CKA_LABEL, 32))),
		st("read-only: destroy token key", "destroy $s $tk"),
		st("read-only: set modulus", "setattr $s $rsa %s", tpl(tx(p.CKA_MODULUS, seq(8, 1)))),
		st("read-only: set public exponent", "setattr $s $rsapub %s", tpl(tx(p.CKA_PUBLIC_EXPONENT, []byte{3}))),
		st("read-only: set EC params", "setattr $s $ec %s", tpl(tx(p.CKA_EC_PARAMS, p256))),
	)
	// HMAC keys generated on the token (issue 30, item 5).
	add(
		st("HMAC: generate generic secret", "genkey $s %s %s", mech(p.CKM_GENERIC_SECRET_KEY_GEN), secret(tu(p.CKA_VALUE_LEN, 32))).saving("hk=h"),
		st("HMAC: generic secret length", "getattr $s $hk %s", tpl(gb(p.CKA_VALUE_LEN, 8), gb(p.CKA_KEY_TYPE, 8))),
	)
	for _, hm := range []uint{p.CKM_SHA256_HMAC, p.CKM_SHA_1_HMAC, p.CKM_SHA512_HMAC} {
		name := fmt.Sprintf("HMAC 0x%x", hm)
		add(
			st(name+": sign init", "signinit $s %s $hk", mech(hm)).in(name+" sign"),
			st(name+": sign", "sign $s %s 128", hex.EncodeToString(seq(40, 1))).in(name+" sign").saving("mac=out").skipping("out"),
			st(name+": verify init", "verinit $s %s $hk", mech(hm)).in(name+" verify"),
			st(name+": verify", "ver $s %s $mac", hex.EncodeToString(seq(40, 1))).in(name+" verify"),
		)
	}
	// EdDSA key pairs (issue 30, item 6).
	ed25519 := []byte{0x06, 0x03, 0x2b, 0x65, 0x70}
	add(
		st("EdDSA: mechanism info", "mechinfo 0x%x", slot.CKMECEdwardsKeyPairGen),
		st("EdDSA: generate pair", "genkp $s %s %s %s", mech(slot.CKMECEdwardsKeyPairGen), tpl(tx(p.CKA_EC_PARAMS, ed25519), tb(p.CKA_TOKEN, true), ts(p.CKA_LABEL, "cf-ed")),
			tpl(tb(p.CKA_TOKEN, true), tb(p.CKA_SIGN, true), ts(p.CKA_LABEL, "cf-ed"))).saving("edpub=h", "edpriv=h2"),
		st("EdDSA: find", "findinit $s %s", tpl(ts(p.CKA_LABEL, "cf-ed"))),
		st("EdDSA: found", "find $s 10"),
		st("EdDSA: find final", "findfin $s"),
		st("EdDSA: destroy public", "destroy $s $edpub"),
		st("EdDSA: destroy private", "destroy $s $edpriv"),
	)
	add(sweepEnd("keys")...)
	return withOpSessions(steps)
}

// sessionStates runs the same calls in a session of every state:
// read-only and read-write, public, user and SO.
func sessionStates(t testing.TB) []step {
	k := testKeys(t)
	var steps []step
	add := func(s ...step) { steps = append(steps, s...) }
	add(
		st("states: init", "init"),
		st("states: select slot", "slot %s", label),
		st("states: open RO", "open 0x%x", ro).saving("ro=h"),
		st("states: open RW", "open 0x%x", rw).saving("rw=h"),
	)
	calls := func(state string, sessions ...string) {
		for _, s := range sessions {
			name := fmt.Sprintf("states: %s %s", state, s)
			add(
				st(name+": info", "sessinfo $%s", s),
				st(name+": public session object", "create $%s %s", s, tpl(tu(p.CKA_CLASS, p.CKO_DATA), tb(p.CKA_TOKEN, false), tb(p.CKA_PRIVATE, false), ts(p.CKA_LABEL, "st-pub"))).saving("o1=h"),
				st(name+": private session object", "create $%s %s", s, tpl(tu(p.CKA_CLASS, p.CKO_DATA), tb(p.CKA_TOKEN, false), tb(p.CKA_PRIVATE, true), ts(p.CKA_LABEL, "st-priv"))).saving("o2=h"),
				st(name+": public token object", "create $%s %s", s, tpl(tu(p.CKA_CLASS, p.CKO_DATA), tb(p.CKA_TOKEN, true), tb(p.CKA_PRIVATE, false), ts(p.CKA_LABEL, "st-tok"))).saving("o3=h"),
				st(name+": private token object", "create $%s %s", s, tpl(tu(p.CKA_CLASS, p.CKO_DATA), tb(p.CKA_TOKEN, true), tb(p.CKA_PRIVATE, true), ts(p.CKA_LABEL, "st-tokp"))).saving("o4=h"),
				st(name+": public session key", "create $%s %s", s, tpl(tu(p.CKA_CLASS, p.CKO_SECRET_KEY), tu(p.CKA_KEY_TYPE, p.CKK_AES), tb(p.CKA_TOKEN, false),
					tb(p.CKA_PRIVATE, false), tb(p.CKA_ENCRYPT, true), tx(p.CKA_VALUE, k.aes))).saving("o5=h"),
				st(name+": generate session key", "genkey $%s %s %s", s, mech(p.CKM_AES_KEY_GEN), tpl(tu(p.CKA_VALUE_LEN, 16), tb(p.CKA_TOKEN, false))).saving("o6=h"),
				st(name+": find", "findinit $%s %s", s, tpl(tu(p.CKA_CLASS, p.CKO_DATA))),
				st(name+": found", "find $%s 20", s),
				st(name+": find final", "findfin $%s", s),
				st(name+": encrypt init", "encinit $%s %s $o5", s, mech(p.CKM_AES_ECB)),
				st(name+": encrypt", "enc $%s %s 64", s, hex.EncodeToString(seq(16, 1))),
				st(name+": random", "random $%s 8", s).skipping("out"),
				st(name+": label", "setattr $%s $o1 %s", s, tpl(ts(p.CKA_LABEL, "st-pub2"))),
			)
			for _, o := range []string{"o1", "o2", "o3", "o4", "o5", "o6"} {
				add(st(name+": destroy "+o, "destroy $%s $%s", s, o))
			}
		}
	}
	calls("public", "ro", "rw")
	add(st("states: login user", "login $rw 1 user"))
	calls("user", "ro", "rw")
	add(
		st("states: logout user", "logout $rw"),
		st("states: SO with RO open", "login $rw 0 so"),
		st("states: close RO", "close $ro"),
		st("states: login SO", "login $rw 0 so"),
		st("states: open RO while SO", "open 0x%x", ro),
		st("states: user while SO", "login $rw 1 user"),
	)
	calls("SO", "rw")
	add(
		st("states: logout SO", "logout $rw"),
		st("states: finalize", "fin"),
	)
	return steps
}
