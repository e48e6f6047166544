// Package security tries, as an attacker would, to get a group key out, to
// open the group without the PIN, to lock an HSM out, and to reach a member
// through its socket, on real SoftHSM tokens and real processes; every test
// asserts that the attacker's step is refused, with the CKR code a bare token
// would give.
package security

import (
	"os"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
)

// poolSize is how many in-process tokens the tests of this package may Take:
// enough for go test -count=5 (one run takes 13).
const poolSize = 80

func TestMain(m *testing.M) { os.Exit(testhsm.Main(m, poolSize)) }
