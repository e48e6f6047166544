package tombstone

import (
	"fmt"
	"testing"

	"github.com/hagroup/hagroup/pkg/slot"
)

// chunked is a Shared on slots with small chunks, for the tests.
func chunked(t *testing.T, serial string, records, maxChunks int, slots ...*slot.Slot) *Shared {
	sh := NewShared(&Memory{}, serial, SharedOptions{ChunkRecords: records, MaxChunks: maxChunks,
		OnError: func(m string, err error) { t.Errorf("member %s: %v", m, err) }})
	sh.SetMembers(func(bool) []*slot.Slot { return slots })
	return sh
}

// A writer's register never holds more than ChunkRecords records: past
// that, its records are frozen into a chunk, which every reader reads, so
// a destroy rewrites a register of bounded size whatever the history, and
// nothing is lost.
func TestRegisterIsBoundedByChunks(t *testing.T) {
	ctx := ctxT(t)
	slots := openTokens(t, 1)
	sh := chunked(t, "81", 8, 100, slots...)
	var want []string
	for i := range 30 {
		l := fmt.Sprintf("t%02d", i)
		want = append(want, l)
		if err := sh.Record(ctx, tomb(l, []byte{byte(i)})); err != nil {
			t.Fatal(err)
		}
		held, err := sh.read(ctx, slots[0])
		if err != nil {
			t.Fatal(err)
		}
		if len(held.registers) != 1 || len(held.registers[0].records) > 8 {
			t.Fatalf("after %d destroys: %d registers, the first with %d records; want one with at most 8",
				i+1, len(held.registers), len(held.registers[0].records))
		}
	}
	held, err := sh.read(ctx, slots[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(held.objects) != 3 {
		t.Errorf("%d chunks for 30 records frozen 9 at a time, want 3", len(held.objects))
	}
	if tombs, _ := onMember(t, "81", slots[0]); fmt.Sprint(tombs) != fmt.Sprint(want) {
		t.Errorf("a fresh reader finds %v, want %v", tombs, want)
	}
	// A revocation of a frozen record is written and read.
	local, err := sh.local.Records(ctx)
	if err != nil || local[0].Identity.Label != "t00" {
		t.Fatalf("local records %v, %v; want t00 first", local, err)
	}
	if err := sh.Record(ctx, local[0].Revocation()); err != nil {
		t.Fatal(err)
	}
	if tombs, _ := onMember(t, "81", slots[0]); fmt.Sprint(tombs) != fmt.Sprint(want[1:]) {
		t.Errorf("after revoking t00 a fresh reader finds %v, want %v", tombs, want[1:])
	}
}

// Past MaxChunks, a plan's read merges the chunks into one; every record
// stays, and two writers merging at once lose nothing.
func TestChunksAreMerged(t *testing.T) {
	ctx := ctxT(t)
	slots := openTokens(t, 1)
	a := chunked(t, "82", 2, 2, slots...)
	var want []string
	for i := range 12 {
		l := fmt.Sprintf("t%02d", i)
		want = append(want, l)
		if err := a.Record(ctx, tomb(l, []byte{byte(i)})); err != nil {
			t.Fatal(err)
		}
	}
	held, err := a.read(ctx, slots[0])
	if err != nil || len(held.objects) <= 2 {
		t.Fatalf("before the merge: %d chunks (%v), want more than 2", len(held.objects), err)
	}
	b := chunked(t, "82", 2, 2, slots...)
	for _, sh := range []*Shared{a, b} {
		if _, err := sh.Snapshot(ctx); err != nil {
			t.Fatal(err)
		}
	}
	held, err = a.read(ctx, slots[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(held.objects) > 2 {
		t.Errorf("after the merge: %d chunks, want at most 2", len(held.objects))
	}
	if tombs, _ := onMember(t, "82", slots[0]); fmt.Sprint(tombs) != fmt.Sprint(want) {
		t.Errorf("after the merge a fresh reader finds %v, want %v", tombs, want)
	}
}

// An intent published to the members and then settled (a later creation
// of its identity succeeded) is revoked on the members by the process's
// next destroy, whose record alone would not carry the revocation: a
// standing intent would let a recovery delete that identity's object.
func TestSettledPublishedIntentIsRevokedOnMembers(t *testing.T) {
	ctx := ctxT(t)
	slots := openTokens(t, 1)
	sh := chunked(t, "83", 8, 16, slots...)
	if err := sh.Record(ctx, tomb("first", []byte{1})); err != nil { // the register exists
		t.Fatal(err)
	}
	id := ident("made-later")
	ts, err := sh.Intend(ctx, []Tombstone{{Identity: id}})
	if err != nil {
		t.Fatal(err)
	}
	sh.Release(ts) // the creation went unanswered: released, then published (Pending.End)
	sh.Publish(ctx)
	reader := chunked(t, "83", 8, 16, slots...)
	if set, err := reader.Snapshot(ctx); err != nil || !set.Unanswered(id) {
		t.Fatalf("after Publish a reader's Unanswered = %v (%v), want true", set.Unanswered(id), err)
	}
	if err := sh.Settle(ctx, ts); err != nil { // a later creation succeeded
		t.Fatal(err)
	}
	if err := sh.Record(ctx, tomb("second", []byte{2})); err != nil {
		t.Fatal(err)
	}
	held, err := reader.read(ctx, slots[0])
	if err != nil {
		t.Fatal(err)
	}
	if NewSet(held.records.sorted()...).Unanswered(id) {
		t.Error("the member still holds the settled intent as standing after the next destroy")
	}
}

// A process's first destroy on a member reads only the registers there,
// and brings the intents another process of the host left standing in
// the journal when it died mid-creation: a member that may hold what
// that creation made is then caught up under them by any host.
func TestFirstDestroySpreadsStandingIntents(t *testing.T) {
	ctx := ctxT(t)
	slots := openTokens(t, 1)
	dir := t.TempDir()
	dead := NewShared(openT(t, dir, Options{}), "1000001", SharedOptions{})
	dead.SetMembers(func(bool) []*slot.Slot { return slots })
	id := ident("never-answered")
	ts, err := dead.Intend(ctx, []Tombstone{{Identity: id}})
	if err != nil {
		t.Fatal(err)
	}
	// The process dies: nothing published, and the kernel lets go of its
	// holds.
	dead.Release(ts)
	next := NewShared(openT(t, dir, Options{}), "1000001", SharedOptions{OnError: func(m string, err error) { t.Errorf("member %s: %v", m, err) }})
	next.SetMembers(func(bool) []*slot.Slot { return slots })
	if err := next.Record(ctx, tomb("destroyed", []byte{1})); err != nil {
		t.Fatal(err)
	}
	held, err := chunked(t, "1000001", 8, 16, slots...).read(ctx, slots[0])
	if err != nil {
		t.Fatal(err)
	}
	set := NewSet(held.records.sorted()...)
	if !set.Unanswered(id) || !set.ContainsIdentity(ident("destroyed")) {
		t.Errorf("the member holds %v; want the standing intent and the destroy", held.records.sorted())
	}
}
