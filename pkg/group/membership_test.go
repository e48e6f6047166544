package group

import (
	"context"
	"crypto/sha256"
	"errors"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
)

func dataTmpl(label string) []*pkcs11.Attribute {
	return []*pkcs11.Attribute{
		attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true),
		attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_VALUE, []byte("v-"+label)),
	}
}

func sign(t *testing.T, s *ecKey) error {
	t.Helper()
	d := sha256.Sum256([]byte("x"))
	_, err := s.sign(testContext(t), d[:])
	return err
}

// While the write barrier is held, object creation waits (here until its
// deadline, and then nothing is made) and signing goes on; after the
// release creation works again. WriteMark moves with every change.
func TestHoldWritesHoldsKeyManagementOnly(t *testing.T) {
	f := setup(t, setupOpts{n: 2})
	ctx := testContext(t)
	s := openSession(t, f.g)
	signer := ecSigner(t, f.g, "barrier")
	mark := f.g.WriteMark()
	if _, err := s.CreateObject(ctx, dataTmpl("before")); err != nil {
		t.Fatal(err)
	}
	if f.g.WriteMark() == mark {
		t.Fatal("WriteMark did not move with a creation")
	}
	release, err := f.g.HoldWrites(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mark = f.g.WriteMark()
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = s.CreateObject(short, dataTmpl("held"))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("CreateObject with the barrier held: %v, want a deadline error", err)
	}
	if err := sign(t, signer); err != nil {
		t.Fatalf("signing with the barrier held: %v", err)
	}
	if f.g.WriteMark() != mark {
		t.Fatal("WriteMark moved while writes were held")
	}
	// A second holder waits for the first.
	short, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
	if _, err := f.g.HoldWrites(short); err == nil {
		t.Fatal("a second HoldWrites succeeded while the first held")
	}
	cancel()
	release()
	release() // idempotent
	if _, err := s.CreateObject(ctx, dataTmpl("after")); err != nil {
		t.Fatalf("CreateObject after the release: %v", err)
	}
	for _, tok := range f.toks {
		if n := len(findDirect(t, openDirect(t, tok), "held")); n != 0 {
			t.Errorf("%s holds %d objects made while the barrier was held", tok.Name, n)
		}
	}
}

// RemoveMember waits for the single-part calls in flight on the member
// and for the multi-part operation pinned to it, which all succeed; the
// member takes no new work meanwhile and is closed afterwards.
func TestRemoveMemberDrains(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{interceptor: faults, policy: config.PolicyPrimaryBackup})
	ctx := testContext(t)
	victim := f.toks[0].Name // the primary: primary-backup sends it every call
	importSecret(t, f.toks, "mac")
	s := openSession(t, f.g)
	keys, err := s.Find(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, "mac")})
	if err != nil || len(keys) != 1 {
		t.Fatalf("find: %v %d", err, len(keys))
	}
	mech := pkcs11.NewMechanism(pkcs11.CKM_SHA256_HMAC, nil)
	// A multi-part MAC pinned to the victim.
	if err := s.SignInit(ctx, mech, keys[0]); err != nil {
		t.Fatal(err)
	}
	if err := s.SignUpdate(ctx, []byte("part one;")); err != nil {
		t.Fatal(err)
	}
	// Single-part calls in flight on the victim, slowed down.
	faults.Delay(victim, slot.OpSign, 300*time.Millisecond)
	const inflight = 4
	results := make(chan error, inflight)
	for range inflight {
		go func() {
			_, err := f.g.Sign(ctx, mech, keys[0], []byte("single"))
			results <- err
		}()
	}
	if err := faults.WaitCalls(ctx, victim, slot.OpSign, inflight); err != nil {
		t.Fatal(err)
	}
	removed := make(chan error, 1)
	go func() { removed <- f.g.RemoveMember(ctx, victim) }()
	// Out of the roster at once (MemberLeaving): new work goes elsewhere.
	for f.events.count(MemberLeaving, victim) == 0 {
		select {
		case err := <-removed:
			t.Fatalf("RemoveMember returned (%v) before the work ended", err)
		case <-f.events.ch:
		case <-ctx.Done():
			t.Fatal("the member was not taken out of rotation")
		}
	}
	if _, ok := f.g.Member(victim); ok {
		t.Fatal("the leaving member is still listed")
	}
	if f.g.Primary() == victim {
		t.Fatal("the member being removed is still primary")
	}
	for range inflight {
		if err := <-results; err != nil {
			t.Errorf("a call in flight during the removal failed: %v", err)
		}
	}
	// The pinned operation finishes on the member being drained.
	if err := s.SignUpdate(ctx, []byte("part two")); err != nil {
		t.Fatalf("SignUpdate during the removal: %v", err)
	}
	mac, err := s.SignFinal(ctx)
	if err != nil {
		t.Fatalf("SignFinal during the removal: %v", err)
	}
	if err := <-removed; err != nil {
		t.Fatalf("RemoveMember: %v", err)
	}
	faults.Heal(victim)
	if err := s.VerifyInit(ctx, mech, keys[0]); err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(ctx, []byte("part one;part two"), mac); err != nil {
		t.Fatalf("the MAC made across the removal does not verify: %v", err)
	}
	if f.events.count(MemberRemoved, victim) != 1 {
		t.Errorf("want one MemberRemoved event")
	}
	calls := faults.Calls(victim, slot.OpSign)
	if _, err := f.g.Sign(ctx, mech, keys[0], []byte("after")); err != nil {
		t.Fatal(err)
	}
	if faults.Calls(victim, slot.OpSign) != calls {
		t.Error("the removed member took a signature")
	}
	if len(f.g.Members()) != 2 {
		t.Errorf("%d members after the removal", len(f.g.Members()))
	}
	if err := f.g.RemoveMember(ctx, victim); !errors.Is(err, ErrUnknownMember) {
		t.Errorf("removing it again: %v", err)
	}
}

