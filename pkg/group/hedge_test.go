package group

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/dispatch"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
)

// warmUp signs enough to give the members a p95 and the group a hedge in
// its budget (hedgeCost/hedgeEarn hedgeable calls).
func warmUp(t *testing.T, signer *ecKey) {
	t.Helper()
	for i := range hedgeCost / hedgeEarn * 2 {
		d := sha256.Sum256(fmt.Appendf(nil, "warm-up %d", i))
		if _, err := signer.sign(testContext(t), d[:]); err != nil {
			t.Fatalf("warm-up signature %d: %v", i, err)
		}
	}
}

// A member that does not answer a signature in the group's p95 gets it
// hedged: the other member answers, the caller has a valid signature
// before the slow member answers at all, and the slow member's late answer
// is discarded, the member staying fit for the next calls. Under handoff
// the hedge overtakes the first attempt, whose session is abandoned and
// closed once the module answers; inline, the first attempt runs to its
// end on a goroutine of its own.
func TestHedgedSignAnswersFromTheFastMember(t *testing.T) {
	for _, d := range dispatch.All {
		t.Run(string(d), func(t *testing.T) { testHedgedSign(t, d) })
	}
}

func testHedgedSign(t *testing.T, d dispatch.Dispatch) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{n: 2, policy: config.PolicyPrimaryBackup, interceptor: faults, dispatch: string(d)})
	signer := ecSigner(t, f.g, "hedged")
	warmUp(t, signer)
	slow, fast := f.toks[0].Name, f.toks[1].Name
	// A warm-up call slower than the p95 may have been hedged and spent the
	// budget: give the request below its hedge (and the reserve a member
	// not yet known slow leaves, hedgeFloor).
	f.g.hedgeBudget.Store(2 * hedgeCost)
	hedgesBefore, fastBefore := f.g.Hedges(), faults.Calls(fast, slot.OpSign)
	slowM, _ := f.g.Member(slow)
	slowBefore := slowM.Snapshot().Hedges
	abandonedBefore := slowM.Slot().Stats().QuarantinedTotal
	faults.Hang(slow, slot.OpSign) // the primary: every signature goes to it first

	digest := sha256.Sum256([]byte("hedged signature"))
	sig, err := signer.sign(testContext(t), digest[:])
	if err != nil {
		t.Fatalf("sign with the primary not answering: %v", err)
	}
	if !verifyRaw(signer.pub, digest[:], sig) {
		t.Fatal("the hedged signature does not verify")
	}
	if n := f.g.Hedges() - hedgesBefore; n != 1 {
		t.Errorf("%d hedges, want 1", n)
	}
	if n := slowM.Snapshot().Hedges - slowBefore; n != 1 {
		t.Errorf("the slow member counts %d hedges, want 1", n)
	}
	if n := faults.Calls(fast, slot.OpSign) - fastBefore; n != 1 {
		t.Errorf("the fast member took %d signatures, want the 1 hedge", n)
	}
	if n := faults.Hung(slow); n != 1 {
		t.Errorf("%d signatures hung on the slow member, want the 1 the hedge overtook", n)
	}

	// The slow member answers late: discarded, and its session is clean
	// (a session left with an active operation would refuse the next
	// SignInit with CKR_OPERATION_ACTIVE).
	faults.Release(slow)
	waitIdle(t, f.g, slow)
	wantAbandoned := map[dispatch.Dispatch]uint64{dispatch.Handoff: 1, dispatch.Inline: 0}[d]
	if n := slowM.Slot().Stats().QuarantinedTotal - abandonedBefore; n != wantAbandoned {
		t.Errorf("%d calls abandoned on the slow member, want %d", n, wantAbandoned)
	}
	if st := memberState(f.g, slow); st != member.Active {
		t.Fatalf("the slow member is %v after its late answer, want active", st)
	}
	for i := range 20 {
		d := sha256.Sum256(fmt.Appendf(nil, "after %d", i))
		sig, err := signer.sign(testContext(t), d[:])
		if err != nil || !verifyRaw(signer.pub, d[:], sig) {
			t.Fatalf("signature %d after the late answer: %v (verifies: %v)", i, err, err == nil && verifyRaw(signer.pub, d[:], sig))
		}
	}
}

