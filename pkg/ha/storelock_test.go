package ha

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/miekg/pkcs11"
)

// Every process of a host that opens the group with its state directory
// (haagent, libhapkcs11.so, the Go API) changes an in-process SoftHSM
// member under one store lock per member there, beside the recovery
// locks (slot.Spec.StoreLock): a key made through the group takes each
// member's.
func TestChangesTakeTheHostsStoreLocks(t *testing.T) {
	h := newHosts(t, 2)
	ctx := testCtx(t)
	stateDir := t.TempDir()
	g, err := Open(ctx, h.cfg, h.set, Options{StateDir: stateDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	if err := g.Engine().Login(ctx, pkcs11.CKU_USER, secret.PINFromString(testhsm.UserPIN)); err != nil {
		t.Fatal(err)
	}
	genEC(t, openSession(t, g), "locked")
	for _, tok := range h.toks {
		path := filepath.Join(stateDir, h.cfg.Serial, tok.Name+".store.lock")
		if _, err := os.Stat(path); err != nil {
			t.Errorf("member %s: no store lock after a key was made through the group: %v", tok.Name, err)
		}
	}
}
