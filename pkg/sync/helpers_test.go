package sync

import (
	"bytes"
	"os"
	"testing"

	"github.com/hagroup/hagroup/internal/synctest"
	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

func TestMain(m *testing.M) { os.Exit(testhsm.Main(m, 320)) }

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
	findByLabel   = synctest.FindByLabel
	oidP256Params = synctest.P256Params
	oidEd25519Der = synctest.Ed25519Params
)

type keyPair = synctest.KeyPair

func attr(t uint, v any) *pkcs11.Attribute { return pkcs11.NewAttribute(t, v) }

func mustFingerprint(t *testing.T, s *slot.Slot, h pkcs11.ObjectHandle) []byte {
	t.Helper()
	fp, err := object.Fingerprint(testContext(t), s, h)
	if err != nil {
		t.Fatalf("fingerprint of %d on %s: %v", h, s.Name(), err)
	}
	return fp
}

func sameBytes(a, b []byte) bool { return len(a) > 0 && bytes.Equal(a, b) }

// installDomain installs the domain key of serial on the slots.
func installDomain(t *testing.T, serial string, trusted bool, ss []*slot.Slot, toks []testhsm.Token) {
	t.Helper()
	var ms []domainkey.Target
	for i, s := range ss {
		m := domainkey.Target{Slot: s}
		if trusted {
			m.SOPIN = secret.PINFromString(toks[i].SOPIN)
			m.UserPIN = secret.PINFromString(toks[i].UserPIN)
		}
		ms = append(ms, m)
	}
	if err := domainkey.Install(testContext(t), ms, serial); err != nil {
		t.Fatalf("install domain key: %v", err)
	}
}
