package domainkey

import (
	"os"
	"testing"

	"github.com/hagroup/hagroup/internal/synctest"
	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

func TestMain(m *testing.M) { os.Exit(testhsm.Main(m, 32)) }

var (
	testContext = synctest.Context
	openSlot    = synctest.OpenSlot
	openN       = synctest.OpenN
	randomID    = synctest.RandomID
	genAES      = synctest.GenAES
	getAttr     = synctest.GetAttr
	findByLabel = synctest.FindByLabel
)

func attr(t uint, v any) *pkcs11.Attribute { return pkcs11.NewAttribute(t, v) }

// installDomain installs the domain key of serial on the slots.
func installDomain(t *testing.T, serial string, trusted bool, ss []*slot.Slot, toks []testhsm.Token) {
	t.Helper()
	var ms []Target
	for i, s := range ss {
		m := Target{Slot: s}
		if trusted {
			m.SOPIN = secret.PINFromString(toks[i].SOPIN)
			m.UserPIN = secret.PINFromString(toks[i].UserPIN)
		}
		ms = append(ms, m)
	}
	if err := Install(testContext(t), ms, serial); err != nil {
		t.Fatalf("install domain key: %v", err)
	}
}

var kwp = pkcs11.NewMechanism(Mechanism, nil)
