package tombstone

import (
	"slices"
	"testing"
	"time"
)

// The in-memory store answers like the journal: a revocation cancels the
// tombstone of its own time only, Revive revokes a version's live
// tombstones once, and neither leaves the revoked ones in All or Snapshot.
func TestMemoryRevokesLikeTheJournal(t *testing.T) {
	ctx := ctxT(t)
	var m Memory
	first := tomb("k", []byte{1})
	first.Time = time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	second := first
	second.Time = first.Time.Add(time.Second)
	other := tomb("k", []byte{2})
	for _, r := range []Tombstone{first, second, other, first.Revocation()} {
		if err := m.Record(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if got := m.All(); !slices.EqualFunc(got, []Tombstone{second, other}, sameRecord) {
		t.Fatalf("All after revoking the first = %v, want the second and the other version", got)
	}
	n, err := m.Revive(ctx, ident("k"), []byte{1})
	if err != nil || n != 1 {
		t.Fatalf("Revive = %d, %v; want 1 (the first was revoked already)", n, err)
	}
	if n, _ := m.Revive(ctx, ident("k"), []byte{1}); n != 0 {
		t.Fatalf("a second Revive revoked %d", n)
	}
	if n, _ := m.Revive(ctx, ident("k"), nil); n != 0 {
		t.Fatalf("Revive of a nil fingerprint revoked %d", n)
	}
	set, err := m.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if set.Contains(ident("k"), []byte{1}) || !set.Contains(ident("k"), []byte{2}) {
		t.Fatalf("snapshot holds %v, want only fingerprint 02", set.All())
	}
	recs, _ := m.Records(ctx)
	if len(recs) != 5 {
		t.Fatalf("Records kept %d, want 5 (3 tombstones, 2 revocations)", len(recs))
	}
}

func sameRecord(a, b Tombstone) bool {
	return a.Identity.Equal(b.Identity) && string(a.Fingerprint) == string(b.Fingerprint) &&
		a.Time.Equal(b.Time) && a.Revoked == b.Revoked
}
