package slot_test

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
)

func TestLookup(t *testing.T) {
	t.Parallel()
	tok := testhsm.Take(t, 1)[0]
	// pct-encode every byte of the label, as a URI may.
	var enc strings.Builder
	for _, b := range []byte(tok.Label) {
		fmt.Fprintf(&enc, "%%%02X", b)
	}
	cases := []struct {
		name string
		spec slot.Spec
	}{
		{"label", slot.Spec{TokenLabel: tok.Label}},
		{"serial", slot.Spec{TokenSerial: tok.Serial}},
		{"uri token", slot.Spec{URI: "pkcs11:token=" + tok.Label}},
		{"uri pct-encoded", slot.Spec{URI: "pkcs11:token=" + enc.String()}},
		{"uri serial", slot.Spec{URI: "pkcs11:serial=" + tok.Serial}},
		{"uri many", slot.Spec{URI: "pkcs11:model=SoftHSM%20v2;manufacturer=SoftHSM%20project;serial=" + tok.Serial + ";token=" + url.PathEscape(tok.Label) + ";library-manufacturer=SoftHSM;object=ignored;type=private"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec := c.spec
			spec.Name, spec.Module = tok.Name, tok.Module
			s := open(t, spec)
			if got := s.Token(); got.Label != tok.Label || got.Serial != tok.Serial {
				t.Fatalf("found token %q/%q, want %q/%q", got.Label, got.Serial, tok.Label, tok.Serial)
			}
			if s.LoggedIn() {
				t.Fatalf("logged in without a PIN")
			}
			// slot-id as found by label then works in a URI too.
			spec.TokenLabel, spec.TokenSerial = "", ""
			spec.URI = fmt.Sprintf("pkcs11:slot-id=%d", s.SlotID())
			if s2 := open(t, spec); s2.Token().Serial != tok.Serial {
				t.Fatalf("slot-id %d found serial %s, want %s", s.SlotID(), s2.Token().Serial, tok.Serial)
			}
		})
	}
}

// Not parallel: the error lists every token in the module's directory,
// and a parallel test taking a pool token may initialise one afresh
// (another label) between this test's listing and its Open.
func TestLookupNotFound(t *testing.T) {
	tok := testhsm.Take(t, 1)[0]
	all, err := slot.ListModuleTokens(ctxT(t), slot.ModuleRef{Path: tok.Module})
	if err != nil {
		t.Fatalf("ListModuleTokens: %v", err)
	}
	var labels, withSerials []string
	for _, x := range all {
		if x.Initialized {
			labels = append(labels, x.Label)
			withSerials = append(withSerials, fmt.Sprintf("%s (serial %s)", x.Label, x.Serial))
		}
	}
	if len(labels) < 2 {
		t.Fatalf("ListModuleTokens found %d initialised tokens: %+v", len(labels), all)
	}
	cases := []struct {
		name string
		spec slot.Spec
		want string
	}{
		{"label", slot.Spec{TokenLabel: "ha-b"},
			fmt.Sprintf(`member hsm-b: token label "ha-b" not found in %s; tokens there: %s`, tok.Module, strings.Join(labels, ", "))},
		{"serial", slot.Spec{TokenSerial: "0000"},
			fmt.Sprintf(`member hsm-b: token serial "0000" not found in %s; tokens there: %s`, tok.Module, strings.Join(withSerials, ", "))},
		{"uri", slot.Spec{URI: "pkcs11:token=" + tok.Label + ";model=Luna"},
			fmt.Sprintf(`member hsm-b: token matching "pkcs11:token=%s;model=Luna" not found in %s; tokens there: %s`, tok.Label, tok.Module, strings.Join(withSerials, ", "))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec := c.spec
			spec.Name, spec.Module = "hsm-b", tok.Module
			_, err := slot.Open(ctxT(t), spec)
			if !errors.Is(err, slot.ErrTokenNotFound) {
				t.Fatalf("Open: %v, want ErrTokenNotFound", err)
			}
			if err.Error() != c.want {
				t.Fatalf("error:\n got %s\nwant %s", err, c.want)
			}
			if slot.ClassOf(err) != slot.ClassHealth {
				t.Fatalf("ClassOf(token not found) = %v, want health", slot.ClassOf(err))
			}
		})
	}
}

// uriPIN is the PIN TestLookupBadSpecs puts in a URI: not something an
// error may hold by chance (a token serial listed by an ambiguous URI is
// hex, and held "1234" in one run of about sixty).
const uriPIN = "uri-pin-never-shown"

func TestLookupBadSpecs(t *testing.T) {
	t.Parallel()
	tok := testhsm.Take(t, 1)[0]
	cases := []struct {
		name string
		spec slot.Spec
		want string
	}{
		{"none", slot.Spec{}, "no token label, token serial or URI"},
		{"two ways", slot.Spec{TokenLabel: "a", URI: "pkcs11:token=a"}, "token label and URI given together"},
		{"three ways", slot.Spec{TokenLabel: "a", TokenSerial: "1", URI: "pkcs11:token=a"}, "token label and token serial and URI given together"},
		{"not a uri", slot.Spec{URI: "token=a"}, `does not start with pkcs11:`},
		{"unknown attribute", slot.Spec{URI: "pkcs11:token=a;colour=blue"}, `unknown attribute "colour"`},
		{"bad escape", slot.Spec{URI: "pkcs11:token=a%zz"}, "attribute token"},
		{"bad slot-id", slot.Spec{URI: "pkcs11:slot-id=x"}, `slot-id "x" is not a decimal number`},
		{"twice", slot.Spec{URI: "pkcs11:token=a;token=b"}, "attribute token given twice"},
		{"pin in uri", slot.Spec{URI: "pkcs11:token=a?pin-value=" + uriPIN}, "carries a PIN"},
		{"ambiguous", slot.Spec{URI: "pkcs11:model=SoftHSM%20v2"}, "matches"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec := c.spec
			spec.Name, spec.Module = "hsm-x", tok.Module
			_, err := slot.Open(ctxT(t), spec)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "member hsm-x: ") {
				t.Fatalf("Open: %v; want an error about the member saying %q", err, c.want)
			}
			if strings.Contains(err.Error(), uriPIN) {
				t.Fatalf("the error shows the PIN of the URI: %v", err)
			}
			if !errors.Is(err, slot.ErrInvalidSpec) || slot.ClassOf(err) != slot.ClassRequest {
				t.Fatalf("Open: %v (class %v); want ErrInvalidSpec, request", err, slot.ClassOf(err))
			}
		})
	}
}

func TestWrongPIN(t *testing.T) {
	t.Parallel()
	tok := testhsm.Take(t, 1)[0]
	spec := specOf(tok)
	spec.PIN = secret.PINFromString("not-the-pin")
	_, err := slot.Open(ctxT(t), spec)
	if !errors.Is(err, slot.ErrPINIncorrect) || slot.ClassOf(err) != slot.ClassLogin {
		t.Fatalf("Open with a wrong PIN: %v (class %v); want ErrPINIncorrect, login", err, slot.ClassOf(err))
	}
	if strings.Contains(err.Error(), "not-the-pin") {
		t.Fatalf("the error shows the PIN")
	}
}
