package sync_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/hagroup/hagroup/pkg/sync"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/hagroup/hagroup/pkg/sync/tombstone"
	"github.com/miekg/pkcs11"
)

// Plan and Apply on real SoftHSM tokens. The tests use their own helpers
// (prefixed plan) and the package's TestMain token pool.

const planSerial = "7000001"

var planP256 = []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}

func planCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// planMembers opens n fresh tokens logged in as the user, with the
// group's (untrusted) domain key installed.
func planMembers(t *testing.T, n int, ic slot.Interceptor) []sync.PlanMember {
	t.Helper()
	ms, _ := planMembersToks(t, n, ic)
	return ms
}

// planMembersToks is planMembers that also returns the tokens.
func planMembersToks(t *testing.T, n int, ic slot.Interceptor) ([]sync.PlanMember, []testhsm.Token) {
	t.Helper()
	toks := testhsm.Take(t, n)
	ms := make([]sync.PlanMember, n)
	var dts []domainkey.Target
	for i, tok := range toks {
		s, err := slot.Open(planCtx(t), slot.Spec{
			Name: fmt.Sprintf("m%d", i), Module: tok.Module, ModuleEnv: tok.ModuleEnv, TokenLabel: tok.Label,
			PIN: secret.PINFromString(tok.UserPIN), CommandTimeout: 10 * time.Second, Interceptor: ic,
		})
		if err != nil {
			t.Fatalf("open %s: %v", tok.Label, err)
		}
		t.Cleanup(func() { s.Close() })
		ms[i] = sync.PlanMember{Name: s.Name(), Slot: s}
		dts = append(dts, domainkey.Target{Slot: s})
	}
	if err := domainkey.Install(planCtx(t), dts, planSerial); err != nil {
		t.Fatalf("install domain key: %v", err)
	}
	return ms, toks
}

func planID(t *testing.T) []byte {
	id := make([]byte, 8)
	if _, err := rand.Read(id); err != nil {
		t.Fatal(err)
	}
	return id
}

func planA(typ uint, v any) *pkcs11.Attribute { return pkcs11.NewAttribute(typ, v) }

func planGenEC(t *testing.T, s *slot.Slot, label string, id []byte) {
	t.Helper()
	_, _, err := s.GenerateKeyPair(planCtx(t), pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{planA(pkcs11.CKA_EC_PARAMS, planP256), planA(pkcs11.CKA_TOKEN, true),
			planA(pkcs11.CKA_VERIFY, true), planA(pkcs11.CKA_LABEL, label), planA(pkcs11.CKA_ID, id)},
		[]*pkcs11.Attribute{planA(pkcs11.CKA_TOKEN, true), planA(pkcs11.CKA_PRIVATE, true),
			planA(pkcs11.CKA_SIGN, true), planA(pkcs11.CKA_SENSITIVE, true), planA(pkcs11.CKA_EXTRACTABLE, true),
			planA(pkcs11.CKA_LABEL, label), planA(pkcs11.CKA_ID, id)})
	if err != nil {
		t.Fatalf("generate EC pair %s on %s: %v", label, s.Name(), err)
	}
}

func planGenAES(t *testing.T, s *slot.Slot, label string, id []byte) {
	t.Helper()
	_, err := s.GenerateKey(planCtx(t), pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil),
		[]*pkcs11.Attribute{planA(pkcs11.CKA_VALUE_LEN, 32), planA(pkcs11.CKA_TOKEN, true),
			planA(pkcs11.CKA_PRIVATE, true), planA(pkcs11.CKA_SENSITIVE, true), planA(pkcs11.CKA_EXTRACTABLE, true),
			planA(pkcs11.CKA_ENCRYPT, true), planA(pkcs11.CKA_DECRYPT, true),
			planA(pkcs11.CKA_LABEL, label), planA(pkcs11.CKA_ID, id)})
	if err != nil {
		t.Fatalf("generate AES key %s on %s: %v", label, s.Name(), err)
	}
}

