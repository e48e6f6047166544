package security

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// The attacks of issue 14, item 2: a key made through the group must be as
// protected as the application asked, on every member, and answer alike
// whichever member serves.

// TestKeyprot runs every keyprot attack on one 3-member group and one bare
// token (the package's token pool is shared by the whole suite). The steps
// that take members out come last.
func TestKeyprot(t *testing.T) {
	r := keyprotSetup(t)
	for _, step := range []struct {
		name string
		run  func(*testing.T, *keyprotRig)
	}{
		{"BareDefaults", keyprotBareDefaults},
		{"ApplicationCannotExport", keyprotApplicationCannotExport},
		{"MemberCopiesHold", keyprotMemberCopiesHold},
		{"ThroughModule", keyprotThroughModule},
		{"MembersAnswerAlike", keyprotMembersAnswerAlike},
	} {
		t.Run(step.name, func(t *testing.T) { step.run(t, r) })
	}
}

var keyprotP256 = []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}

var (
	keyprotAESGen  = pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil)
	keyprotWrapPad = pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP_PAD, nil)
	keyprotRSAPKCS = pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS, nil)
)

// keyprotAES is what `pkcs11-tool --keygen --key-type AES:32` asks for:
// neither CKA_SENSITIVE nor CKA_EXTRACTABLE, so the token's defaults.
func keyprotAES(label string, extra ...*pkcs11.Attribute) []*pkcs11.Attribute {
	return append([]*pkcs11.Attribute{
		keyprotAttr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), keyprotAttr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
		keyprotAttr(pkcs11.CKA_VALUE_LEN, 32), keyprotAttr(pkcs11.CKA_TOKEN, true), keyprotAttr(pkcs11.CKA_PRIVATE, true),
		keyprotAttr(pkcs11.CKA_LABEL, label), keyprotAttr(pkcs11.CKA_ENCRYPT, true), keyprotAttr(pkcs11.CKA_DECRYPT, true),
	}, extra...)
}

// keyprotKind is one way an application makes a private or secret key.
type keyprotKind struct {
	name  string
	class uint
	// material are the attributes holding its key material.
	material []uint
	make     func(ctx context.Context, f keyprotMaker, label string) (uint, error)
}

