package group

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/group/opstate"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// initSession is what the comparison below drives: a group Session, or a
// bare token session called straight through pkg/slot.
type initSession interface {
	Init(ctx context.Context, k OpKind, mech *pkcs11.Mechanism, key ObjectHandle) error
	Do(ctx context.Context, k OpKind, st Step, in, sig []byte, room Room) ([]byte, error)
}

// bareSession sends each call to the token as it comes: no state of ours.
type bareSession struct{ ss *slot.Session }

func (b bareSession) Init(ctx context.Context, k OpKind, mech *pkcs11.Mechanism, key ObjectHandle) error {
	return opstate.InitOn(ctx, k, b.ss, mech, pkcs11.ObjectHandle(key))
}

func (b bareSession) Do(ctx context.Context, k OpKind, st Step, in, sig []byte, _ Room) ([]byte, error) {
	return opstate.StepOn(ctx, k, st, b.ss, in, sig, nil)
}

// initKeys are the keys of the sequence, as handles of the session's kind.
type initKeys struct{ short, hmac, aes, rsa ObjectHandle }

// initSequence runs the calls of issue 16 item 2 and around it on s and
// returns one line per call: its name, CKR code and output.
func initSequence(t *testing.T, s initSession, keys initKeys) []string {
	t.Helper()
	ctx := testContext(t)
	var lines []string
	note := func(what string, out []byte, err error) {
		lines = append(lines, fmt.Sprintf("%s: 0x%x %x", what, CodeOf(err), out))
	}
	init := func(what string, k OpKind, mech *pkcs11.Mechanism, key ObjectHandle) {
		note(what+" init", nil, s.Init(ctx, k, mech, key))
	}
	do := func(what string, k OpKind, st Step, in, sig []byte) {
		out, err := s.Do(ctx, k, st, in, sig, RoomAny)
		note(what, out, err)
	}
	hmac := pkcs11.NewMechanism(pkcs11.CKM_SHA_1_HMAC, nil)
	for range 2 {
		init("hmac short key", OpSign, hmac, keys.short)
		do("hmac short key sign", OpSign, StepSingle, []byte("data"), nil)
	}
	for range 2 {
		init("hmac", OpSign, hmac, keys.hmac)
		do("hmac sign", OpSign, StepSingle, []byte("data"), nil)
	}
	init("hmac multi-part", OpSign, hmac, keys.hmac)
	do("hmac update", OpSign, StepUpdate, []byte("da"), nil)
	do("hmac update", OpSign, StepUpdate, []byte("ta"), nil)
	do("hmac final", OpSign, StepFinal, nil, nil)
	for range 2 {
		init("cbc short iv", OpEncrypt, pkcs11.NewMechanism(pkcs11.CKM_AES_CBC_PAD, make([]byte, 8)), keys.aes)
		do("cbc short iv encrypt", OpEncrypt, StepSingle, []byte("data"), nil)
	}
	init("hmac key to encrypt", OpEncrypt, pkcs11.NewMechanism(pkcs11.CKM_AES_CBC_PAD, make([]byte, 16)), keys.hmac)
	do("hmac key encrypt", OpEncrypt, StepSingle, []byte("data"), nil)
	bad := pkcs11.NewOAEPParams(pkcs11.CKM_SHA256, pkcs11.CKG_MGF1_SHA1, pkcs11.CKZ_DATA_SPECIFIED, nil)
	for range 2 {
		init("oaep bad params", OpDecrypt, pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS_OAEP, bad), keys.rsa)
		do("oaep bad params decrypt", OpDecrypt, StepSingle, make([]byte, 256), nil)
	}
	return lines
}