// AddMember brings a member in as recovering: it takes no work and no
// replicated objects until it is activated. RemoveMember refuses the last
// member. SetStandby demotes and promotes at once.
func TestAddMemberAndStandby(t *testing.T) {
	faults := slottest.NewFaults()
	toks := takeTokens(t, 3)
	f := setup(t, setupOpts{interceptor: faults, toks: toks[:2]})
	installDomain(t, f.cfg.Serial, toks[2:], true)
	ctx := testContext(t)
	s := openSession(t, f.g)
	signer := ecSigner(t, f.g, "standby-key")
	nc := memberCfg(toks[2])
	if err := f.g.AddMember(ctx, nc); err != nil {
		t.Fatalf("AddMember: %v", err)
	}
	if err := f.g.AddMember(ctx, nc); err == nil {
		t.Fatal("adding the same member twice succeeded")
	}
	if st := memberState(f.g, nc.Name); st != member.Recovering {
		t.Fatalf("new member is %v, want recovering", st)
	}
	if _, err := s.CreateObject(ctx, dataTmpl("while-joining")); err != nil {
		t.Fatal(err)
	}
	for range 50 {
		if err := sign(t, signer); err != nil {
			t.Fatal(err)
		}
	}
	if n := faults.Calls(nc.Name, slot.OpSign) + faults.Calls(nc.Name, slot.OpCreateObject); n != 0 {
		t.Fatalf("the member not yet caught up took %d calls", n)
	}
	if err := f.g.ActivateMember(ctx, nc.Name); err != nil {
		t.Fatal(err)
	}
	if got := f.g.Members()[2].Name; got != nc.Name {
		t.Errorf("the new member is not last in order (%s is)", got)
	}
	if _, err := s.CreateObject(ctx, dataTmpl("after-joining")); err != nil {
		t.Fatal(err)
	}
	if n := len(findDirect(t, openDirect(t, toks[2]), "after-joining")); n != 1 {
		t.Errorf("the active new member got %d copies of a new object", n)
	}

	// Standby changes at run time.
	a := toks[0].Name
	if err := f.g.SetStandby(a, true); err != nil {
		t.Fatal(err)
	}
	if st := memberState(f.g, a); st != member.Standby {
		t.Fatalf("member made standby is %v", st)
	}
	before := faults.Calls(a, slot.OpSign)
	for range 30 {
		if err := sign(t, signer); err != nil {
			t.Fatal(err)
		}
	}
	if faults.Calls(a, slot.OpSign) != before {
		t.Error("the standby took signatures")
	}
	if f.g.Primary() == a {
		t.Error("the standby is still primary")
	}
	if err := f.g.SetStandby(a, false); err != nil {
		t.Fatal(err)
	}
	if st := memberState(f.g, a); st != member.Active || f.g.Primary() != a {
		t.Fatalf("member back from standby is %v, primary %s", st, f.g.Primary())
	}
	if f.events.count(MemberDemoted, a) != 1 || f.events.count(MemberPromoted, a) != 1 {
		t.Errorf("want one demotion and one promotion event for %s", a)
	}
	if err := f.g.SetOrder([]string{nc.Name, toks[1].Name, a}); err != nil {
		t.Fatal(err)
	}
	if f.g.Primary() != nc.Name {
		t.Errorf("primary after reordering is %s", f.g.Primary())
	}
	for _, name := range []string{toks[1].Name, nc.Name} {
		if err := f.g.RemoveMember(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.g.RemoveMember(ctx, a); err == nil {
		t.Error("removing the last member succeeded")
	}
	if err := sign(t, signer); err != nil {
		t.Errorf("signing on the last member: %v", err)
	}
}