// keyprotKinds are the kinds of key the attacks are tried on; each is
// made without CKA_EXTRACTABLE=true, so to the application it is
// unextractable and its material unreadable.
var keyprotKinds = []keyprotKind{
	{name: "aes-defaults", class: pkcs11.CKO_SECRET_KEY, material: []uint{pkcs11.CKA_VALUE},
		make: func(ctx context.Context, f keyprotMaker, label string) (uint, error) {
			return f.GenerateKey(ctx, keyprotAESGen, keyprotAES(label))
		}},
	{name: "aes-unextractable-nonsensitive", class: pkcs11.CKO_SECRET_KEY, material: []uint{pkcs11.CKA_VALUE},
		make: func(ctx context.Context, f keyprotMaker, label string) (uint, error) {
			return f.GenerateKey(ctx, keyprotAESGen, keyprotAES(label,
				keyprotAttr(pkcs11.CKA_EXTRACTABLE, false), keyprotAttr(pkcs11.CKA_SENSITIVE, false)))
		}},
	{name: "aes-imported", class: pkcs11.CKO_SECRET_KEY, material: []uint{pkcs11.CKA_VALUE},
		make: func(ctx context.Context, f keyprotMaker, label string) (uint, error) {
			tmpl := keyprotAES(label, keyprotAttr(pkcs11.CKA_VALUE, bytes.Repeat([]byte{0x5a}, 32)))
			return f.CreateObject(ctx, append(tmpl[:2:2], tmpl[3:]...)) // no CKA_VALUE_LEN on import
		}},
	{name: "aes-unwrapped", class: pkcs11.CKO_SECRET_KEY, material: []uint{pkcs11.CKA_VALUE},
		make: func(ctx context.Context, f keyprotMaker, label string) (uint, error) {
			kek, err := f.GenerateKey(ctx, keyprotAESGen, keyprotAES(label+"-kek", keyprotAttr(pkcs11.CKA_WRAP, true), keyprotAttr(pkcs11.CKA_UNWRAP, true)))
			if err != nil {
				return 0, err
			}
			src, err := f.GenerateKey(ctx, keyprotAESGen, keyprotAES(label+"-src", keyprotAttr(pkcs11.CKA_EXTRACTABLE, true)))
			if err != nil {
				return 0, err
			}
			blob, err := f.WrapKey(ctx, keyprotWrapPad, kek, src)
			if err != nil {
				return 0, fmt.Errorf("wrap the source: %w", err)
			}
			tmpl := keyprotAES(label)
			return f.UnwrapKey(ctx, keyprotWrapPad, kek, blob, append(tmpl[:2:2], tmpl[3:]...))
		}},
	{name: "aes-copied", class: pkcs11.CKO_SECRET_KEY, material: []uint{pkcs11.CKA_VALUE},
		make: func(ctx context.Context, f keyprotMaker, label string) (uint, error) {
			src, err := f.GenerateKey(ctx, keyprotAESGen, keyprotAES(label+"-src"))
			if err != nil {
				return 0, err
			}
			return f.CopyObject(ctx, src, []*pkcs11.Attribute{keyprotAttr(pkcs11.CKA_LABEL, label)})
		}},
	{name: "aes-derived", class: pkcs11.CKO_SECRET_KEY, material: []uint{pkcs11.CKA_VALUE},
		make: func(ctx context.Context, f keyprotMaker, label string) (uint, error) {
			pub, priv, err := f.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
				[]*pkcs11.Attribute{keyprotAttr(pkcs11.CKA_TOKEN, true), keyprotAttr(pkcs11.CKA_EC_PARAMS, keyprotP256), keyprotAttr(pkcs11.CKA_LABEL, label+"-ecdh")},
				[]*pkcs11.Attribute{keyprotAttr(pkcs11.CKA_TOKEN, true), keyprotAttr(pkcs11.CKA_PRIVATE, true),
					keyprotAttr(pkcs11.CKA_DERIVE, true), keyprotAttr(pkcs11.CKA_LABEL, label+"-ecdh")})
			if err != nil {
				return 0, err
			}
			pt, err := f.GetAttributes(ctx, pub, []uint{pkcs11.CKA_EC_POINT})
			if err != nil {
				return 0, err
			}
			params := pkcs11.NewECDH1DeriveParams(pkcs11.CKD_NULL, nil, pt[0].Value)
			tmpl := keyprotAES(label)
			return f.DeriveKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_ECDH1_DERIVE, params), priv, tmpl)
		}},
	{name: "ec-private-defaults", class: pkcs11.CKO_PRIVATE_KEY, material: []uint{pkcs11.CKA_VALUE},
		make: func(ctx context.Context, f keyprotMaker, label string) (uint, error) {
			_, priv, err := f.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
				[]*pkcs11.Attribute{keyprotAttr(pkcs11.CKA_TOKEN, true), keyprotAttr(pkcs11.CKA_EC_PARAMS, keyprotP256),
					keyprotAttr(pkcs11.CKA_VERIFY, true), keyprotAttr(pkcs11.CKA_LABEL, label)},
				[]*pkcs11.Attribute{keyprotAttr(pkcs11.CKA_TOKEN, true), keyprotAttr(pkcs11.CKA_PRIVATE, true),
					keyprotAttr(pkcs11.CKA_SIGN, true), keyprotAttr(pkcs11.CKA_LABEL, label)})
			return priv, err
		}},
	{name: "rsa-private-defaults", class: pkcs11.CKO_PRIVATE_KEY,
		material: []uint{pkcs11.CKA_PRIVATE_EXPONENT, pkcs11.CKA_PRIME_1, pkcs11.CKA_PRIME_2,
			pkcs11.CKA_EXPONENT_1, pkcs11.CKA_EXPONENT_2, pkcs11.CKA_COEFFICIENT},
		make: func(ctx context.Context, f keyprotMaker, label string) (uint, error) {
			_, priv, err := keyprotRSAPair(ctx, f, label, false)
			return priv, err
		}},
}

