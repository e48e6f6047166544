package object

import (
	"bytes"
	"os"
	"testing"

	"github.com/hagroup/hagroup/internal/synctest"
	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

func TestMain(m *testing.M) { os.Exit(testhsm.Main(m, 16)) }

var (
	testContext   = synctest.Context
	openSlot      = synctest.OpenSlot
	openN         = synctest.OpenN
	randomID      = synctest.RandomID
	genEC         = synctest.GenEC
	genEd25519    = synctest.GenEd25519
	genRSA        = synctest.GenRSA
	genAES        = synctest.GenAES
	getAttr       = synctest.GetAttr
	oidP256Params = synctest.P256Params
	oidEd25519Der = synctest.Ed25519Params
)

type keyPair = synctest.KeyPair

func attr(t uint, v any) *pkcs11.Attribute { return pkcs11.NewAttribute(t, v) }

func mustFingerprint(t *testing.T, s *slot.Slot, h pkcs11.ObjectHandle) []byte {
	t.Helper()
	fp, err := Fingerprint(testContext(t), s, h)
	if err != nil {
		t.Fatalf("fingerprint of %d on %s: %v", h, s.Name(), err)
	}
	return fp
}

func sameBytes(a, b []byte) bool { return len(a) > 0 && bytes.Equal(a, b) }
