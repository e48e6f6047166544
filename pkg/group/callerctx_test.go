package group

import (
	"context"
	"runtime"
	stdsync "sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// cancelOnFollower cancels the caller's context when a write reaches a
// member other than the first, then lets the call go on: the caller gives
// up after the first member has done the write.
type cancelOnFollower struct {
	first string
	op    slot.Op
	mu    stdsync.Mutex
	fire  context.CancelFunc
	fired int
}

func (c *cancelOnFollower) arm(cancel context.CancelFunc) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fire = cancel
}

func (c *cancelOnFollower) Before(ctx context.Context, token string, op slot.Op) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fire != nil && token != c.first && op == c.op {
		c.fire()
		c.fired++
	}
	return nil
}

// A write done on its first member is the group's: a caller that gives up
// while the others are being written (a Go caller's deadline under load)
// fails no member, and every member ends up with the write. Before, the
// followers ran under the caller's ctx: a destroy failed each member it
// had not reached yet (TestCatchUpWindowMissesNothing, pkg/ha, under
// load), and a creation reported them as refusing the copy.
func TestCallerGivingUpAfterTheFirstMemberFailsNoMember(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   slot.Op
	}{
		{"destroy", slot.OpDestroyObject},
		{"create", slot.OpCreateObject},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ic := &cancelOnFollower{op: tc.op}
			f := setup(t, setupOpts{interceptor: ic, policy: config.PolicyPrimaryBackup})
			ic.first = f.toks[0].Name
			s := openSession(t, f.g)
			label := "caller-gives-up-" + tc.name
			tmpl := []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, true),
				attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_VALUE, []byte("payload"))}
			ctx, cancel := context.WithCancel(testContext(t))
			defer cancel()
			want := 1
			if tc.op == slot.OpDestroyObject {
				h, err := s.CreateObject(ctx, tmpl)
				if err != nil {
					t.Fatal(err)
				}
				ic.arm(cancel)
				if err := s.DestroyObject(ctx, h); err != nil {
					t.Fatalf("DestroyObject whose caller gave up after the first member: %v", err)
				}
				want = 0
			} else {
				ic.arm(cancel)
				if _, err := s.CreateObject(ctx, tmpl); err != nil {
					t.Fatalf("CreateObject whose caller gave up after the primary: %v", err)
				}
			}
			ic.mu.Lock()
			fired := ic.fired
			ic.mu.Unlock()
			if fired == 0 {
				t.Fatal("the caller never gave up: the test did not run")
			}
			wantServing(t, f, "after a write whose caller gave up")
			for _, tok := range f.toks {
				if got := len(findDirect(t, openDirect(t, tok), label)); got != want {
					t.Errorf("%s holds %d objects labelled %s, want %d", tok.Name, got, label, want)
				}
			}
		})
	}
}

// A key generation whose caller gives up while the token is still making
// the key ends as a creation either made or not made, never half: an error
// leaves no key on the member. Before, the generation was abandoned in the
// module, the leftover search found nothing yet (no object lock on NSS
// softokn), and the key pair appeared on the serving member once the
// module finished: a key the application was told had not been made. The
// cancel comes 100 ms into an RSA-4096 generation, which takes NSS about
// a second and a half here; should it be quicker, the creation succeeds
// and the test checks that outcome instead.
func TestCancelledGenerationLeavesNoKey(t *testing.T) {
	nss := testhsm.NSS(t, "nss-cancelled")
	f := setup(t, setupOpts{toks: []testhsm.Token{nss}, noDomain: true})
	s := openSession(t, f.g)
	m, _ := f.g.Member(nss.Name)
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	time.AfterFunc(100*time.Millisecond, cancel)
	const label = "cancelled-generation"
	_, _, err := s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_MODULUS_BITS, 4096),
			attr(pkcs11.CKA_PUBLIC_EXPONENT, []byte{1, 0, 1}), attr(pkcs11.CKA_VERIFY, true)},
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_PRIVATE, true)})
	// Whatever the module still does for an abandoned call ends first.
	wctx := testContext(t)
	for m.Slot().Stats().Quarantined > 0 {
		if wctx.Err() != nil {
			t.Fatal("an abandoned call never came back from the module")
		}
		runtime.Gosched()
	}
	hs, ferr := m.Slot().FindObjects(testContext(t), []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, label)})
	if ferr != nil {
		t.Fatal(ferr)
	}
	want := 2
	if err != nil {
		want = 0
	}
	if len(hs) != want {
		t.Errorf("GenerateKeyPair answered %v, and the member holds %d objects labelled %s, want %d", err, len(hs), label, want)
	}
	if st := memberState(f.g, nss.Name); st != member.Active {
		t.Errorf("the member is %v after its caller gave up a generation, want active", st)
	}
}