// keyprotKindsNamed returns the kinds of keyprotKinds with the given names.
func keyprotKindsNamed(t *testing.T, names ...string) []keyprotKind {
	t.Helper()
	var out []keyprotKind
	for _, n := range names {
		i := slices.IndexFunc(keyprotKinds, func(k keyprotKind) bool { return k.name == n })
		if i < 0 {
			t.Fatalf("no key kind %q", n)
		}
		out = append(out, keyprotKinds[i])
	}
	return out
}

// keyprotRSAPair makes an RSA-2048 pair; wrapping makes the public half a
// wrapping key (the application's own, in the attacks).
func keyprotRSAPair(ctx context.Context, f keyprotMaker, label string, wrapping bool) (uint, uint, error) {
	return f.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{keyprotAttr(pkcs11.CKA_TOKEN, true), keyprotAttr(pkcs11.CKA_MODULUS_BITS, 2048),
			keyprotAttr(pkcs11.CKA_PUBLIC_EXPONENT, []byte{1, 0, 1}), keyprotAttr(pkcs11.CKA_VERIFY, true),
			keyprotAttr(pkcs11.CKA_WRAP, wrapping), keyprotAttr(pkcs11.CKA_LABEL, label)},
		[]*pkcs11.Attribute{keyprotAttr(pkcs11.CKA_TOKEN, true), keyprotAttr(pkcs11.CKA_PRIVATE, true),
			keyprotAttr(pkcs11.CKA_SIGN, true), keyprotAttr(pkcs11.CKA_UNWRAP, wrapping), keyprotAttr(pkcs11.CKA_LABEL, label)})
}

// keyprotWrappers are an application's own wrapping keys on one face: an
// AES key and an RSA public key, both CKA_WRAP=true and not trusted.
type keyprotWrappers struct{ aes, rsa uint }

func keyprotMakeWrappers(t *testing.T, ctx context.Context, f keyprotMaker, prefix string) keyprotWrappers {
	t.Helper()
	aes, err := f.GenerateKey(ctx, keyprotAESGen, keyprotAES(prefix+"-app-kek", keyprotAttr(pkcs11.CKA_WRAP, true), keyprotAttr(pkcs11.CKA_UNWRAP, true)))
	if err != nil {
		t.Fatalf("the application's AES wrapping key: %v", err)
	}
	rsa, _, err := keyprotRSAPair(ctx, f, prefix+"-app-rsa", true)
	if err != nil {
		t.Fatalf("the application's RSA wrapping key: %v", err)
	}
	return keyprotWrappers{aes: aes, rsa: rsa}
}

// keyprotAttack is what an application (or a user on a member) tries on a
// key to get its material out: every step's CKR code, by name. keyprotTry
// is the application's: wrap the key under its own keys, read its
// material, copy it into an extractable key.
type keyprotAttack map[string]uint

func keyprotTry(ctx context.Context, f keyprotMaker, w keyprotWrappers, kind keyprotKind, key uint, label string) keyprotAttack {
	res := keyprotAttack{}
	_, err := f.WrapKey(ctx, keyprotWrapPad, w.aes, key)
	res["C_WrapKey(CKM_AES_KEY_WRAP_PAD, application AES key)"] = f.Code(err)
	if kind.class == pkcs11.CKO_SECRET_KEY {
		_, err := f.WrapKey(ctx, keyprotRSAPKCS, w.rsa, key)
		res["C_WrapKey(CKM_RSA_PKCS, application RSA public key)"] = f.Code(err)
	}
	for _, t := range kind.material {
		attrs, err := f.GetAttributes(ctx, key, []uint{t})
		code := f.Code(err)
		if err == nil {
			code = attrs[0].Status
			if code == pkcs11.CKR_OK {
				code = 0xffff // the material came out
			}
		}
		res[fmt.Sprintf("C_GetAttributeValue(%#x)", t)] = code
	}
	_, err = f.CopyObject(ctx, key, []*pkcs11.Attribute{keyprotAttr(pkcs11.CKA_EXTRACTABLE, true), keyprotAttr(pkcs11.CKA_LABEL, label+"-extractable-copy")})
	res["C_CopyObject(CKA_EXTRACTABLE=true)"] = f.Code(err)
	attrs, err := f.GetAttributes(ctx, key, []uint{pkcs11.CKA_EXTRACTABLE, pkcs11.CKA_SENSITIVE})
	if err == nil && attrs[0].Status == pkcs11.CKR_OK {
		res["CKA_EXTRACTABLE"] = uint(attrs[0].Value[0])
	}
	return res
}

