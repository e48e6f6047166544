package recover

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync"
	"github.com/hagroup/hagroup/pkg/sync/tombstone"
	"github.com/miekg/pkcs11"
)

// listingOrder is a slot.WrapInterceptor for another process's slots: the
// FindObjects of the token first waits until the others' FindObjects
// have answered, then runs before (outside the interceptor's lock), and
// only then is the call made. It orders the parallel listings of a plan.
type listingOrder struct {
	first  string        // the token whose listing runs last
	others chan struct{} // one value per other token's answered FindObjects
	n      int           // how many others
	before func()        // run once, before first's FindObjects
}

func (l *listingOrder) Before(context.Context, string, slot.Op) error { return nil }

func (l *listingOrder) Wrap(ctx context.Context, token string, op slot.Op, call func() error) error {
	if op != slot.OpFindObjects {
		return call()
	}
	if token != l.first {
		err := call()
		select {
		case l.others <- struct{}{}:
		default:
		}
		return err
	}
	if fn := l.before; fn != nil {
		l.before = nil // one listing: FindObjects of first runs on one goroutine at a time
		for range l.n {
			select {
			case <-l.others:
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(30 * time.Second):
				return errors.New("test: the other listings did not answer within 30s")
			}
		}
		fn()
	}
	return call()
}

// Soak seed 1796068917464095269 (issue 6): 12 key pairs destroyed
// through the group were found on every member at the end, tombstoned.
// The interleaving, across processes:
//
//  1. another process (libhapkcs11, haagent) catches up a member: its plan
//     lists m1 and m2 just before this process's group makes a key pair on
//     m0 and replicates it to m1 and m2, and lists m0 just after. The pair
//     is on m0 only in that plan, so it copies it to m1 and m2, without
//     searching them first (the listing said they lack it): m1 and m2
//     now hold it twice;
//  2. this process's group, with m0 failed in its view (the other process
//     still serves from it), destroys the pair: the tombstone is written
//     ahead, and the destroy removes the copy it knows on m1 and m2. The
//     second copies stay;
//  3. m0 returns: its catch-up finds the pair, tombstoned, on every
//     member, and the plan took that for the key made again after the
//     destroy, and left it everywhere.
//
// The pair must be gone from m1 and m2 when the destroy returns, and from
// every member once m0 has caught up.
func TestDestroyedPairCopiedTwiceByAnotherProcessStaysGone(t *testing.T) {
	r := newRig(t, rigOpts{n: 3, retries: 0})
	m0, m1, m2 := r.name(0), r.name(1), r.name(2)
	s := r.session()
	r.genEC(s, "kept")

	// The other process: its own slots on the tokens, its own journal.
	order := &listingOrder{first: m0 + "-other", others: make(chan struct{}, 2), n: 2}
	var other []sync.PlanMember
	for _, tok := range r.toks {
		sl, err := slot.Open(rigCtx(t), slot.Spec{
			Name: tok.Name + "-other", Module: tok.Module, ModuleEnv: tok.ModuleEnv, TokenLabel: tok.Label,
			PIN: secret.PINFromString(testhsm.UserPIN), CommandTimeout: 20 * time.Second, Interceptor: order,
		})
		if err != nil {
			t.Fatalf("open %s for the other process: %v", tok.Name, err)
		}
		t.Cleanup(func() { sl.Close() })
		other = append(other, sync.PlanMember{Name: tok.Name, Slot: sl})
	}
	otherJournal, err := tombstone.Open(r.stateDir, r.cfg.Serial, tombstone.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer otherJournal.Close()
	load := func(ctx context.Context) (sync.Tombstones, error) { return otherJournal.Snapshot(ctx) }

	// 1. The pair is made through this process's group between the other
	// process's listings of m1, m2 and its listing of m0.
	pair := make(chan [2]group.ObjectHandle, 1)
	order.before = func() {
		pub, priv := r.genEC(s, "doomed")
		pair <- [2]group.ObjectHandle{pub, priv}
	}
	plan, err := sync.MakePlan(rigCtx(t), other, nil, sync.PlanOptions{SkipUnreachable: true, LoadTombstones: load})
	if err != nil {
		t.Fatalf("the other process's plan: %v", err)
	}
	var made [2]group.ObjectHandle
	select {
	case made = <-pair:
	default:
		t.Fatal("the pair was not made during the other process's listing")
	}
	want := map[string]bool{}
	for _, a := range plan.Actions {
		if a.Kind == sync.Copy && a.Identity.Label == "doomed" && a.Source == m0 {
			want[a.Member] = true
		}
	}
	if !want[m1] || !want[m2] {
		t.Fatalf("the other process's plan does not copy the pair from %s to %s and %s: %v", m0, m1, m2, plan.Actions)
	}
	rep := &sync.Replicator{GroupSerial: r.cfg.Serial}
	if _, err := rep.Apply(rigCtx(t), plan); err != nil {
		t.Fatalf("the other process's apply: %v", err)
	}
	// Its apply re-checks the targets (issue 15) and takes its second
	// copies back.
	for _, i := range []int{1, 2} {
		if n := count(labels(inventory(t, r.direct(r.toks[i], "-dup"))), "doomed"); n != 2 {
			t.Fatalf("%s holds %d objects labelled doomed after the other process's copies, want the pair once (2)", r.name(i), n)
		}
	}
	// Second copies a race may still leave (both hosts' re-checks ran
	// before either copied), made here directly, public halves first.
	for _, class := range []uint{pkcs11.CKO_PUBLIC_KEY, pkcs11.CKO_PRIVATE_KEY} {
		hs, err := other[0].Slot.FindObjects(rigCtx(t), []*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_LABEL, "doomed"), pkcs11.NewAttribute(pkcs11.CKA_CLASS, class)})
		if err != nil || len(hs) != 1 {
			t.Fatalf("find the pair's half on %s: %v %v", m0, hs, err)
		}
		for _, pm := range other[1:] {
			if _, err := rep.Replicate(rigCtx(t), other[0].Slot, hs[0], sync.Target{Slot: pm.Slot, Absent: true}); err != nil {
				t.Fatalf("second copy on %s: %v", pm.Name, err)
			}
		}
	}
	for _, i := range []int{1, 2} {
		if n := count(labels(inventory(t, r.direct(r.toks[i], "-dup2"))), "doomed"); n != 4 {
			t.Fatalf("%s holds %d objects labelled doomed, want the pair twice (4)", r.name(i), n)
		}
	}

	// 2. m0 fails in this process's view; the pair is destroyed.
	if err := r.g.FailMember(m0, errors.New("test: away from this process")); err != nil {
		t.Fatal(err)
	}
	for _, h := range []group.ObjectHandle{made[1], made[0]} { // private half first, as the soak's loads do
		if err := r.g.DestroyObject(rigCtx(t), h); err != nil {
			t.Fatalf("destroy: %v", err)
		}
	}
	for _, i := range []int{1, 2} {
		inv := inventory(t, r.direct(r.toks[i], "-destroyed"))
		if n := count(labels(inv), "doomed"); n != 0 {
			t.Errorf("%s, serving, holds %d objects labelled doomed after the destroy returned:\n  %s", r.name(i), n, dump(inv))
		}
	}

	// 3. m0 returns.
	r.recoverExpecting(m0, "kept", "kept")
}

