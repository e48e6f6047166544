package ha

import (
	"crypto/rand"
	"slices"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/recover"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/miekg/pkcs11"
)

// TestNextProcessTriesNothing: a process opening a group with the state
// directory of one that ran before (a per-task tool, started again) makes
// no trial key at Open and no trial copy of the trusted domain key at its
// first creation (whose replication audits the key); one with a state
// directory of its own tries both, as the first did. The facts name the
// token, so the answers are the same.
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
		keys := map[string]int{} // the trial keys, made before the first creation's own
		for _, tok := range toks {
			keys[tok.Name] = faults.Calls(tok.Name, slot.OpGenerateKey) + faults.Calls(tok.Name, slot.OpGenerateKeyPair)
		}
		firstCreation(t, g, what)
		for _, tok := range toks {
			keys := keys[tok.Name]
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

// firstCreation makes a key pair through g, logged in: its replication
// audits every member's domain key (an application's login does not).
func firstCreation(t *testing.T, g *Group, what string) {
	t.Helper()
	s, err := g.Engine().OpenSession(testCtx(t), pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		t.Fatalf("%s: open a session: %v", what, err)
	}
	defer s.Close()
	genEC(t, s, "first-"+strings.ReplaceAll(what, " ", "-"))
}

// TestFactsHideNoReplacedDomainKey: what one process kept of a member's
// domain key (its trial copies refused) does not vouch for another key.
// An attacker with the user PIN replaces the key on the member token
// itself, between two processes sharing the state directory, by one a
// user could change at will: the second process reports it weak, and
// trusts the fact only for the unchanged key on the other member.
func TestFactsHideNoReplacedDomainKey(t *testing.T) {
	ctx := testCtx(t)
	toks := testhsm.Take(t, 2)
	cfg := groupOn(t, toks)
	set := config.Defaults()
	stateDir := t.TempDir()
	login := func(what string) (*recorder, *slottest.Faults) {
		t.Helper()
		ev, faults := newRecorder(), slottest.NewFaults()
		g, err := Open(ctx, cfg, set, Options{StateDir: stateDir, Interceptor: faults, Events: ev})
		if err != nil {
			t.Fatalf("%s: open: %v", what, err)
		}
		defer g.Close()
		if err := g.Engine().Login(ctx, pkcs11.CKU_USER, secret.PINFromString(testhsm.UserPIN)); err != nil {
			t.Fatalf("%s: login: %v", what, err)
		}
		firstCreation(t, g, what)
		return ev, faults
	}
	if ev, _ := login("the first process"); len(ev.groupEvents(group.DomainKeyWeak, "")) != 0 {
		t.Fatalf("the ceremony's key reported weak: %v", ev.groupEvents(group.DomainKeyWeak, ""))
	}
	victim := toks[1]
	s := direct(t, victim)
	if err := domainkey.Remove(ctx, s, cfg.Serial); err != nil {
		t.Fatal(err)
	}
	value := make([]byte, 32)
	rand.Read(value)
	if _, err := s.CreateObject(ctx, []*pkcs11.Attribute{
		a(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), a(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
		a(pkcs11.CKA_VALUE, value), a(pkcs11.CKA_LABEL, domainkey.Label(cfg.Serial)),
		a(pkcs11.CKA_TOKEN, true), a(pkcs11.CKA_PRIVATE, true), a(pkcs11.CKA_SENSITIVE, true),
		a(pkcs11.CKA_EXTRACTABLE, false), a(pkcs11.CKA_WRAP, true), a(pkcs11.CKA_UNWRAP, true),
		a(pkcs11.CKA_MODIFIABLE, true),
	}); err != nil {
		t.Fatal(err)
	}
	ev, faults := login("the next process")
	weak := ev.groupEvents(group.DomainKeyWeak, victim.Name)
	if len(weak) != 1 || !strings.Contains(weak[0].Err.Error(), "CKA_MODIFIABLE=true") {
		t.Errorf("the planted key on %s: %d domain_key_weak events (%v), want 1 naming CKA_MODIFIABLE=true", victim.Name, len(weak), weak)
	}
	if n := faults.Calls(toks[0].Name, slot.OpCopyObject); n != 0 {
		t.Errorf("%d trial copies of the unchanged key on %s, want none", n, toks[0].Name)
	}
}

// TestSynchronizeAuditsNoDomainKeyAgain: the recoverer copies with the
// engine's replicator, so a synchronize after the first creation makes no
// trial copy of the domain keys that creation's replication audited (a
// process without a state directory, which keeps nothing on disk), and
// the key it copies back travels wrapped under them.
func TestSynchronizeAuditsNoDomainKeyAgain(t *testing.T) {
	ctx := testCtx(t)
	toks := testhsm.Take(t, 2)
	cfg := groupOn(t, toks)
	faults := slottest.NewFaults()
	g, err := Open(ctx, cfg, config.Defaults(), Options{Interceptor: faults})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Engine().Login(ctx, pkcs11.CKU_USER, secret.PINFromString(testhsm.UserPIN)); err != nil {
		t.Fatal(err)
	}
	s, err := g.Engine().OpenSession(ctx, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	genEC(t, s, "synced-back")
	trials := map[string]int{}
	for _, tok := range toks {
		if trials[tok.Name] = faults.Calls(tok.Name, slot.OpCopyObject); trials[tok.Name] == 0 {
			t.Fatalf("the first creation made no trial copy of the domain key on %s", tok.Name)
		}
	}
	victim := direct(t, toks[1])
	hs, err := victim.FindObjects(ctx, []*pkcs11.Attribute{a(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY), a(pkcs11.CKA_LABEL, "synced-back")})
	if err != nil || len(hs) != 1 {
		t.Fatalf("the private key on %s: %v, %v", toks[1].Name, hs, err)
	}
	if err := victim.DestroyObject(ctx, hs[0]); err != nil {
		t.Fatal(err)
	}
	rep, err := g.Synchronize(ctx, recover.SyncOptions{})
	if err != nil {
		t.Fatalf("synchronize: %v", err)
	}
	if rep.Applied == nil || len(rep.Applied.Done) != 1 || len(rep.Applied.Failed) != 0 {
		t.Fatalf("synchronize applied %+v, want the private key copied back", rep.Applied)
	}
	if faults.Calls(toks[1].Name, slot.OpUnwrapKey) == 0 {
		t.Fatalf("the key reached %s without an unwrap", toks[1].Name)
	}
	for _, tok := range toks {
		if n := faults.Calls(tok.Name, slot.OpCopyObject); n != trials[tok.Name] {
			t.Errorf("%d trial copies on %s during synchronize, want none (the first creation audited the key)", n-trials[tok.Name], tok.Name)
		}
	}
}