// keyprotBareDefaults measures what the group's rule takes for the
// token's defaults (tokenDefaultExtractable in pkg/group): SoftHSM makes a
// key whose template names neither CKA_EXTRACTABLE nor CKA_SENSITIVE
// unextractable and not sensitive, and its material unreadable.
func keyprotBareDefaults(t *testing.T, r *keyprotRig) {
	ctx := keyprotCtx(t)
	bare := r.bare
	for _, kind := range keyprotKindsNamed(t, "aes-defaults", "ec-private-defaults") {
		key, err := kind.make(ctx, bare, "defaults-"+kind.name)
		if err != nil {
			t.Fatalf("%s: %v", kind.name, err)
		}
		attrs, err := bare.GetAttributes(ctx, key, []uint{pkcs11.CKA_EXTRACTABLE, pkcs11.CKA_SENSITIVE, pkcs11.CKA_WRAP_WITH_TRUSTED, pkcs11.CKA_VALUE})
		if err != nil {
			t.Fatalf("%s: read: %v", kind.name, err)
		}
		if !bytes.Equal(attrs[0].Value, []byte{0}) || !bytes.Equal(attrs[1].Value, []byte{0}) || !bytes.Equal(attrs[2].Value, []byte{0}) {
			t.Errorf("%s on a bare token: EXTRACTABLE=%x SENSITIVE=%x WRAP_WITH_TRUSTED=%x, want 00 00 00", kind.name, attrs[0].Value, attrs[1].Value, attrs[2].Value)
		}
		if attrs[3].Status != pkcs11.CKR_ATTRIBUTE_SENSITIVE {
			t.Errorf("%s on a bare token: CKA_VALUE status %#x, want CKR_ATTRIBUTE_SENSITIVE", kind.name, attrs[3].Status)
		}
	}
}

// keyprotApplicationCannotExport: through the group (this process and
// a fresh one), an application cannot wrap under its own keys, or read,
// a key it did not make extractable; each step answers what a bare token
// answers to the same calls.
func keyprotApplicationCannotExport(t *testing.T, r *keyprotRig) {
	ctx := keyprotCtx(t)
	bare := r.bare
	gf := keyprotGroupFace{g: r.g, s: r.s}
	bw := keyprotMakeWrappers(t, ctx, bare, "bare-export")
	gw := keyprotMakeWrappers(t, ctx, gf, "group")
	fresh := keyprotOpen(t, r.cfg, nil)
	fs, err := fresh.OpenSession(ctx, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		t.Fatalf("OpenSession on the second group: %v", err)
	}
	t.Cleanup(func() { fs.Close() })
	ff := keyprotGroupFace{g: fresh, s: fs}
	fw := keyprotWrappers{aes: keyprotGroupFind(t, fresh, pkcs11.CKO_SECRET_KEY, "group-app-kek"), rsa: keyprotGroupFind(t, fresh, pkcs11.CKO_PUBLIC_KEY, "group-app-rsa")}
	for _, kind := range keyprotKinds {
		t.Run(kind.name, func(t *testing.T) {
			label := "export-" + kind.name
			bk, err := kind.make(ctx, bare, label)
			if err != nil {
				t.Fatalf("on the bare token: %v", err)
			}
			gk, err := kind.make(ctx, gf, label)
			if err != nil {
				t.Fatalf("through the group: %v", err)
			}
			want := keyprotTry(ctx, bare, bw, kind, bk, label)
			for k, v := range want {
				if k != "CKA_EXTRACTABLE" && v != pkcs11.CKR_KEY_UNEXTRACTABLE && v != pkcs11.CKR_ATTRIBUTE_SENSITIVE && v != pkcs11.CKR_ATTRIBUTE_READ_ONLY {
					t.Errorf("bare token: %s answered %#x: the reference lets the key out", k, v)
				}
			}
			for _, face := range []struct {
				name string
				f    keyprotMaker
				w    keyprotWrappers
				key  uint
			}{
				{"group", gf, gw, gk},
				{"fresh process", ff, fw, uint(keyprotGroupFind(t, fresh, kind.class, label))},
			} {
				got := keyprotTry(ctx, face.f, face.w, kind, face.key, label+"-"+face.name)
				for step, code := range want {
					if got[step] != code {
						t.Errorf("%s: %s answered %#x, a bare token %#x", face.name, step, got[step], code)
					}
				}
			}
		})
	}
}