func count(ls []string, l string) int {
	n := 0
	for _, x := range ls {
		if x == l {
			n++
		}
	}
	return n
}

// Soak seed 1796073944601797857 (issue 6): a pair destroyed through the
// module came back on every member. Its private key's tombstone was
// recorded ahead, and before the destroy reached the only serving member a
// catch-up in another process, reading that tombstone, deleted the key
// there. The destroy found no member holding it, took that for "the
// destroy did not happen" and revoked the tombstone; the copy on a member
// that was away was then live again and came back everywhere.
//
// The tombstone must stand, and the key stay gone once the member that
// was away has caught up.
func TestDestroyAnticipatedByCatchUpKeepsItsTombstone(t *testing.T) {
	hook := &hookOnce{}
	r := newRig(t, rigOpts{n: 2, retries: 0, interceptor: hook})
	serving, away := r.name(0), r.name(1)
	s := r.session()
	pub, priv := r.genEC(s, "doomed")
	r.genEC(s, "kept")
	if err := r.g.FailMember(away, errors.New("test: away")); err != nil {
		t.Fatal(err)
	}
	// The other process serves only the member this process serves too.
	other := []sync.PlanMember{{Name: serving, Slot: r.direct(r.toks[0], "-other")}}
	otherJournal, err := tombstone.Open(r.stateDir, r.cfg.Serial, tombstone.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer otherJournal.Close()
	var deleted int
	hook.arm(serving, func() {
		// Between the tombstone recorded ahead and the destroy on the
		// serving member: the other process's catch-up applies it.
		plan, err := sync.MakePlan(rigCtx(t), other, nil, sync.PlanOptions{
			LoadTombstones: func(ctx context.Context) (sync.Tombstones, error) { return otherJournal.Snapshot(ctx) }})
		if err != nil {
			t.Errorf("the other process's plan: %v", err)
			return
		}
		res, err := (&sync.Replicator{GroupSerial: r.cfg.Serial}).Apply(rigCtx(t), plan)
		if err != nil {
			t.Errorf("the other process's apply: %v", err)
			return
		}
		deleted = len(res.Done)
	}, slot.OpDestroyObject)
	err = r.g.DestroyObject(rigCtx(t), priv)
	if deleted != 1 {
		t.Fatalf("the other process's catch-up deleted %d objects, want the private key", deleted)
	}
	t.Logf("destroy of the private key after the catch-up deleted it: %v", err)
	if err := r.g.DestroyObject(rigCtx(t), pub); err != nil {
		t.Fatalf("destroy the public key: %v", err)
	}
	r.recoverExpecting(away, "kept", "kept")
}
