package slot_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/remote"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// The tests on an in-process NSS token are not parallel: a process
// initialises NSS softokn once, so two of them never overlap.

func nssSpec(tok testhsm.Token) slot.Spec {
	sp := specOf(tok)
	sp.InitArgs = tok.InitArgs
	return sp
}

// An NSS softokn member opens by its init arguments, logs in and signs, and
// its token reads as NSS's.
func TestInitArgsOpenNSS(t *testing.T) {
	tok := testhsm.NSS(t, "nss-open")
	s := open(t, nssSpec(tok))
	if got := s.Token(); got.Manufacturer != "Mozilla Foundation" || got.Label != "nss-open" {
		t.Fatalf("token = %+v, want NSS's database token nss-open", got)
	}
	if !s.LoggedIn() {
		t.Fatal("not logged in after Open with the PIN")
	}
	pub, priv, err := s.GenerateKeyPair(ctxT(t), pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, p256OID), pkcs11.NewAttribute(pkcs11.CKA_VERIFY, true)},
		[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_SIGN, true), pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false)})
	if err != nil {
		t.Fatalf("GenerateKeyPair on NSS: %v", err)
	}
	msg := make([]byte, 32)
	sig, err := s.Sign(ctxT(t), pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil), priv, msg)
	if err != nil {
		t.Fatalf("Sign on NSS: %v", err)
	}
	if err := s.Verify(ctxT(t), pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil), pub, msg, sig); err != nil {
		t.Fatalf("Verify on NSS: %v", err)
	}
	toks, err := slot.ListModuleTokens(ctxT(t), slot.ModuleRef{Path: tok.Module, InitArgs: tok.InitArgs})
	if err != nil {
		t.Fatalf("ListModuleTokens: %v", err)
	}
	var labels []string
	for _, x := range toks {
		labels = append(labels, x.Label)
	}
	if !strings.Contains(strings.Join(labels, ","), "nss-open") {
		t.Fatalf("ListModuleTokens lists %q, want nss-open among them", labels)
	}
}

// Without its init arguments NSS answers CKR_ARGUMENTS_BAD, and the error
// says what is likely missing.
func TestInitArgsMissing(t *testing.T) {
	tok := testhsm.NSS(t, "nss-missing")
	sp := specOf(tok) // no InitArgs
	_, err := slot.Open(ctxT(t), sp)
	if err == nil {
		t.Fatal("Open of NSS softokn without init arguments succeeded")
	}
	if !errors.Is(err, pkcs11.Error(pkcs11.CKR_ARGUMENTS_BAD)) || !strings.Contains(err.Error(), "init arguments may be missing") {
		t.Fatalf("Open without init arguments: %v, want CKR_ARGUMENTS_BAD saying init arguments may be missing", err)
	}
	if !strings.Contains(err.Error(), tok.Name) {
		t.Fatalf("error %q does not name the member %s", err, tok.Name)
	}
}

// A module initialised once per process cannot serve a second member
// with other init arguments: it would serve the first member's database
// under the second's name. Once the first lets go, the second opens.
func TestInitArgsOtherArgsInProcess(t *testing.T) {
	a, b := testhsm.NSS(t, "nss-first"), testhsm.NSS(t, "nss-second")
	sa, err := slot.Open(ctxT(t), nssSpec(a))
	if err != nil {
		t.Fatalf("open %s: %v", a.Name, err)
	}
	_, err = slot.Open(ctxT(t), nssSpec(b))
	if !errors.Is(err, slot.ErrInvalidSpec) || !strings.Contains(err.Error(), "other init arguments") || !strings.Contains(err.Error(), "hsmserve") {
		t.Fatalf("second NSS database in process: %v, want ErrInvalidSpec naming other init arguments and hsmserve", err)
	}
	if err := sa.Close(); err != nil {
		t.Fatalf("close %s: %v", a.Name, err)
	}
	sb := open(t, nssSpec(b))
	if got := sb.Token().Label; got != "nss-second" {
		t.Fatalf("after the first closed, the second opens token %q, want nss-second", got)
	}
}

// Init arguments that carry the member's PIN, or name a PIN parameter,
// are refused before the module is loaded, and the error shows neither.
func TestInitArgsRefuseAPIN(t *testing.T) {
	tok := testhsm.NSS(t, "nss-pin")
	for name, args := range map[string]string{
		"the PIN as a value":   tok.InitArgs + " tokenDescription='" + tok.UserPIN + "'",
		"a password parameter": tok.InitArgs + " password='" + tok.UserPIN + "'",
		"a control character":  tok.InitArgs + "\n" + tok.UserPIN,
	} {
		t.Run(name, func(t *testing.T) {
			sp := nssSpec(tok)
			sp.InitArgs = args
			_, err := slot.Open(ctxT(t), sp)
			if !errors.Is(err, slot.ErrInvalidSpec) {
				t.Fatalf("Open with %s in init arguments: %v, want ErrInvalidSpec", name, err)
			}
			if strings.Contains(err.Error(), tok.UserPIN) {
				t.Fatalf("the error shows the PIN: %v", err)
			}
		})
	}
}

// A served token's module is initialised by its server: init arguments
// belong to hsmserve, and a member giving them is told so.
func TestInitArgsServedTokenRefused(t *testing.T) {
	t.Parallel()
	sp := slot.Spec{Name: "served", Module: remote.ModulePath("/nonexistent/p11.sock"), TokenLabel: "x",
		InitArgs: "configdir='sql:/tmp/x'", PIN: secret.PINFromString("irrelevant-1")}
	_, err := slot.Open(ctxT(t), sp)
	if !errors.Is(err, slot.ErrInvalidSpec) || !strings.Contains(err.Error(), "--init-args") {
		t.Fatalf("init arguments for a served token: %v, want ErrInvalidSpec pointing at hsmserve --init-args", err)
	}
}

// Two NSS databases serve at once, each behind its own hsmserve given its
// init arguments, and each member reaches its own token.
func TestInitArgsServedNSS(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"nss-served-a", "nss-served-b"} {
		srv := testhsm.ServeNSS(t, name)
		s := open(t, specOf(srv.Token()))
		if got := s.Token(); got.Label != name || got.Manufacturer != "Mozilla Foundation" {
			t.Fatalf("served token = %+v, want NSS's %s", got, name)
		}
		if _, err := s.GenerateRandom(ctxT(t), 16); err != nil {
			t.Fatalf("GenerateRandom on %s: %v", name, err)
		}
	}
}
