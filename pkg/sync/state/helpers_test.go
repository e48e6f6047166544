package state

import (
	"os"
	"testing"

	"github.com/hagroup/hagroup/internal/synctest"
	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/miekg/pkcs11"
)

func TestMain(m *testing.M) { os.Exit(testhsm.Main(m, 8)) }

var (
	testContext = synctest.Context
	openSlot    = synctest.OpenSlot
	openN       = synctest.OpenN
)

func attr(t uint, v any) *pkcs11.Attribute { return pkcs11.NewAttribute(t, v) }