// A member that hangs is failed at command_timeout even when every call
// it was sent was hedged and answered by another member: the overtaken
// call is charged with a timeout once it outlives its deadline, as a call
// the caller waited for would have been.
func TestHedgedHungMemberIsFailedAtTheDeadline(t *testing.T) {
	const timeout = 1500 * time.Millisecond
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{n: 2, policy: config.PolicyPrimaryBackup, interceptor: faults, timeout: timeout})
	signer := ecSigner(t, f.g, "hedged-hung")
	warmUp(t, signer)
	slow := f.toks[0].Name
	f.g.hedgeBudget.Store(2 * hedgeCost)
	t.Cleanup(func() { faults.Heal(slow) })
	faults.Hang(slow, slot.OpSign)

	start := time.Now()
	digest := sha256.Sum256([]byte("hedged, then hung"))
	sig, err := signer.sign(testContext(t), digest[:])
	if err != nil || !verifyRaw(signer.pub, digest[:], sig) {
		t.Fatalf("the hedged signature: %v", err)
	}
	if n := f.g.Hedges(); n == 0 {
		t.Fatal("the signature was not hedged")
	}
	if st := memberState(f.g, slow); st == member.Failed {
		t.Fatalf("the hung member failed before its call's deadline (%v after the call)", time.Since(start))
	}
	// The member's state turns failed before its MemberFailed event is
	// sent: wait for the event, which says why.
	timedOut := func() bool {
		for _, e := range f.events.all() {
			if e.Kind == MemberFailed && e.Member == slow && errors.Is(e.Err, slot.ErrTimeout) {
				return true
			}
		}
		return false
	}
	ctx := testContext(t)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !timedOut() {
		select {
		case <-ctx.Done():
			t.Fatalf("no MemberFailed event for %s caused by a timeout %v after its hedged call (it is %v), want one at command_timeout %v",
				slow, time.Since(start), memberState(f.g, slow), timeout)
		case <-tick.C:
		}
	}
	if d := time.Since(start); d < timeout {
		t.Errorf("the hung member failed %v after its call, before command_timeout %v", d, timeout)
	}
	if st := memberState(f.g, slow); st != member.Failed {
		t.Errorf("the hung member is %v after its timeout, want failed", st)
	}
}

// A first attempt late in its look-up (the key's handle not known on its
// member yet) is hedged and overtaken as a late call is.
func TestHedgeOvertakesALateLookUp(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{n: 2, policy: config.PolicyPrimaryBackup, interceptor: faults})
	signer := ecSigner(t, f.g, "late-look-up")
	warmUp(t, signer)
	slow := f.toks[0].Name
	f.g.hedgeBudget.Store(2 * hedgeCost)
	slowM, _ := f.g.Member(slow)
	o, ok := f.g.objs.Get(signer.h)
	if !ok {
		t.Fatal("the signing key is not in the group's table")
	}
	o.Forget(slowM.Index())
	faults.Hang(slow, slot.OpFindObjects)

	digest := sha256.Sum256([]byte("late look-up"))
	sig, err := signer.sign(testContext(t), digest[:])
	if err != nil || !verifyRaw(signer.pub, digest[:], sig) {
		t.Fatalf("sign with the primary's look-up hung: %v (verifies: %v)", err, err == nil && verifyRaw(signer.pub, digest[:], sig))
	}
	if n := faults.Hung(slow); n != 1 {
		t.Errorf("%d look-ups hung on the slow member, want the 1 the hedge overtook", n)
	}
	faults.Release(slow)
	waitIdle(t, f.g, slow)
	if st := memberState(f.g, slow); st != member.Active {
		t.Fatalf("the slow member is %v after its late look-up, want active", st)
	}
}

// A hedge that fails overtakes nothing: the late member's answer, once it
// comes, is the caller's, and its call is not abandoned.
func TestFailedHedgeTakesTheLateAnswer(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{n: 2, policy: config.PolicyPrimaryBackup, interceptor: faults})
	signer := ecSigner(t, f.g, "hedge-fails")
	warmUp(t, signer)
	slow, fast := f.toks[0].Name, f.toks[1].Name
	f.g.hedgeBudget.Store(2 * hedgeCost)
	slowM, _ := f.g.Member(slow)
	abandonedBefore := slowM.Slot().Stats().QuarantinedTotal
	fastBefore := faults.Calls(fast, slot.OpSign)
	faults.Hang(slow, slot.OpSign)
	faults.FailN(fast, slot.OpSign, pkcs11.Error(pkcs11.CKR_DEVICE_ERROR), 1)

	digest := sha256.Sum256([]byte("late answer"))
	type answer struct {
		sig []byte
		err error
	}
	done := make(chan answer, 1)
	go func() {
		sig, err := signer.sign(testContext(t), digest[:])
		done <- answer{sig, err}
	}()
	if err := faults.WaitCalls(testContext(t), fast, slot.OpSign, fastBefore+1); err != nil {
		t.Fatalf("the request was never hedged to the other member: %v", err)
	}
	select {
	case a := <-done:
		t.Fatalf("the signature returned (%v) before the late member answered, after a failed hedge", a.err)
	default:
	}
	faults.Release(slow)
	a := <-done
	if a.err != nil || !verifyRaw(signer.pub, digest[:], a.sig) {
		t.Fatalf("the late member's signature: %v (verifies: %v)", a.err, a.err == nil && verifyRaw(signer.pub, digest[:], a.sig))
	}
	if n := slowM.Slot().Stats().QuarantinedTotal - abandonedBefore; n != 0 {
		t.Errorf("%d calls abandoned on the late member, want none", n)
	}
}