func planData(t *testing.T, s *slot.Slot, label, value string) {
	t.Helper()
	_, err := s.CreateObject(planCtx(t), []*pkcs11.Attribute{
		planA(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), planA(pkcs11.CKA_TOKEN, true), planA(pkcs11.CKA_PRIVATE, false),
		planA(pkcs11.CKA_LABEL, label), planA(pkcs11.CKA_VALUE, []byte(value)),
	})
	if err != nil {
		t.Fatalf("create data object %s on %s: %v", label, s.Name(), err)
	}
}

// planObjects lists s: identity+fingerprint -> count.
func planObjects(t *testing.T, s *slot.Slot) map[string]int {
	t.Helper()
	objs, err := sync.List(planCtx(t), s)
	if err != nil {
		t.Fatalf("list %s: %v", s.Name(), err)
	}
	out := map[string]int{}
	for _, o := range objs {
		out[o.Identity.String()+" fp="+object.FormatFingerprint(o.Fingerprint)]++
	}
	return out
}

func planDump(m map[string]int) string {
	var ks []string
	for k, n := range m {
		ks = append(ks, fmt.Sprintf("%s ×%d", k, n))
	}
	sort.Strings(ks)
	return strings.Join(ks, "\n  ")
}

// planAllEqual checks every member holds the same objects, each once.
func planAllEqual(t *testing.T, ms []sync.PlanMember) map[string]int {
	t.Helper()
	first := planObjects(t, ms[0].Slot)
	for k, n := range first {
		if n != 1 {
			t.Errorf("%s holds %s %d times", ms[0].Name, k, n)
		}
	}
	for _, m := range ms[1:] {
		got := planObjects(t, m.Slot)
		if planDump(got) != planDump(first) {
			t.Fatalf("%s and %s differ:\n%s:\n  %s\n%s:\n  %s", ms[0].Name, m.Name, ms[0].Name, planDump(first), m.Name, planDump(got))
		}
	}
	return first
}

// planFind returns the objects labelled label on s with their
// fingerprints.
func planFind(t *testing.T, s *slot.Slot, label string) []object.Object {
	t.Helper()
	hs, err := s.FindObjects(planCtx(t), []*pkcs11.Attribute{planA(pkcs11.CKA_LABEL, label)})
	if err != nil {
		t.Fatal(err)
	}
	var out []object.Object
	for _, h := range hs {
		o, err := object.ReadObject(planCtx(t), s, h)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, o)
	}
	return out
}

func planDestroyLabel(t *testing.T, s *slot.Slot, label string) []tombstone.Tombstone {
	t.Helper()
	var ts []tombstone.Tombstone
	for _, o := range planFind(t, s, label) {
		ts = append(ts, tombstone.Tombstone{Identity: o.Identity, Fingerprint: o.Fingerprint, Time: time.Now(), GroupSerial: planSerial})
		if err := s.DestroyObject(planCtx(t), o.Handle); err != nil {
			t.Fatal(err)
		}
	}
	return ts
}

func planApply(t *testing.T, p *sync.Plan) *sync.ApplyResult {
	t.Helper()
	res, err := (&sync.Replicator{GroupSerial: planSerial}).Apply(planCtx(t), p)
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	return res
}

func planMake(t *testing.T, ms []sync.PlanMember, tombs sync.Tombstones, opts sync.PlanOptions) *sync.Plan {
	t.Helper()
	p, err := sync.MakePlan(planCtx(t), ms, tombs, opts)
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	return p
}

func actionStrings(as []sync.Action) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = fmt.Sprintf("%s %s %s %s<-%s", a.Kind, object.ClassName(a.Identity.Class), a.Identity.Label, a.Member, a.Source)
	}
	return out
}