// keyprotGroupFind returns the one object of class labelled label in g.
func keyprotGroupFind(t testing.TB, g *group.Group, class uint, label string) uint {
	t.Helper()
	hs, err := g.Find(keyprotCtx(t), []*pkcs11.Attribute{keyprotAttr(pkcs11.CKA_CLASS, class), keyprotAttr(pkcs11.CKA_LABEL, label)})
	if err != nil || len(hs) != 1 {
		t.Fatalf("find %q (class %d) in group %s: %v %v, want one", label, class, g.Label(), hs, err)
	}
	return uint(hs[0])
}

// keyprotMemberCopiesHold: a user with the user PIN on a member,
// outside the group, can neither wrap a group key under a key of their own
// nor read it, nor turn its protection off, on any member (the primary
// included); each step answers what a bare token answers for a key with
// the same attributes.
func keyprotMemberCopiesHold(t *testing.T, r *keyprotRig) {
	ctx := keyprotCtx(t)
	gf := keyprotGroupFace{g: r.g, s: r.s}
	onMembers := keyprotKinds // every way of making a key: generate, pair, create, unwrap, copy, derive
	for _, kind := range onMembers {
		if _, err := kind.make(ctx, gf, "member-"+kind.name); err != nil {
			t.Fatalf("%s through the group: %v", kind.name, err)
		}
	}
	// The reference: a bare token's key made with what the members' copies
	// must hold (sensitive, extractable under trusted keys only).
	bare := r.bare
	bw := keyprotMakeWrappers(t, ctx, bare, "bare-member")
	ref, err := bare.GenerateKey(ctx, keyprotAESGen, keyprotAES("bare-ref", keyprotAttr(pkcs11.CKA_SENSITIVE, true),
		keyprotAttr(pkcs11.CKA_EXTRACTABLE, true), keyprotAttr(pkcs11.CKA_WRAP_WITH_TRUSTED, true)))
	if err != nil {
		t.Fatalf("bare reference key: %v", err)
	}
	want := keyprotMemberAttack(ctx, bare, bw, keyprotKindsNamed(t, "aes-defaults")[0], ref)
	for step, code := range want {
		// Making a key unextractable is allowed (PKCS#11): it lets nothing out.
		if (code == pkcs11.CKR_OK || code == 0xffff) && step != "C_SetAttributeValue(CKA_EXTRACTABLE=false)" {
			t.Errorf("bare token: %s answered %#x: the reference lets the key out", step, code)
		}
	}
	for i, tok := range r.toks {
		d := keyprotTokenFace{s: keyprotDirect(t, tok)}
		w := keyprotMakeWrappers(t, ctx, d, fmt.Sprintf("user%d", i))
		for _, kind := range onMembers {
			key := uint(keyprotFind(t, d.s, kind.class, "member-"+kind.name))
			got := keyprotMemberAttack(ctx, d, w, kind, key)
			for step, code := range got {
				wantCode, ok := want[step]
				if !ok {
					// EC and RSA material: no bare AES counterpart; it must stay in.
					wantCode = pkcs11.CKR_ATTRIBUTE_SENSITIVE
				}
				if code != wantCode {
					t.Errorf("member %s, %s: %s answered %#x, want %#x (a bare token's)", tok.Name, kind.name, step, code, wantCode)
				}
			}
		}
	}
}

