package daemon

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
)

// An ambiguous probe answer (CKR_GENERAL_ERROR: what SoftHSM gives a
// C_GetTokenInfo while another process logs in) fails a member only when
// its next probe answers so again; a good answer between them clears the
// doubt; an unambiguous health error (CKR_DEVICE_ERROR) fails it at once.
func TestProbeConfirmsAnAmbiguousError(t *testing.T) {
	toks := testhsm.Take(t, 2)
	pin := pinFile(t)
	cfgPath := filepath.Join(t.TempDir(), "hagroup.toml")
	text := "[[group]]\nlabel = \"g\"\nserial = \"1000001\"\n" + memberTOML("a", toks[0], pin, false) + memberTOML("b", toks[1], pin, false)
	if err := os.WriteFile(cfgPath, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	gc := cfg.Groups[0]
	faults := slottest.NewFaults()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	eng, err := OpenGroup(ctx, gc, cfg.Settings(&gc), Env{StateDir: t.TempDir(), Interceptor: faults}, func(agent.Event) {})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	ge := eng.(*groupEngine)
	state := func(name string) member.State {
		m, ok := ge.h.Engine().Member(name)
		if !ok {
			t.Fatalf("no member %s", name)
		}
		return m.State()
	}
	probe := func(want member.State) {
		t.Helper()
		eng.Probe(ctx)
		if got := state("a"); got != want {
			t.Fatalf("member a is %v after the probe, want %v", got, want)
		}
	}
	general := pkcs11.Error(pkcs11.CKR_GENERAL_ERROR)

	faults.FailN("a", slot.OpTokenInfo, general, 1)
	probe(member.Active) // doubted, not failed
	probe(member.Active) // answered: the doubt is gone
	faults.FailN("a", slot.OpTokenInfo, general, 1)
	probe(member.Active) // a fresh doubt
	faults.FailN("a", slot.OpTokenInfo, general, 1)
	probe(member.Failed) // confirmed
	if got := state("b"); got != member.Active {
		t.Fatalf("member b is %v, want active", got)
	}

	faults.FailN("b", slot.OpTokenInfo, pkcs11.Error(pkcs11.CKR_DEVICE_ERROR), 1)
	eng.Probe(ctx)
	if got := state("b"); got != member.Failed {
		t.Fatalf("member b is %v after CKR_DEVICE_ERROR, want failed at once", got)
	}
}