func TestPlanCopiesMissingObjects(t *testing.T) {
	ms := planMembers(t, 3, nil)
	planGenEC(t, ms[0].Slot, "k1", planID(t))
	planGenAES(t, ms[0].Slot, "s1", planID(t))
	planData(t, ms[1].Slot, "d1", "only on m1")

	p := planMake(t, ms, nil, sync.PlanOptions{})
	if len(p.Conflicts) != 0 || p.Objects != 4 {
		t.Fatalf("conflicts %v, objects %d (want 0, 4)", p.Conflicts, p.Objects)
	}
	got := actionStrings(p.Actions)
	want := []string{
		// public halves first: a private EC key's fingerprint on SoftHSM
		// comes from its public half
		"copy public key k1 m1<-m0", "copy public key k1 m2<-m0",
		"copy data d1 m0<-m1", "copy data d1 m2<-m1",
		"copy private key k1 m1<-m0", "copy private key k1 m2<-m0",
		"copy secret key s1 m1<-m0", "copy secret key s1 m2<-m0",
	}
	if strings.Join(sortedAfterPublic(got), "\n") != strings.Join(sortedAfterPublic(want), "\n") {
		t.Fatalf("actions:\n%s\nwant (in any order after the public keys):\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for i, a := range p.Actions {
		if a.Identity.Class == pkcs11.CKO_PUBLIC_KEY && i >= 2 {
			t.Fatalf("public key copy at position %d, after other copies:\n%s", i, strings.Join(got, "\n"))
		}
	}
	if n := p.OutOfSync("m2"); n != 4 {
		t.Fatalf("m2 out of sync by %d objects, want 4", n)
	}

	res := planApply(t, p)
	if len(res.Done) != 8 || len(res.Failed) != 0 {
		t.Fatalf("apply: %d done, %d failed", len(res.Done), len(res.Failed))
	}
	inv := planAllEqual(t, ms)
	if len(inv) != 4 {
		t.Fatalf("members hold %d objects, want 4:\n  %s", len(inv), planDump(inv))
	}
	// The same plan again changes nothing.
	res = planApply(t, p)
	if len(res.Done) != 8 {
		t.Fatalf("second apply: %d done", len(res.Done))
	}
	if again := planAllEqual(t, ms); planDump(again) != planDump(inv) {
		t.Fatalf("second apply changed the members:\n  %s", planDump(again))
	}
	if p2 := planMake(t, ms, nil, sync.PlanOptions{}); !p2.Empty() {
		t.Fatalf("plan after apply: %v %v", actionStrings(p2.Actions), p2.Conflicts)
	}
	// Every copy of the private key signs; the replicator proved it, and
	// the fingerprints (compared above) say it is the same key.
}

// planPhases sorts action strings within each run of one kind and class
// group (deletes of private and secret keys, deletes of public keys, copies
// of public keys, other copies), keeping the runs in order: what MakePlan
// promises about order.
func planPhases(s []string) []string {
	phase := func(a string) int {
		pub := strings.Contains(a, "public key")
		switch {
		case strings.HasPrefix(a, "delete") && !pub:
			return 0
		case strings.HasPrefix(a, "delete"):
			return 1
		case pub:
			return 2
		}
		return 3
	}
	out := append([]string(nil), s...)
	sort.SliceStable(out, func(i, j int) bool {
		if pi, pj := phase(out[i]), phase(out[j]); pi != pj {
			return pi < pj
		}
		return out[i] < out[j]
	})
	for i := 1; i < len(s); i++ {
		if phase(s[i]) < phase(s[i-1]) {
			return append([]string{"out of phase order:"}, s...)
		}
	}
	return out
}

// sortedAfterPublic sorts action strings for comparison.
func sortedAfterPublic(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}

// A member that was down while objects were destroyed through the group
// gets them destroyed; what was made meanwhile is copied to it; what only
// it holds, with no tombstone, goes to the others. A tombstoned version
// is deleted even where every member holds it (copies the destroy did
// not reach, not the object made again); one whose tombstone was revoked
// (made again through the group) stays.
func TestPlanHonoursTombstones(t *testing.T) {
	ms := planMembers(t, 3, nil)
	a, b, c := ms[0].Slot, ms[1].Slot, ms[2].Slot
	planGenEC(t, a, "gone", planID(t))
	planGenAES(t, a, "gone-s", planID(t))
	planGenEC(t, a, "keep", planID(t))
	planGenEC(t, a, "stale", planID(t))
	planApply(t, planMake(t, ms, nil, sync.PlanOptions{}))
	planAllEqual(t, ms)

	// b is away: on a and c, "gone" and "gone-s" are destroyed and a key
	// is made; b gets a data object of its own.
	var tombs []tombstone.Tombstone
	for _, label := range []string{"gone", "gone-s"} {
		tombs = append(tombs, planDestroyLabel(t, a, label)...)
		planDestroyLabel(t, c, label)
	}
	// "stale" was destroyed through the group, but every member still
	// holds it (copies a catch-up made while the destroy was under way,
	// or a second copy the destroy did not see): its tombstone removes it
	// everywhere. "keep" was destroyed and made again through the group,
	// which revoked its tombstone: it stays.
	for _, o := range planFind(t, a, "stale") {
		tombs = append(tombs, tombstone.Tombstone{Identity: o.Identity, Fingerprint: o.Fingerprint, Time: time.Now(), GroupSerial: planSerial})
	}
	for _, o := range planFind(t, a, "keep") {
		dead := tombstone.Tombstone{Identity: o.Identity, Fingerprint: o.Fingerprint, Time: time.Now(), GroupSerial: planSerial}
		tombs = append(tombs, dead, dead.Revocation())
	}
	newID := planID(t)
	planGenEC(t, a, "new", newID)
	planApply(t, planMake(t, []sync.PlanMember{ms[0], ms[2]}, nil, sync.PlanOptions{}))
	planData(t, b, "b-only", "made on b while it was cut off")

	p := planMake(t, ms, tombstone.NewSet(tombs...), sync.PlanOptions{})
	got := actionStrings(p.Actions)
	want := []string{
		"delete private key gone m1<-",
		"delete private key stale m0<-", "delete private key stale m1<-", "delete private key stale m2<-",
		"delete secret key gone-s m1<-", "delete public key gone m1<-",
		"delete public key stale m0<-", "delete public key stale m1<-", "delete public key stale m2<-",
		"copy public key new m1<-m0", "copy data b-only m0<-m1", "copy data b-only m2<-m1", "copy private key new m1<-m0",
	}
	// The order among identities of one phase follows their random IDs:
	// compare the phases, each sorted.
	if strings.Join(planPhases(got), "\n") != strings.Join(planPhases(want), "\n") {
		t.Fatalf("actions:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, act := range p.Actions {
		if act.Kind == sync.Delete && act.Reason != sync.ReasonTombstone {
			t.Fatalf("%v: reason %s", act, act.Reason)
		}
	}
	planApply(t, p)
	inv := planAllEqual(t, ms)
	for k := range inv {
		if strings.Contains(k, `"gone`) || strings.Contains(k, `"stale`) {
			t.Fatalf("destroyed object back: %s", k)
		}
	}
	if len(planFind(t, b, "new")) != 2 || len(planFind(t, a, "b-only")) != 1 || len(planFind(t, b, "keep")) != 2 {
		t.Fatalf("after apply:\n  %s", planDump(inv))
	}
	if p2 := planMake(t, ms, tombstone.NewSet(tombs...), sync.PlanOptions{}); !p2.Empty() {
		t.Fatalf("plan after apply: %v", actionStrings(p2.Actions))
	}
}

// The same identity with different key material on two members is a
// conflict, reported with both fingerprints, and nothing touches it, not
// even on a third member that lacks it.
func TestPlanReportsConflicts(t *testing.T) {
	ms := planMembers(t, 3, nil)
	id := planID(t)
	planGenEC(t, ms[0].Slot, "dup", id)
	planGenEC(t, ms[1].Slot, "dup", id)
	planData(t, ms[0].Slot, "fine", "x")

	p := planMake(t, ms, nil, sync.PlanOptions{})
	if len(p.Conflicts) != 2 {
		t.Fatalf("%d conflicts, want 2 (public and private half): %v", len(p.Conflicts), p.Conflicts)
	}
	fpA := map[uint][]byte{}
	for _, o := range planFind(t, ms[0].Slot, "dup") {
		fpA[o.Identity.Class] = o.Fingerprint
	}
	fpB := map[uint][]byte{}
	for _, o := range planFind(t, ms[1].Slot, "dup") {
		fpB[o.Identity.Class] = o.Fingerprint
	}
	for _, c := range p.Conflicts {
		if len(c.Versions) != 2 {
			t.Fatalf("conflict %v: %d versions", c, len(c.Versions))
		}
		v0, v1 := c.Versions[0], c.Versions[1]
		if !bytes.Equal(v0.Fingerprint, fpA[c.Identity.Class]) || !bytes.Equal(v1.Fingerprint, fpB[c.Identity.Class]) ||
			strings.Join(v0.Members, ",") != "m0" || strings.Join(v1.Members, ",") != "m1" {
			t.Fatalf("conflict %v: want %x on m0 and %x on m1", c, fpA[c.Identity.Class], fpB[c.Identity.Class])
		}
		msg := c.String()
		if !strings.Contains(msg, object.FormatFingerprint(v0.Fingerprint)) || !strings.Contains(msg, object.FormatFingerprint(v1.Fingerprint)) {
			t.Fatalf("conflict message lacks a fingerprint: %s", msg)
		}
		if !c.Involves("m0") || !c.Involves("m1") || c.Involves("m2") {
			t.Fatalf("Involves wrong for %v", c)
		}
	}
	for _, a := range p.Actions {
		if a.Identity.Label == "dup" {
			t.Fatalf("action on a conflicting identity: %v", a)
		}
	}
	if len(p.ConflictsOf("m2")) != 0 || len(p.ConflictsOf("m1")) != 2 {
		t.Fatal("ConflictsOf wrong")
	}
	planApply(t, p)
	if n := len(planFind(t, ms[2].Slot, "dup")); n != 0 {
		t.Fatalf("a conflicting key was copied to m2 (%d objects)", n)
	}
	if n := len(planFind(t, ms[2].Slot, "fine")); n != 1 {
		t.Fatalf("the unrelated object was not copied (%d)", n)
	}
}

func TestPlanPrune(t *testing.T) {
	ms := planMembers(t, 2, nil)
	planData(t, ms[0].Slot, "stray", "x")
	planData(t, ms[0].Slot, "both", "y")
	planData(t, ms[1].Slot, "both", "y")

	if p := planMake(t, ms, nil, sync.PlanOptions{}); strings.Join(actionStrings(p.Actions), ";") != "copy data stray m1<-m0" {
		t.Fatalf("without prune: %v", actionStrings(p.Actions))
	}
	p := planMake(t, ms, nil, sync.PlanOptions{Prune: true})
	if strings.Join(actionStrings(p.Actions), ";") != "delete data stray m0<-" || p.Actions[0].Reason != sync.ReasonPrune {
		t.Fatalf("with prune: %v", p.Actions)
	}
	planApply(t, p)
	if len(planFind(t, ms[0].Slot, "stray")) != 0 || len(planFind(t, ms[0].Slot, "both")) != 1 {
		t.Fatal("prune removed the wrong objects")
	}
}

func TestPlanRefusesMixedLogin(t *testing.T) {
	ms := planMembers(t, 2, nil)
	if err := ms[1].Slot.Logout(planCtx(t)); err != nil {
		t.Fatal(err)
	}
	_, err := sync.MakePlan(planCtx(t), ms, nil, sync.PlanOptions{})
	if err == nil || !strings.Contains(err.Error(), "m0") || !strings.Contains(err.Error(), "m1") {
		t.Fatalf("mixed login: %v", err)
	}
}

func TestPlanUnreachableMember(t *testing.T) {
	f := slottest.NewFaults()
	ms := planMembers(t, 3, f)
	planData(t, ms[0].Slot, "x", "x")
	f.FailAll("m2", pkcs11.Error(pkcs11.CKR_DEVICE_ERROR))

	_, err := sync.MakePlan(planCtx(t), ms, nil, sync.PlanOptions{})
	if err == nil || !strings.Contains(err.Error(), "m2") {
		t.Fatalf("plan with a dead member: %v", err)
	}
	p := planMake(t, ms, nil, sync.PlanOptions{SkipUnreachable: true})
	if p.Skipped["m2"] == nil || len(p.Members) != 2 {
		t.Fatalf("skipped %v, members %v", p.Skipped, p.Members)
	}
	if strings.Join(actionStrings(p.Actions), ";") != "copy data x m1<-m0" {
		t.Fatalf("actions %v", actionStrings(p.Actions))
	}
	// A request error is not a reason to skip.
	f.Heal("m2")
	f.Fail("m2", slot.OpFindObjects, pkcs11.Error(pkcs11.CKR_ARGUMENTS_BAD))
	if _, err := sync.MakePlan(planCtx(t), ms, nil, sync.PlanOptions{SkipUnreachable: true}); err == nil {
		t.Fatal("a request error was skipped over")
	}
}

// An Apply cut short by failures on the target leaves no half-made object
// there, and the next plan + apply finishes the work.
func TestApplyInterruptedIsFinishedByTheNext(t *testing.T) {
	f := slottest.NewFaults()
	ms := planMembers(t, 2, f)
	a, b := ms[0].Slot, ms[1].Slot
	for i := range 6 {
		planGenAES(t, a, fmt.Sprintf("s%d", i), planID(t))
		planGenEC(t, a, fmt.Sprintf("k%d", i), planID(t))
	}
	p := planMake(t, ms, nil, sync.PlanOptions{})
	if len(p.Actions) != 18 {
		t.Fatalf("%d actions, want 18", len(p.Actions))
	}
	// b's device fails after a few unwraps: some copies fail half-way.
	f.FailN("m1", slot.OpUnwrapKey, pkcs11.Error(pkcs11.CKR_DEVICE_ERROR), 4)
	f.Fail("m1", slot.OpSign, pkcs11.Error(pkcs11.CKR_DEVICE_ERROR)) // the copy's proof of possession
	res, err := (&sync.Replicator{GroupSerial: planSerial}).Apply(planCtx(t), p)
	if err == nil || len(res.Failed) == 0 {
		t.Fatalf("apply under faults: err %v, %d failed", err, len(res.Failed))
	}
	var ae *sync.ActionError
	if !errors.As(err, &ae) || ae.Action.Member != "m1" {
		t.Fatalf("error does not name the action on m1: %v", err)
	}
	// Whatever is on b now is whole: its fingerprint equals a's.
	onA := planObjects(t, a)
	for k := range planObjects(t, b) {
		if onA[k] != 1 {
			t.Fatalf("b holds %s, which a does not have: a half-made copy", k)
		}
	}
	f.Heal("m1")
	p2 := planMake(t, ms, nil, sync.PlanOptions{})
	if len(p2.Actions) == 0 || len(p2.Actions) >= 18 && len(res.Done) > 0 {
		t.Fatalf("second plan has %d actions after %d done", len(p2.Actions), len(res.Done))
	}
	planApply(t, p2)
	if inv := planAllEqual(t, ms); len(inv) != 18 {
		t.Fatalf("%d objects after finishing, want 18", len(inv))
	}
}

// Apply reports each action done or failed, in order, to the progress
// callback of its context.
func TestApplyReportsProgress(t *testing.T) {
	f := slottest.NewFaults()
	ms := planMembers(t, 3, f)
	for i := range 3 {
		planData(t, ms[0].Slot, fmt.Sprintf("d%d", i), "x")
	}
	p := planMake(t, ms, nil, sync.PlanOptions{})
	if len(p.Actions) != 6 {
		t.Fatalf("%d actions, want 6", len(p.Actions))
	}
	// m2 refuses every object: its copies fail, and count as done.
	f.Fail("m2", slot.OpCreateObject, pkcs11.Error(pkcs11.CKR_DEVICE_MEMORY))
	var got []sync.Progress
	ctx := sync.WithProgress(planCtx(t), func(pr sync.Progress) { got = append(got, pr) })
	res, _ := (&sync.Replicator{GroupSerial: planSerial}).Apply(ctx, p)
	if len(res.Failed) != 3 {
		t.Fatalf("%d failed, want m2's 3", len(res.Failed))
	}
	if len(got) != 6 {
		t.Fatalf("progress reported %d times, want 6: %+v", len(got), got)
	}
	per := map[string]int{}
	for i, pr := range got {
		if pr.Done != i+1 || pr.Total != 6 {
			t.Errorf("report %d: %+v, want %d of 6", i, pr, i+1)
		}
		per[pr.Member]++
	}
	if per["m1"] != 3 || per["m2"] != 3 {
		t.Errorf("reports per member %v, want 3 for m1 and m2", per)
	}
}

// A creation that was never answered (an intent without its revocation)
// left a key pair on m1, which died under it and is now caught up
// (Returning): the pair m1 alone holds is deleted there, not copied. A
// pair under a standing intent that a serving member alone holds (a
// creation in flight there) and one two members hold are the group's
// business as usual: copied.
func TestPlanDestroysWhatAnUnansweredCreationLeft(t *testing.T) {
	ms := planMembers(t, 3, nil)
	a, b := ms[0].Slot, ms[1].Slot
	planGenEC(t, a, "shared", planID(t))
	planApply(t, planMake(t, []sync.PlanMember{ms[0], ms[1]}, nil, sync.PlanOptions{}))
	planGenEC(t, b, "leftover", planID(t))
	planGenEC(t, a, "in-flight", planID(t))
	var intents []tombstone.Tombstone
	for _, label := range []string{"leftover", "in-flight", "shared"} {
		src := a
		if label == "leftover" {
			src = b
		}
		for _, o := range planFind(t, src, label) {
			id := o.Identity
			id.KeyType = object.NoKeyType // a template need not name it
			intents = append(intents, tombstone.Tombstone{Identity: id, Intent: true, Time: time.Now(), GroupSerial: planSerial})
		}
	}
	p := planMake(t, ms, tombstone.NewSet(intents...), sync.PlanOptions{Returning: "m1"})
	got := actionStrings(p.Actions)
	want := []string{
		"delete private key leftover m1<-", "delete public key leftover m1<-",
		"copy public key in-flight m1<-m0", "copy public key in-flight m2<-m0", "copy public key shared m2<-m0",
		"copy private key in-flight m1<-m0", "copy private key in-flight m2<-m0", "copy private key shared m2<-m0",
	}
	if strings.Join(planPhases(got), "\n") != strings.Join(planPhases(want), "\n") {
		t.Fatalf("actions:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, act := range p.Actions {
		if act.Kind == sync.Delete && act.Reason != sync.ReasonUnanswered {
			t.Errorf("%v: reason %s, want %s", act, act.Reason, sync.ReasonUnanswered)
		}
	}
	// Without Returning (a synchronize of serving members) nothing is
	// deleted on an intent's account.
	for _, act := range planMake(t, ms, tombstone.NewSet(intents...), sync.PlanOptions{}).Actions {
		if act.Kind == sync.Delete {
			t.Errorf("a plan without a returning member deletes %v", act)
		}
	}
	planApply(t, p)
	inv := planAllEqual(t, ms)
	for k := range inv {
		if strings.Contains(k, `"leftover`) {
			t.Fatalf("the unanswered creation's leftover is on the members: %s", k)
		}
	}
}

// flying is a tombstone set that also knows creations in flight in
// another process of the host, by label.
type flying struct {
	*tombstone.Set
	labels []string
}

func (f flying) InFlight(id object.Identity) bool { return slices.Contains(f.labels, id.Label) }

// A key pair that the returning member alone holds while a creation of it
// runs in another process of the host may be what that creation is
// making there (the member serves in that process): the plan neither
// deletes nor copies it, and names it in InFlight so that the catch-up
// waits; the same creation in flight with the pair on two members is the
// group's business as usual.
func TestPlanLeavesWhatACreationInFlightMakes(t *testing.T) {
	ms := planMembers(t, 3, nil)
	a, b := ms[0].Slot, ms[1].Slot
	planGenEC(t, a, "on-two", planID(t))
	planApply(t, planMake(t, []sync.PlanMember{ms[0], ms[1]}, nil, sync.PlanOptions{}))
	planGenEC(t, b, "being-made", planID(t))
	tombs := flying{Set: tombstone.NewSet(), labels: []string{"being-made", "on-two"}}
	p := planMake(t, ms, tombs, sync.PlanOptions{Returning: "m1"})
	got := actionStrings(p.Actions)
	want := []string{"copy public key on-two m2<-m0", "copy private key on-two m2<-m0"}
	if strings.Join(planPhases(got), "\n") != strings.Join(planPhases(want), "\n") {
		t.Errorf("actions:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var inFlight []string
	for _, id := range p.InFlight {
		inFlight = append(inFlight, id.Label)
	}
	if strings.Join(inFlight, ",") != "being-made,being-made" {
		t.Errorf("InFlight = %v, want both halves of being-made", p.InFlight)
	}
}