// TestInitErrorsAsTheToken: the Go API answers every call of the
// sequence as a bare SoftHSM token does, at the same call: the key too
// short for HMAC-SHA1 and the OAEP parameters the token refuses fail the
// Init (they used to pass it and fail the data call), and the data call
// then finds no operation. The module runs the same sequence in
// test/module (TestConformInitErrors).
func TestInitErrorsAsTheToken(t *testing.T) {
	f := setup(t, setupOpts{n: 2})
	bareTok := testhsm.Take(t, 1)[0]
	toks := append(append([]testhsm.Token{}, f.toks...), bareTok)
	importSecretLen(t, toks, "ie-short", 4)
	importSecretLen(t, toks, "ie-hmac", 32)
	ctx := testContext(t)
	s := openSession(t, f.g)
	find := func(label string) ObjectHandle {
		hs, err := s.Find(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, label)})
		if err != nil || len(hs) != 1 {
			t.Fatalf("find %s in the group: %v, %d found", label, err, len(hs))
		}
		return hs[0]
	}
	aes, err := s.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), aesTemplate("ie-aes"))
	if err != nil {
		t.Fatal(err)
	}
	_, rsa, err := s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS_KEY_PAIR_GEN, nil), rsaPublic("ie-rsa"), rsaPrivate("ie-rsa"))
	if err != nil {
		t.Fatal(err)
	}
	got := initSequence(t, s, initKeys{short: find("ie-short"), hmac: find("ie-hmac"), aes: aes, rsa: rsa})

	ss, err := openDirect(t, bareTok).OpenSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	bareFind := func(label string) ObjectHandle {
		hs, err := ss.FindObjects(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, label)})
		if err != nil || len(hs) != 1 {
			t.Fatalf("find %s on the bare token: %v, %d found", label, err, len(hs))
		}
		return ObjectHandle(hs[0])
	}
	bareAES, err := ss.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), aesTemplate("ie-aes"))
	if err != nil {
		t.Fatal(err)
	}
	_, bareRSA, err := ss.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS_KEY_PAIR_GEN, nil), rsaPublic("ie-rsa"), rsaPrivate("ie-rsa"))
	if err != nil {
		t.Fatal(err)
	}
	want := initSequence(t, bareSession{ss}, initKeys{short: bareFind("ie-short"), hmac: bareFind("ie-hmac"),
		aes: ObjectHandle(bareAES), rsa: ObjectHandle(bareRSA)})

	for _, w := range []string{
		"hmac short key init: 0x62 ",     // CKR_KEY_SIZE_RANGE
		"hmac short key sign: 0x91 ",     // CKR_OPERATION_NOT_INITIALIZED
		"oaep bad params init: 0x7 ",     // CKR_ARGUMENTS_BAD
		"oaep bad params decrypt: 0x91 ", // CKR_OPERATION_NOT_INITIALIZED
		"cbc short iv init: 0x70 ",       // CKR_MECHANISM_PARAM_INVALID
	} {
		if !strings.Contains(strings.Join(want, "\n")+"\n", w) {
			t.Fatalf("the bare token did not answer %q:\n%s", w, strings.Join(want, "\n"))
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d answers from the group, %d from the bare token", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("call %d:\n got %s\nwant %s (bare token)", i+1, got[i], want[i])
		}
	}
}

// importSecretLen puts one generic secret of n bytes, labelled label, on
// every token.
func importSecretLen(t *testing.T, toks []testhsm.Token, label string, n int) {
	t.Helper()
	v := make([]byte, n)
	for i := range v {
		v[i] = byte(i*13 + 5)
	}
	for _, tok := range toks {
		if _, err := openDirect(t, tok).CreateObject(testContext(t), []*pkcs11.Attribute{
			attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_GENERIC_SECRET),
			attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_VERIFY, true),
			attr(pkcs11.CKA_SENSITIVE, true), attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_ID, []byte("id-"+label)),
			attr(pkcs11.CKA_VALUE, v),
		}); err != nil {
			t.Fatalf("import %s on %s: %v", label, tok.Name, err)
		}
	}
}

func rsaPublic(label string) []*pkcs11.Attribute {
	return []*pkcs11.Attribute{
		attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_ENCRYPT, true), attr(pkcs11.CKA_MODULUS_BITS, 2048),
		attr(pkcs11.CKA_PUBLIC_EXPONENT, []byte{1, 0, 1}), attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_ID, []byte("id-"+label)),
	}
}

func rsaPrivate(label string) []*pkcs11.Attribute {
	return []*pkcs11.Attribute{
		attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SENSITIVE, true),
		attr(pkcs11.CKA_DECRYPT, true), attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_ID, []byte("id-"+label)),
	}
}