// keyprotMemberAttack is what a user on a member tries on the copy key:
// wrap it under their own keys, read it, copy it into a readable or
// untrusted-wrappable key, turn CKA_SENSITIVE or CKA_WRAP_WITH_TRUSTED
// off, and then, having made it unextractable (which SoftHSM allows, as
// PKCS#11 does), wrap and read it again.
func keyprotMemberAttack(ctx context.Context, f keyprotMaker, w keyprotWrappers, kind keyprotKind, key uint) keyprotAttack {
	res := keyprotAttack{}
	wrapAll := func(when string) {
		_, err := f.WrapKey(ctx, keyprotWrapPad, w.aes, key)
		res[when+"C_WrapKey(CKM_AES_KEY_WRAP_PAD, own AES key)"] = f.Code(err)
		if kind.class == pkcs11.CKO_SECRET_KEY {
			_, err = f.WrapKey(ctx, keyprotRSAPKCS, w.rsa, key)
			res[when+"C_WrapKey(CKM_RSA_PKCS, own RSA public key)"] = f.Code(err)
		}
		for _, t := range kind.material {
			attrs, err := f.GetAttributes(ctx, key, []uint{t})
			code := f.Code(err)
			if err == nil {
				if code = attrs[0].Status; code == pkcs11.CKR_OK {
					code = 0xffff
				}
			}
			res[fmt.Sprintf("%sC_GetAttributeValue(%#x)", when, t)] = code
		}
	}
	wrapAll("")
	for _, a := range []*pkcs11.Attribute{
		keyprotAttr(pkcs11.CKA_WRAP_WITH_TRUSTED, false),
		keyprotAttr(pkcs11.CKA_SENSITIVE, false),
	} {
		err := f.SetAttributes(ctx, key, []*pkcs11.Attribute{a})
		res[fmt.Sprintf("C_SetAttributeValue(%#x=false)", a.Type)] = f.Code(err)
		_, err = f.CopyObject(ctx, key, []*pkcs11.Attribute{a, keyprotAttr(pkcs11.CKA_LABEL, "attacker-copy")})
		res[fmt.Sprintf("C_CopyObject(%#x=false)", a.Type)] = f.Code(err)
	}
	err := f.SetAttributes(ctx, key, []*pkcs11.Attribute{keyprotAttr(pkcs11.CKA_EXTRACTABLE, false)})
	res["C_SetAttributeValue(CKA_EXTRACTABLE=false)"] = f.Code(err)
	wrapAll("then ")
	return res
}

// keyprotAlikeTypes are the attributes compared between members.
var keyprotAlikeTypes = []uint{
	pkcs11.CKA_CLASS, pkcs11.CKA_KEY_TYPE, pkcs11.CKA_ID, pkcs11.CKA_LABEL, pkcs11.CKA_TOKEN, pkcs11.CKA_PRIVATE,
	pkcs11.CKA_MODIFIABLE, pkcs11.CKA_COPYABLE, pkcs11.CKA_DESTROYABLE,
	pkcs11.CKA_SENSITIVE, pkcs11.CKA_ALWAYS_SENSITIVE, pkcs11.CKA_EXTRACTABLE, pkcs11.CKA_NEVER_EXTRACTABLE,
	pkcs11.CKA_WRAP_WITH_TRUSTED, pkcs11.CKA_TRUSTED, pkcs11.CKA_LOCAL, pkcs11.CKA_KEY_GEN_MECHANISM,
	pkcs11.CKA_VALUE_LEN, pkcs11.CKA_VALUE, pkcs11.CKA_CHECK_VALUE,
	pkcs11.CKA_ENCRYPT, pkcs11.CKA_DECRYPT, pkcs11.CKA_SIGN, pkcs11.CKA_VERIFY, pkcs11.CKA_WRAP, pkcs11.CKA_UNWRAP, pkcs11.CKA_DERIVE,
	pkcs11.CKA_EC_PARAMS, pkcs11.CKA_EC_POINT, pkcs11.CKA_MODULUS, pkcs11.CKA_PUBLIC_EXPONENT,
	pkcs11.CKA_PRIVATE_EXPONENT, pkcs11.CKA_PRIME_1, pkcs11.CKA_PRIME_2, pkcs11.CKA_EXPONENT_1, pkcs11.CKA_EXPONENT_2, pkcs11.CKA_COEFFICIENT,
	pkcs11.CKA_ALWAYS_AUTHENTICATE, pkcs11.CKA_START_DATE, pkcs11.CKA_END_DATE, pkcs11.CKA_SUBJECT,
}

