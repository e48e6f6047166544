// Package initargs checks a member's init arguments: the string a PKCS#11
// module receives as pReserved of C_Initialize's CK_C_INITIALIZE_ARGS
// (p11-kit's x-init-reserved), such as NSS softokn's
//
//	configdir='sql:/var/lib/nss' certPrefix='' keyPrefix='' secmod='secmod.db'
//
// Init arguments are configuration, not secrets: they are written in the
// config file, shown by hactl and passed on hsmserve's command line. So a
// PIN must never be in them, and Check refuses what would carry one.
// It has no dependencies, so that pkg/config, pkg/slot and hsmserve share
// the one rule.
package initargs

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxLen bounds init arguments. NSS's longest real ones (a configdir, the
// prefixes, token descriptions and flags) are a few hundred bytes.
const MaxLen = 4096

// secretName matches a parameter that names a secret, in NSS's
// name=value syntax and in the usual spellings of other modules.
var secretName = regexp.MustCompile(`(?i)(^|[^a-z0-9_])(pin|so_?pin|user_?pin|pass(word|wd|phrase)?|pwd|secret)\s*[=:]`)

// Check reports whether args may be a member's init arguments: at most
// MaxLen bytes of UTF-8 without control characters (it is a C string, and
// it is printed), and no parameter that names a PIN or password. The
// error never repeats args, which might hold a secret.
func Check(args string) error {
	switch {
	case len(args) > MaxLen:
		return fmt.Errorf("init arguments are %d bytes, more than %d", len(args), MaxLen)
	case !utf8.ValidString(args):
		return errors.New("init arguments are not valid UTF-8")
	case strings.IndexFunc(args, unicode.IsControl) >= 0:
		return errors.New("init arguments contain a control character (a NUL, newline or tab)")
	case secretName.MatchString(args):
		return errors.New("init arguments name a PIN or password parameter: a PIN never goes in init arguments (they are shown by hactl and on command lines); give it with pin_file or pin_env")
	}
	return nil
}

// HoldsPIN reports whether args contain pin, a member's PIN, as text.
// An empty pin is in nothing.
func HoldsPIN(args string, pin []byte) bool {
	return len(pin) > 0 && strings.Contains(args, string(pin))
}
