package ha

import (
	"slices"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
)

// TestNextProcessTriesNothing: a process opening a group with the state
// directory of one that ran before (a per-task tool, started again) makes
// no trial key at Open and no trial copy of the trusted domain key at its
// login; one with a state directory of its own tries both, as the first
// did. The facts name the token, so the answers are the same.
func TestNextProcessTriesNothing(t *testing.T) {
	ctx := testCtx(t)
	toks := testhsm.Take(t, 2)
	cfg := groupOn(t, toks)
	set := config.Defaults()
	shared := t.TempDir()
	run := func(what, stateDir string, trials bool) {
		t.Helper()
		faults := slottest.NewFaults()
		g, err := Open(ctx, cfg, set, Options{StateDir: stateDir, Interceptor: faults})
		if err != nil {
			t.Fatalf("%s: open: %v", what, err)
		}
		defer g.Close()
		if err := g.Engine().Login(ctx, pkcs11.CKU_USER, secret.PINFromString(testhsm.UserPIN)); err != nil {
			t.Fatalf("%s: login: %v", what, err)
		}
		for _, tok := range toks {
			keys := faults.Calls(tok.Name, slot.OpGenerateKey) + faults.Calls(tok.Name, slot.OpGenerateKeyPair)
			copies := faults.Calls(tok.Name, slot.OpCopyObject)
			if (keys > 0) != trials || (copies > 0) != trials {
				t.Errorf("%s: %d trial keys and %d trial copies on %s, want trials %v", what, keys, copies, tok.Name, trials)
			}
		}
		// SoftHSM 2.6 refuses to wrap EdDSA private keys: a group of two
		// does not offer to generate them, probed or told by the facts.
		mechs, err := g.Engine().Mechanisms(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(mechs, slot.CKMECEdwardsKeyPairGen) {
			t.Errorf("%s: the group offers CKM_EC_EDWARDS_KEY_PAIR_GEN", what)
		}
		if !slices.Contains(mechs, pkcs11.CKM_EC_KEY_PAIR_GEN) {
			t.Errorf("%s: the group does not offer CKM_EC_KEY_PAIR_GEN", what)
		}
	}
	run("the first process", shared, true)
	run("the next process", shared, false)
	run("a process with a state directory of its own", t.TempDir(), true)
}
