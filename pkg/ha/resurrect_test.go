package ha

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
)

// Soak S2 as haagent and an application wire the engine: two groups on
// the same tokens and the same state directory (the "agent" and the
// "application", sharing the tombstone journal), the second member away
// in both. The application destroys a key pair while the agent's recovery
// of that member is listing the serving member. The agent used to read
// the tombstones before listing, found the pair on the returning member
// only, and copied it back to every member. It must stay destroyed
// everywhere, and the member return to rotation.
func TestKeyDestroyedByAnotherProcessDuringAgentRecoveryStaysGone(t *testing.T) {
	ctx := testCtx(t)
	toks := testhsm.Take(t, 2)
	cfg := groupOn(t, toks)
	set := config.Defaults()
	set.CommandTimeout = 10 * time.Second
	set.Interval = time.Second
	set.Retries = 0
	stateDir := t.TempDir()
	hook := &hookFaults{Faults: slottest.NewFaults()}
	open := func(ic slot.Interceptor) *Group {
		g, err := Open(ctx, cfg, set, Options{StateDir: stateDir, Interceptor: ic})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { g.Close() })
		if err := g.Engine().Login(ctx, pkcs11.CKU_USER, secret.PINFromString(testhsm.UserPIN)); err != nil {
			t.Fatalf("Login: %v", err)
		}
		return g
	}
	agentG, appG := open(hook), open(nil)
	s, err := appG.Engine().OpenSession(ctx, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pub, priv := genEC(t, s, "doomed")
	genEC(t, s, "kept")
	serving, away := toks[0].Name, toks[1].Name
	for _, g := range []*Group{agentG, appG} {
		if err := g.Engine().FailMember(away, errors.New("test: away")); err != nil {
			t.Fatal(err)
		}
	}
	var once sync.Once
	hook.set(serving, slot.OpFindObjects, func() {
		once.Do(func() {
			hook.set("", "", nil)
			for _, h := range []group.ObjectHandle{priv, pub} {
				if err := appG.Engine().DestroyObject(ctx, h); err != nil {
					t.Errorf("destroy through the application's group: %v", err)
				}
			}
		})
	})
	if _, err := agentG.Recover(ctx, away); err != nil {
		t.Fatalf("agent's recovery: %v", err)
	}
	if m, _ := agentG.Engine().Member(away); m.State() != member.Active {
		t.Fatalf("%s is %v in the agent after its recovery", away, m.State())
	}
	for _, tok := range toks {
		got := findLabelled(t, direct(t, tok), "")
		sort.Strings(got)
		if fmt.Sprint(got) != "[kept kept]" {
			t.Errorf("%s holds %v after the agent's recovery, want only the kept pair", tok.Name, got)
		}
	}
}
