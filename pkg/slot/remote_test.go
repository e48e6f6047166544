package slot_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// A served token's module path (hagroup-remote:unix:…) gives every Open a
// context and connection of its own: Reinit of one slot leaves another on
// the same path alone, and a malformed path is an invalid spec.
func TestRemoteModuleOwnContext(t *testing.T) {
	srv := testhsm.ServeRemote(t, "slot-remote")
	spec := specOf(srv.Token())
	spec.CommandTimeout = 10 * time.Second
	a, b := open(t, spec), open(t, spec)
	if !a.OwnsContext() || !b.OwnsContext() {
		t.Fatalf("OwnsContext = %v, %v; want true for both", a.OwnsContext(), b.OwnsContext())
	}
	refs, inits, _ := slot.ModuleCounts(spec.Module)
	if refs != 0 || inits != 2 {
		t.Errorf("ModuleCounts(%s) = refs %d, inits %d; want 0 shared users, 2 inits", spec.Module, refs, inits)
	}
	if err := a.Reinit(ctxT(t)); err != nil {
		t.Fatalf("Reinit a: %v", err)
	}
	for _, s := range []*slot.Slot{a, b} {
		if _, err := s.GenerateRandom(ctxT(t), 8); err != nil {
			t.Errorf("%p after Reinit of a: %v", s, err)
		}
	}
	bad := spec
	bad.Module = "hagroup-remote:unix:relative.sock"
	_, err := slot.Open(ctxT(t), bad)
	if !errors.Is(err, slot.ErrInvalidSpec) || !strings.Contains(err.Error(), "absolute") {
		t.Errorf("Open(%s): %v, want ErrInvalidSpec naming the path", bad.Module, err)
	}
	if _, err := a.MechanismInfo(ctxT(t), pkcs11.CKM_AES_KEY_WRAP_PAD); err != nil {
		t.Errorf("CKM_AES_KEY_WRAP_PAD over the remote: %v", err)
	}
}