// keyprotRead reads every type in keyprotAlikeTypes of h, one by one, as
// a C_GetAttributeValue caller sees them: status and value.
func keyprotRead(t *testing.T, ctx context.Context, g *group.Group, h uint) []slot.Attribute {
	t.Helper()
	out := make([]slot.Attribute, len(keyprotAlikeTypes))
	for i, ty := range keyprotAlikeTypes {
		attrs, err := g.GetAttributes(ctx, group.ObjectHandle(h), []uint{ty})
		if err != nil {
			t.Fatalf("group %s: read %#x of %d: %v", g.Label(), ty, h, err)
		}
		out[i] = attrs[0]
	}
	return out
}

func keyprotDiff(a, b []slot.Attribute) []string {
	var d []string
	for i := range a {
		if a[i].Status != b[i].Status || !bytes.Equal(a[i].Value, b[i].Value) {
			d = append(d, fmt.Sprintf("%#x: %x/%#x vs %x/%#x", a[i].Type, a[i].Value, a[i].Status, b[i].Value, b[i].Status))
		}
	}
	return d
}

// keyprotMembersAnswerAlike: every attribute of a group key reads the
// same through the virtual slot whichever member serves: the primary,
// then (the primary failed) the second member, then (the second failing
// with CKR_DEVICE_ERROR under slottest faults) the third; and in a fresh
// process served by each member alone.
func keyprotMembersAnswerAlike(t *testing.T, r *keyprotRig) {
	ctx := keyprotCtx(t)
	gf := keyprotGroupFace{g: r.g, s: r.s}
	type key struct {
		label string
		class uint
		h     uint
		// solo: a fresh process served by one member alone answers alike.
		// Not so for a key the application made extractable: its replicas
		// cannot tell, and read unextractable (docs/DESIGN.md).
		solo bool
	}
	var keys []key
	for _, kind := range keyprotKinds {
		label := "alike-" + kind.name
		h, err := kind.make(ctx, gf, label)
		if err != nil {
			t.Fatalf("%s: %v", kind.name, err)
		}
		keys = append(keys, key{label, kind.class, h, true})
		if kind.class == pkcs11.CKO_PRIVATE_KEY {
			keys = append(keys, key{label, pkcs11.CKO_PUBLIC_KEY, keyprotGroupFind(t, r.g, pkcs11.CKO_PUBLIC_KEY, label), true})
		}
	}
	open, err := gf.GenerateKey(ctx, keyprotAESGen, keyprotAES("alike-extractable",
		keyprotAttr(pkcs11.CKA_EXTRACTABLE, true), keyprotAttr(pkcs11.CKA_SENSITIVE, true)))
	if err != nil {
		t.Fatal(err)
	}
	keys = append(keys, key{"alike-extractable", pkcs11.CKO_SECRET_KEY, open, false})

	first := make([][]slot.Attribute, len(keys))
	for i, k := range keys {
		first[i] = keyprotRead(t, ctx, r.g, k.h)
	}
	compare := func(who string) {
		t.Helper()
		for i, k := range keys {
			if d := keyprotDiff(first[i], keyprotRead(t, ctx, r.g, k.h)); d != nil {
				t.Errorf("%s (class %d) served by %s differs from the primary's answer: %v", k.label, k.class, who, d)
			}
		}
	}
	if err := r.g.FailMember(r.toks[0].Name, fmt.Errorf("taken out by the test")); err != nil {
		t.Fatal(err)
	}
	compare(r.toks[1].Name + " and " + r.toks[2].Name)
	r.faults.FailAll(r.toks[1].Name, pkcs11.Error(pkcs11.CKR_DEVICE_ERROR))
	compare(r.toks[2].Name + ", " + r.toks[1].Name + " failing with CKR_DEVICE_ERROR")
	if m, _ := r.g.Member(r.toks[1].Name); m.State() == member.Active {
		if err := r.g.FailMember(r.toks[1].Name, fmt.Errorf("taken out by the test")); err != nil {
			t.Fatal(err)
		}
	}
	if n := r.g.Status().Active; n != 1 {
		t.Fatalf("%d members active after failing two, want 1", n)
	}
	compare(r.toks[2].Name + " alone")

	for _, tok := range r.toks {
		cfg := config.Group{Label: r.cfg.Label, Serial: r.cfg.Serial}
		for _, m := range r.cfg.Members {
			if m.Name == tok.Name {
				cfg.Members = append(cfg.Members, m)
			}
		}
		solo := keyprotOpen(t, cfg, nil)
		for i, k := range keys {
			if !k.solo {
				continue
			}
			h := keyprotGroupFind(t, solo, k.class, k.label)
			if d := keyprotDiff(first[i], keyprotRead(t, ctx, solo, h)); d != nil {
				t.Errorf("%s (class %d) in a fresh process served by %s alone differs: %v", k.label, k.class, tok.Name, d)
			}
		}
	}
}

