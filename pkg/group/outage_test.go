package group

import (
	"strings"
	"testing"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
)

// outage fails every member of f (their tokens answer CKR_DEVICE_ERROR)
// and checks that a signature gets CKR_DEVICE_ERROR: from SignInit when
// it is sent to the members, as a dead token answers, or from Sign when
// the same Init was accepted before (initproof.go) and only Sign reaches
// them.
func outage(t *testing.T, f *fixture, faults *slottest.Faults, s *Session, key ObjectHandle) {
	t.Helper()
	for _, tok := range f.toks {
		faults.FailAll(tok.Name, errDevice)
	}
	ctx := testContext(t)
	err := s.SignInit(ctx, pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil), key)
	what := "SignInit"
	if err == nil {
		_, err = s.Sign(ctx, make([]byte, 32))
		what = "Sign"
	}
	if CodeOf(err) != pkcs11.CKR_DEVICE_ERROR {
		t.Fatalf("%s with every member down: %v (0x%x), want CKR_DEVICE_ERROR", what, err, CodeOf(err))
	}
	if st := f.g.Status(); !st.down() {
		t.Fatalf("status after the outage: %+v", st)
	}
	if f.events.count(GroupDown, "") != 1 {
		t.Fatalf("want one GroupDown event")
	}
}

func sessionSign(t *testing.T, s *Session, key ObjectHandle) error {
	t.Helper()
	ctx := testContext(t)
	if err := s.SignInit(ctx, pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil), key); err != nil {
		return err
	}
	_, err := s.Sign(ctx, make([]byte, 32))
	return err
}

// activeEnhanced: every member fails, one comes back, and the same
// virtual session handle signs again without a new login.
func TestActiveEnhancedRestoresSessions(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{interceptor: faults, mode: config.RecoveryActiveEnhanced})
	s := openSession(t, f.g)
	_, priv := genEC(t, s, "enhanced")
	if err := sessionSign(t, s, priv); err != nil {
		t.Fatal(err)
	}
	outage(t, f, faults, s, priv)
	if ut, ok := f.g.LoggedIn(); !ok || ut != pkcs11.CKU_USER {
		t.Fatal("activeEnhanced lost the login in the outage")
	}
	back := f.toks[1].Name
	faults.Heal(back)
	if err := f.g.ActivateMember(testContext(t), back); err != nil {
		t.Fatalf("ActivateMember: %v", err)
	}
	if got, err := f.g.Session(s.Handle()); err != nil || got != s {
		t.Fatalf("session %d after the outage: %v", s.Handle(), err)
	}
	if err := sessionSign(t, s, priv); err != nil {
		t.Fatalf("the same session after one member came back: %v", err)
	}
	if st := s.State(); st != pkcs11.CKS_RW_USER_FUNCTIONS {
		t.Errorf("session state 0x%x, want CKS_RW_USER_FUNCTIONS", st)
	}
}

// activeBasic: every member fails; the old session answers
// CKR_SESSION_HANDLE_INVALID and the login is gone; once a member is back
// a fresh session, after a new login, signs.
func TestActiveBasicLosesSessions(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{interceptor: faults, mode: config.RecoveryActiveBasic})
	s := openSession(t, f.g)
	_, priv := genEC(t, s, "basic")
	outage(t, f, faults, s, priv)
	back := f.toks[2].Name
	faults.Heal(back)
	if err := f.g.ActivateMember(testContext(t), back); err != nil {
		t.Fatalf("ActivateMember: %v", err)
	}
	if err := s.Check(); CodeOf(err) != pkcs11.CKR_SESSION_HANDLE_INVALID {
		t.Errorf("Check of the lost session: %v", err)
	}
	err := sessionSign(t, s, priv)
	if CodeOf(err) != pkcs11.CKR_SESSION_HANDLE_INVALID {
		t.Fatalf("old session after the outage: %v (0x%x), want CKR_SESSION_HANDLE_INVALID", err, CodeOf(err))
	}
	if _, ok := f.g.LoggedIn(); ok {
		t.Fatal("activeBasic kept the login through the outage")
	}
	if err := s.Close(); err != nil {
		t.Errorf("closing the lost session: %v", err)
	}
	m, _ := f.g.Member(back)
	if m.Slot().LoggedIn() {
		t.Error("the recovered member is logged in although the group is not")
	}
	fresh := openSession(t, f.g)
	if err := f.g.Login(testContext(t), pkcs11.CKU_USER, pinOf(f.toks[0].UserPIN)); err != nil {
		t.Fatalf("Login after the outage: %v", err)
	}
	if err := sessionSign(t, fresh, priv); err != nil {
		t.Fatalf("fresh session after the outage: %v", err)
	}
	for _, e := range f.events.all() {
		if e.Kind == GroupDown && (e.Err == nil || !strings.Contains(e.Err.Error(), "activeBasic")) {
			t.Errorf("GroupDown event does not say what activeBasic does: %v", e.Err)
		}
	}
}

// Standbys through a full outage: the standby is promoted when both
// actives fail, the group goes down when it fails too; the standby comes
// back first (active: nobody else serves) and is demoted when an active
// member returns.
func TestStandbyThroughFullOutage(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{interceptor: faults, standby: []int{2}, mode: config.RecoveryActiveEnhanced})
	ctx := testContext(t)
	a, b, sb := f.toks[0].Name, f.toks[1].Name, f.toks[2].Name
	signer := ecSigner(t, f.g, "standby-outage")
	faults.FailAll(a, errDevice)
	faults.FailAll(b, errDevice)
	for range 20 {
		if err := sign(t, signer); err != nil {
			t.Fatalf("signing with the standby promoted: %v", err)
		}
	}
	if st := memberState(f.g, sb); st != member.Active {
		t.Fatalf("standby is %v with both actives down", st)
	}
	faults.FailAll(sb, errDevice)
	if err := sign(t, signer); CodeOf(err) != pkcs11.CKR_DEVICE_ERROR {
		t.Fatalf("sign with every member down: %v", err)
	}
	if f.events.count(GroupDown, "") != 1 {
		t.Fatal("no GroupDown event")
	}
	faults.Heal(sb)
	if err := f.g.ActivateMember(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if st := memberState(f.g, sb); st != member.Active {
		t.Fatalf("the standby back first is %v, want active (nobody else serves)", st)
	}
	before := faults.Calls(sb, slot.OpSign)
	if err := sign(t, signer); err != nil {
		t.Fatalf("signing on the standby alone: %v", err)
	}
	if faults.Calls(sb, slot.OpSign) == before {
		t.Fatal("the standby did not sign")
	}
	faults.Heal(a)
	if err := f.g.ActivateMember(ctx, a); err != nil {
		t.Fatal(err)
	}
	if st := memberState(f.g, sb); st != member.Standby {
		t.Fatalf("standby is %v after an active member returned, want standby", st)
	}
	before = faults.Calls(sb, slot.OpSign)
	for range 20 {
		if err := sign(t, signer); err != nil {
			t.Fatal(err)
		}
	}
	if faults.Calls(sb, slot.OpSign) != before {
		t.Error("the demoted standby took signatures")
	}
	if f.events.count(MemberPromoted, sb) != 1 || f.events.count(MemberDemoted, sb) != 1 {
		t.Errorf("promotions %d, demotions %d of the standby; want 1 and 1",
			f.events.count(MemberPromoted, sb), f.events.count(MemberDemoted, sb))
	}
}

// down reports whether no member can take work.
func (s Summary) down() bool { return s.Active == 0 && s.Standby == 0 }
