package tombstone

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/hagroup/hagroup/pkg/sync/state"
	"github.com/miekg/pkcs11"
)

// faultyTokens opens n tokens with f at their slot boundary.
func faultyTokens(tb testing.TB, n int, f *slottest.Faults) []*slot.Slot {
	tb.Helper()
	var out []*slot.Slot
	for _, tok := range testhsm.Take(tb, n) {
		s, err := slot.Open(context.Background(), slot.Spec{Name: tok.Name, Module: tok.Module, ModuleEnv: tok.ModuleEnv,
			TokenLabel: tok.Label, PIN: secret.PINFromString(tok.UserPIN), CommandTimeout: 20 * time.Second, Interceptor: f})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { s.Close() })
		out = append(out, s)
	}
	return out
}

// openAs opens tok once more as member name (another process's view of
// the same token), with f at its slot boundary.
func openAs(tb testing.TB, tok testhsm.Token, name string, f *slottest.Faults) *slot.Slot {
	tb.Helper()
	spec := slot.Spec{Name: name, Module: tok.Module, ModuleEnv: tok.ModuleEnv,
		TokenLabel: tok.Label, PIN: secret.PINFromString(tok.UserPIN), CommandTimeout: 20 * time.Second}
	if f != nil {
		spec.Interceptor = f
	}
	s, err := slot.Open(context.Background(), spec)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// sharedAt is shared with a test clock.
func sharedAt(tb testing.TB, serial string, clk *clock, local Local, slots ...*slot.Slot) *Shared {
	sh := NewShared(local, serial, SharedOptions{Now: clk.Now,
		OnError: func(m string, err error) { tb.Errorf("member %s: %v", m, err) }})
	sh.SetMembers(func(bool) []*slot.Slot { return slots })
	return sh
}

// labels returns what a fresh reader finds on s: the labels of the
// tombstones and the registers' writers.
func onMember(t *testing.T, serial string, s *slot.Slot) (tombs []string, writers []string) {
	t.Helper()
	reader := shared(t, serial, []*slot.Slot{s})
	held, err := reader.read(ctxT(t), s)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range held.registers {
		writers = append(writers, r.writer)
	}
	for _, tb := range held.records.sorted() {
		if !tb.Revoked {
			tombs = append(tombs, tb.Identity.Label)
		}
	}
	slices.Sort(tombs)
	return tombs, writers
}

// After its first write on a member, a writer records a destroy by
// changing its register's label in place: no object is created or
// destroyed, and a process starting afresh reads every record.
func TestRegisterIsWrittenInPlace(t *testing.T) {
	ctx := ctxT(t)
	f := slottest.NewFaults()
	slots := faultyTokens(t, 2, f)
	sh := shared(t, "70", slots)
	for i := range 5 {
		if err := sh.Record(ctx, tomb(fmt.Sprintf("k%d", i), []byte{byte(i)})); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range slots {
		if c, d, set := f.Calls(s.Name(), slot.OpCreateObject), f.Calls(s.Name(), slot.OpDestroyObject), f.Calls(s.Name(), slot.OpSetAttributes); c != 1 || d != 0 || set != 4 {
			t.Errorf("%s: 5 records took %d creations, %d destructions, %d label updates; want 1, 0, 4", s.Name(), c, d, set)
		}
		tombs, writers := onMember(t, "70", s)
		if fmt.Sprint(tombs) != "[k0 k1 k2 k3 k4]" || len(writers) != 1 {
			t.Errorf("%s holds %v in %d registers, want [k0 k1 k2 k3 k4] in 1", s.Name(), tombs, len(writers))
		}
	}
	set, err := shared(t, "70", slots).Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if set.Len() != 5 {
		t.Errorf("a fresh process reads %d tombstones, want 5", set.Len())
	}
}

// A folder (another writer) holding the owner's register, unchanged for
// FoldAfter, between its check and its destroy, while the owner records
// again: the owner replaces a register that old instead of updating it,
// so the fold removes nothing the owner still needs. With an update in
// place the owner's check would pass before the folder's destroy and
// the new record would be lost.
func TestFoldRacingTheOwnerLosesNothing(t *testing.T) {
	ctx := ctxT(t)
	tok := testhsm.Take(t, 1)[0]
	f := slottest.NewFaults()
	ownerSlot, folderSlot := openAs(t, tok, tok.Name+"-owner", nil), openAs(t, tok, tok.Name+"-folder", f)
	clk := &clock{now: time.Now()}
	owner := sharedAt(t, "71", clk, &Memory{}, ownerSlot)
	folder := sharedAt(t, "71", clk, &Memory{}, folderSlot)
	if err := owner.Record(ctx, tomb("first", []byte{1})); err != nil {
		t.Fatal(err)
	}
	if _, err := folder.Snapshot(ctx); err != nil { // first sight of the owner's register
		t.Fatal(err)
	}
	clk.Add(DefaultFoldAfter)
	f.Hang(folderSlot.Name(), slot.OpDestroyObject)
	folded := make(chan error, 1)
	go func() {
		_, err := folder.Snapshot(ctx)
		folded <- err
	}()
	if err := f.WaitHung(ctx, folderSlot.Name(), 1); err != nil {
		t.Fatalf("the folder never came to destroy the owner's register: %v", err)
	}
	if err := owner.Record(ctx, tomb("second", []byte{2})); err != nil {
		t.Fatal(err)
	}
	f.Release(folderSlot.Name())
	if err := <-folded; err != nil {
		t.Fatal(err)
	}
	tombs, _ := onMember(t, "71", ownerSlot)
	if fmt.Sprint(tombs) != "[first second]" {
		t.Errorf("after the race the member holds %v, want [first second]", tombs)
	}
}

// An owner that stalls in mid-write (a paused VM: it decided to update its
// register in place, then stood still for FoldAfter) while another writer
// folds the register — reading it before the update, destroying it after
// the owner's check — loses no record: the owner sees after its write how
// long it took, reports the stall and writes its records again into a new
// register.
func TestFoldRacingAStalledOwnerLosesNothing(t *testing.T) {
	ctx := ctxT(t)
	tok := testhsm.Take(t, 1)[0]
	f := slottest.NewFaults()
	ownerSlot, folderSlot := openAs(t, tok, tok.Name+"-owner", f), openAs(t, tok, tok.Name+"-folder", f)
	clk := &clock{now: time.Now()}
	var stalls []error
	var mu sync.Mutex
	owner := NewShared(&Memory{}, "73", SharedOptions{Now: clk.Now, OnError: func(m string, err error) {
		mu.Lock()
		defer mu.Unlock()
		stalls = append(stalls, err)
	}})
	owner.SetMembers(func(bool) []*slot.Slot { return []*slot.Slot{ownerSlot} })
	folder := sharedAt(t, "73", clk, &Memory{}, folderSlot)
	if err := owner.Record(ctx, tomb("first", []byte{1})); err != nil {
		t.Fatal(err)
	}
	if _, err := folder.Snapshot(ctx); err != nil { // first sight of the owner's register
		t.Fatal(err)
	}
	clk.Add(time.Hour) // young enough to be updated in place
	f.Hang(ownerSlot.Name(), slot.OpSetAttributes)
	recorded := make(chan error, 1)
	go func() { recorded <- owner.Record(ctx, tomb("second", []byte{2})) }()
	if err := f.WaitHung(ctx, ownerSlot.Name(), 1); err != nil {
		t.Fatalf("the owner never came to update its register: %v", err)
	}
	clk.Add(DefaultFoldAfter) // the owner stands still; the folder sees the register unchanged
	f.Hang(folderSlot.Name(), slot.OpDestroyObject)
	folded := make(chan error, 1)
	go func() {
		_, err := folder.Snapshot(ctx)
		folded <- err
	}()
	if err := f.WaitHung(ctx, folderSlot.Name(), 1); err != nil {
		t.Fatalf("the folder never came to destroy the owner's register: %v", err)
	}
	f.Release(ownerSlot.Name()) // the owner wakes, updates in place, checks
	if err := <-recorded; err != nil {
		t.Fatal(err)
	}
	f.Release(folderSlot.Name())
	if err := <-folded; err != nil {
		t.Fatal(err)
	}
	if tombs, _ := onMember(t, "73", ownerSlot); fmt.Sprint(tombs) != "[first second]" {
		t.Errorf("after the stalled owner met the fold the member holds %v, want [first second]", tombs)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(stalls) != 1 || !errors.Is(stalls[0], ErrStalled) {
		t.Errorf("the owner reported %v, want one ErrStalled", stalls)
	}
}

// A writer that is gone (a process that ended) leaves its register; once
// another writer has seen it unchanged for FoldAfter it folds it into its
// own, and every record stays.
func TestRegisterOfAGoneWriterIsFolded(t *testing.T) {
	ctx := ctxT(t)
	slots := openTokens(t, 1)
	clk := &clock{now: time.Now()}
	gone := sharedAt(t, "72", clk, &Memory{}, slots...)
	for _, l := range []string{"a", "b"} {
		if err := gone.Record(ctx, tomb(l, []byte{1})); err != nil {
			t.Fatal(err)
		}
	}
	agent := sharedAt(t, "72", clk, &Memory{}, slots...)
	if err := agent.Record(ctx, tomb("c", []byte{1})); err != nil {
		t.Fatal(err)
	}
	clk.Add(DefaultFoldAfter - time.Minute)
	if _, err := agent.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	if _, writers := onMember(t, "72", slots[0]); len(writers) != 2 {
		t.Fatalf("before FoldAfter the member holds %d registers, want 2 (nothing folded yet)", len(writers))
	}
	clk.Add(time.Minute)
	set, err := agent.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tombs, writers := onMember(t, "72", slots[0])
	if fmt.Sprint(tombs) != "[a b c]" || len(writers) != 1 || writers[0] != agent.id || set.Len() != 3 {
		t.Errorf("after FoldAfter the member holds %v in registers of %v (snapshot %d); want [a b c] in the agent's alone", tombs, writers, set.Len())
	}
}

// A member that will not keep records in a label is written with created
// objects, as before registers, without a failure being reported, and
// not asked again.
func TestMemberRefusingLabelUpdatesGetsObjects(t *testing.T) {
	ctx := ctxT(t)
	f := slottest.NewFaults()
	slots := faultyTokens(t, 1, f)
	name := slots[0].Name()
	f.Fail(name, slot.OpSetAttributes, pkcs11.Error(pkcs11.CKR_ATTRIBUTE_READ_ONLY))
	sh := shared(t, "73", slots) // fails the test on any reported error
	for _, l := range []string{"a", "b", "c"} {
		if err := sh.Record(ctx, tomb(l, []byte{1})); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.Calls(name, slot.OpSetAttributes); n != 1 {
		t.Errorf("the label update was tried %d times, want once", n)
	}
	if tombs, _ := onMember(t, "73", slots[0]); fmt.Sprint(tombs) != "[a b c]" {
		t.Errorf("the member holds %v, want [a b c]", tombs)
	}
}

// Objects of the created form (an older build's, or a member refusing
// registers) are still read; one whose records are all past the horizon
// is removed by the next writer.
func TestObjectsOfTheCreatedFormAreRead(t *testing.T) {
	ctx := ctxT(t)
	slots := openTokens(t, 1)
	clk := &clock{now: time.Now()}
	old := tomb("old", []byte{1})
	old.Time, old.GroupSerial = clk.Now(), "74"
	if _, err := state.Write(ctx, slots[0], state.Label("74", StateKind), Application, encodeRecords([]Tombstone{old}), nil); err != nil {
		t.Fatal(err)
	}
	sh := sharedAt(t, "74", clk, &Memory{}, slots...)
	if err := sh.Record(ctx, tomb("new", []byte{2})); err != nil {
		t.Fatal(err)
	}
	set, err := sharedAt(t, "74", clk, &Memory{}, slots...).Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if set.Len() != 2 {
		t.Errorf("a reader finds %d tombstones, want the old object's and the register's", set.Len())
	}
	clk.Add(DefaultHorizon + time.Hour)
	if err := sh.Record(ctx, tomb("later", []byte{3})); err != nil {
		t.Fatal(err)
	}
	if _, err := sh.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	if !slots[0].LoggedIn() {
		t.Fatal("the member is not logged in: its private state objects would not show")
	}
	objs, err := slots[0].FindObjects(ctx, append(state.Private(), pkcs11.NewAttribute(pkcs11.CKA_LABEL, []byte(state.Label("74", StateKind)))))
	if err != nil || len(objs) != 0 {
		t.Errorf("the object past the horizon is still there (%d objects, %v)", len(objs), err)
	}
}

// Processes sharing a host's journal share one register per member and
// lose nothing writing it at once.
func TestJournalWritersShareOneRegister(t *testing.T) {
	ctx := ctxT(t)
	slots := openTokens(t, 1)
	dir := t.TempDir()
	const procs, each = 3, 5
	var wg sync.WaitGroup
	for p := range procs {
		j := openT(t, dir, Options{})
		sh := NewShared(j, "1000001", SharedOptions{OnError: func(m string, err error) { t.Errorf("member %s: %v", m, err) }})
		sh.SetMembers(func(bool) []*slot.Slot { return slots })
		wg.Go(func() {
			for i := range each {
				if err := sh.Record(ctx, tomb(fmt.Sprintf("p%d-%d", p, i), []byte{1})); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	tombs, writers := onMember(t, "1000001", slots[0])
	if len(tombs) != procs*each || len(writers) != 1 {
		t.Errorf("the member holds %d tombstones in %d registers, want %d in 1", len(tombs), len(writers), procs*each)
	}
}

// A register removed under its owner (a fold by a writer whose sighting
// was wrong, or an operator) is made again at the owner's next write,
// with every record of its local record: the update's check finds it
// gone.
func TestOwnerRecreatesItsRemovedRegister(t *testing.T) {
	ctx := ctxT(t)
	slots := openTokens(t, 1)
	sh := shared(t, "75", slots)
	if err := sh.Record(ctx, tomb("a", []byte{1})); err != nil {
		t.Fatal(err)
	}
	held, err := sh.read(ctx, slots[0])
	if err != nil || len(held.registers) != 1 {
		t.Fatalf("want one register, got %v (%v)", held.registers, err)
	}
	if err := slots[0].DestroyObject(ctx, held.registers[0].handle); err != nil {
		t.Fatal(err)
	}
	if err := sh.Record(ctx, tomb("b", []byte{2})); err != nil {
		t.Fatal(err)
	}
	if tombs, writers := onMember(t, "75", slots[0]); fmt.Sprint(tombs) != "[a b]" || len(writers) != 1 {
		t.Errorf("the member holds %v in %d registers, want [a b] in 1", tombs, len(writers))
	}
}

// A public object shaped as a register — anyone can make one without the
// PIN — is no tombstone either.
func TestPublicRegisterIsNoTombstone(t *testing.T) {
	ctx := ctxT(t)
	slots := openTokens(t, 1)
	forged := tomb("victim", []byte{1})
	forged.Time, forged.GroupSerial = time.Now(), "76"
	label := encodeRegister(state.Label("76", StateKind), "0badc0de", time.Now(), []Tombstone{forged})
	if _, err := slots[0].CreateObject(ctx, []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
		pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, false), pkcs11.NewAttribute(pkcs11.CKA_APPLICATION, Application),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, label),
	}); err != nil {
		t.Fatal(err)
	}
	set, err := shared(t, "76", slots).Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if set.Len() != 0 {
		t.Errorf("a public register counted as tombstones: %v", set.All())
	}
}