// keyprotThroughModule: what `pkcs11-tool --keygen --key-type AES:32`
// makes through libhapkcs11.so (no CKA_SENSITIVE, no CKA_EXTRACTABLE)
// cannot be read or wrapped under the application's own key, in a fresh
// process, with the CKR a bare token gives for the same commands; and
// directly on each member it can be neither read nor wrapped under the
// user's own key.
func keyprotThroughModule(t *testing.T, r *keyprotRig) {
	lib, env := keyprotModule(t, r.cfg)
	bare := r.bareTok
	steps := [][]string{
		{"--keygen", "--key-type", "AES:32", "--label", "tool-kek", "--id", "01", "--usage-wrap"},
		{"--keygen", "--key-type", "AES:32", "--label", "tool-aes", "--id", "02"},
		{"--read-object", "--type", "secrkey", "--id", "02"},
		{"--wrap", "--mechanism", "AES-KEY-WRAP", "--id", "01", "--application-id", "02", "--output-file", "blob"},
	}
	want := []string{"CKR_OK", "CKR_OK", "CKR_ATTRIBUTE_SENSITIVE", "CKR_KEY_UNEXTRACTABLE"}
	for i, step := range steps {
		b, bout := keyprotTool(t, env, bare.Module, bare.Label, step...)
		if b != want[i] {
			t.Fatalf("bare token: pkcs11-tool %s: %s, want %s\n%s", strings.Join(step, " "), b, want[i], bout)
		}
		g, gout := keyprotTool(t, env, lib, r.cfg.Label, step...)
		if g != b {
			t.Errorf("libhapkcs11.so: pkcs11-tool %s: %s, a bare token %s\n%s", strings.Join(step, " "), g, b, gout)
		}
	}
	for _, tok := range r.toks {
		if rv, out := keyprotTool(t, env, tok.Module, tok.Label, "--read-object", "--type", "secrkey", "--id", "02"); rv != "CKR_ATTRIBUTE_SENSITIVE" {
			t.Errorf("member %s directly: read the group key: %s, want CKR_ATTRIBUTE_SENSITIVE\n%s", tok.Name, rv, out)
		}
		if rv, out := keyprotTool(t, env, tok.Module, tok.Label, "--keygen", "--key-type", "AES:32", "--label", "own-kek", "--id", "0a", "--usage-wrap"); rv != "CKR_OK" {
			t.Fatalf("member %s directly: the user's own key: %s\n%s", tok.Name, rv, out)
		}
		if rv, out := keyprotTool(t, env, tok.Module, tok.Label, "--wrap", "--mechanism", "AES-KEY-WRAP", "--id", "0a", "--application-id", "02", "--output-file", "blob"); rv != "CKR_KEY_NOT_WRAPPABLE" {
			t.Errorf("member %s directly: wrap the group key under the user's own key: %s, want CKR_KEY_NOT_WRAPPABLE\n%s", tok.Name, rv, out)
		}
	}
}