// With hedge = false a slow member's signature waits for it.
func TestHedgeOff(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{n: 2, policy: config.PolicyPrimaryBackup, interceptor: faults, noHedge: true})
	signer := ecSigner(t, f.g, "unhedged")
	warmUp(t, signer)
	slow, fast := f.toks[0].Name, f.toks[1].Name
	fastBefore := faults.Calls(fast, slot.OpSign)
	faults.Hang(slow, slot.OpSign)
	done := make(chan error, 1)
	go func() {
		d := sha256.Sum256([]byte("unhedged"))
		_, err := signer.sign(testContext(t), d[:])
		done <- err
	}()
	if err := faults.WaitHung(testContext(t), slow, 1); err != nil {
		t.Fatalf("the signature never reached the slow member: %v", err)
	}
	faults.Release(slow)
	if err := <-done; err != nil {
		t.Fatalf("sign: %v", err)
	}
	if n := f.g.Hedges(); n != 0 {
		t.Errorf("Hedges() = %d with hedge = false", n)
	}
	if n := faults.Calls(fast, slot.OpSign) - fastBefore; n != 0 {
		t.Errorf("the other member took %d signatures with hedge = false", n)
	}
}

// A healthy member's late call is hedged only to an idle member, where the
// copy starts at once; a member known slow is hedged away from however
// busy the other is.
func TestHedgeGoesWhereItCanAnswerFirst(t *testing.T) {
	const delay = time.Millisecond // the group's healthy p95
	late, other := bareMember(t, "late", 0), bareMember(t, "other", 1)
	late.Begin() // the late call
	if !hedgeWorth(late, other, delay) {
		t.Error("a healthy member's late call was not hedged to an idle member")
	}
	other.Begin()
	if hedgeWorth(late, other, delay) {
		t.Error("a healthy member's late call was hedged to a busy member")
	}
	other.Begin()
	for range 20 { // late's own p95 becomes 5 ms: known slow
		late.End(late.Begin().Add(-5*delay), nil)
	}
	if !hedgeWorth(late, other, delay) {
		t.Error("a slow member's late call was not hedged to a busier member")
	}
}

// Hedges stay within 5 % of the hedgeable calls, plus the burst saved up;
// a healthy member's hedges leave one in reserve for a slow member's.
func TestHedgeBudget(t *testing.T) {
	var r Group
	r.hedgeBudget.Store(hedgeCost)
	if r.spendHedge(nil, hedgeCost) {
		t.Error("a healthy member's hedge spent the reserve")
	}
	if !r.spendHedge(nil, 0) {
		t.Error("a slow member's hedge found no budget in the reserve")
	}

	var g Group
	const calls = 10000
	spent := 0
	for range calls {
		g.earnHedge()
		if g.spendHedge(nil, 0) {
			spent++
		}
	}
	if limit := calls*hedgeEarn/hedgeCost + hedgeBurst/hedgeCost; spent > limit || spent < calls*hedgeEarn/hedgeCost-1 {
		t.Errorf("%d hedges in %d calls, want about 5%% (at most %d)", spent, calls, limit)
	}
	if g.Hedges() != uint64(spent) {
		t.Errorf("Hedges() = %d, %d spent", g.Hedges(), spent)
	}
}

// waitIdle waits until no call is in flight on member name.
func waitIdle(t *testing.T, g *Group, name string) {
	t.Helper()
	m, ok := g.Member(name)
	if !ok {
		t.Fatalf("no member %s", name)
	}
	ctx := testContext(t)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for m.InFlight() != 0 {
		select {
		case <-ctx.Done():
			t.Fatalf("member %s still has %d calls in flight", name, m.InFlight())
		case <-tick.C:
		}
	}
}
