package initargs

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	nss := "configdir='sql:/var/lib/hagroup/nss-a' certPrefix='' keyPrefix='' secmod='secmod.db' flags=optimizeSpace"
	for _, tc := range []struct {
		name, args string
		bad        string // a fragment of the error; "" when accepted
	}{
		{"empty", "", ""},
		{"nss", nss, ""},
		{"spaces in a description", "dbTokenDescription='hagroup member a'", ""},
		{"a word holding pin", "configdir='sql:/srv/spinner' flags=readOnly", ""},
		{"NUL", "configdir='sql:/a'\x00x", "control character"},
		{"newline", "configdir='sql:/a'\nflags=x", "control character"},
		{"not UTF-8", "configdir='\xff'", "UTF-8"},
		{"too long", strings.Repeat("a", MaxLen+1), "more than"},
		{"password", nss + " password='hunter22'", "PIN or password"},
		{"pin", "PIN=1234", "PIN or password"},
		{"so pin", "configdir='x' so_pin = 1234", "PIN or password"},
		{"passphrase", "passphrase:abc", "PIN or password"},
		{"pwd", "pwd=abc", "PIN or password"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.args)
			switch {
			case tc.bad == "" && err != nil:
				t.Fatalf("Check(%q) = %v, want accepted", tc.args, err)
			case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)):
				t.Fatalf("Check(%q) = %v, want an error saying %q", tc.args, err, tc.bad)
			case err != nil && len(tc.args) > 3 && strings.Contains(err.Error(), tc.args):
				t.Fatalf("Check's error repeats the arguments: %v", err)
			}
		})
	}
}

func TestHoldsPIN(t *testing.T) {
	args := "configdir='sql:/srv/nss-1234' flags=x"
	for _, tc := range []struct {
		pin  string
		want bool
	}{{"", false}, {"1234", true}, {"nss-1234", true}, {"4321", false}} {
		if got := HoldsPIN(args, []byte(tc.pin)); got != tc.want {
			t.Errorf("HoldsPIN(%q) = %v, want %v", tc.pin, got, tc.want)
		}
	}
}
