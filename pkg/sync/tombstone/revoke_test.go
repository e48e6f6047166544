package tombstone

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A destroy recorded ahead and then not done is revoked: the revocation
// cancels that tombstone for this process and every other reader, and
// nothing else.
func TestRevocationCancelsItsTombstone(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	clk := &clock{now: time.Date(2026, 5, 1, 10, 0, 0, 123456789, time.UTC)}
	opts := Options{Now: clk.Now, CompactBytes: -1}
	j := openT(t, dir, opts)
	ahead := tomb("refused", []byte{7})
	ahead.Time = clk.Now()
	if err := j.Record(ctx, ahead); err != nil {
		t.Fatal(err)
	}
	mustContain(t, j, ident("refused"), []byte{7}, true)
	if err := j.Record(ctx, ahead.Revocation()); err != nil {
		t.Fatal(err)
	}
	mustContain(t, j, ident("refused"), []byte{7}, false)
	other := openT(t, dir, opts)
	mustContain(t, other, ident("refused"), []byte{7}, false)
	snap, err := other.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Len() != 0 || snap.Contains(ident("refused"), []byte{7}) || snap.ContainsIdentity(ident("refused")) {
		t.Fatalf("snapshot after revocation holds %v", snap.All())
	}

	// The journal says so in a line an operator can read.
	lines := readLines(t, filepath.Join(dir, "1000001", JournalName))
	if len(lines) != 2 || strings.Contains(lines[0], "revoked") || !strings.Contains(lines[1], `"revoked":true`) ||
		!strings.Contains(lines[1], `"time":"2026-05-01T10:00:00.123456789Z"`) {
		t.Fatalf("journal:\n%s", strings.Join(lines, "\n"))
	}

	// A later destroy of the same object counts again.
	clk.Add(time.Second)
	if err := j.Record(ctx, tomb("refused", []byte{7})); err != nil {
		t.Fatal(err)
	}
	mustContain(t, other, ident("refused"), []byte{7}, true)
}

// A revocation cancels exactly the tombstone of its time: another
// process's tombstone of the same object (it did destroy it) still
// counts, whether it was recorded before or after the revoked one.
func TestRevocationLeavesOtherTombstonesOfTheObject(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	base := time.Now().Add(-time.Hour) // within the horizon
	a, b := openT(t, dir, Options{}), openT(t, dir, Options{})
	mine := tomb("raced", []byte{1})
	mine.Time = base.Add(time.Millisecond)
	theirs := tomb("raced", []byte{1})
	theirs.Time = base
	for _, step := range []struct {
		j  *Journal
		tb Tombstone
	}{{a, theirs}, {b, mine}, {b, mine.Revocation()}} {
		if err := step.j.Record(ctx, step.tb); err != nil {
			t.Fatal(err)
		}
	}
	mustContain(t, a, ident("raced"), []byte{1}, true)
	mustContain(t, openT(t, dir, Options{}), ident("raced"), []byte{1}, true)
	if _, err := a.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	mustContain(t, openT(t, dir, Options{}), ident("raced"), []byte{1}, true)

	// The same with the earlier tombstone revoked.
	later := tomb("raced2", []byte{2})
	later.Time = base.Add(time.Second)
	early := tomb("raced2", []byte{2})
	early.Time = base
	for _, tb := range []Tombstone{early, later, early.Revocation()} {
		if err := a.Record(ctx, tb); err != nil {
			t.Fatal(err)
		}
	}
	mustContain(t, b, ident("raced2"), []byte{2}, true)
	if set := NewSet(early, later, early.Revocation()); !set.Contains(ident("raced2"), []byte{2}) {
		t.Fatal("NewSet: a revocation cancelled a later tombstone of the object")
	}
	if set := NewSet(theirs, mine, mine.Revocation()); !set.Contains(ident("raced"), []byte{1}) || set.Len() != 1 {
		t.Fatalf("NewSet: a revocation cancelled another tombstone of the object: %v", set.All())
	}
}

// Compaction drops a revoked tombstone with its revocation, keeps the
// rest, and a revocation of a tombstone already folded into the
// checkpoint still cancels it.
func TestRevocationAndCompaction(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	gdir := filepath.Join(dir, "1000001")
	opts := Options{CompactBytes: -1}
	j := openT(t, dir, opts)
	record := func(tb Tombstone) Tombstone {
		t.Helper()
		if tb.Time.IsZero() {
			tb.Time = time.Now()
		}
		if err := j.Record(ctx, tb); err != nil {
			t.Fatal(err)
		}
		return tb
	}
	gone := record(tomb("gone", []byte{1}))
	refused := record(tomb("refused", []byte{2}))
	record(refused.Revocation())
	folded := record(tomb("folded", []byte{3}))

	jpath := filepath.Join(gdir, JournalName)
	lines, err := os.ReadFile(jpath)
	if err != nil {
		t.Fatal(err)
	}
	st, err := j.Compact(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Kept != 2 || st.Revoked != 1 || st.Expired != 0 {
		t.Fatalf("compaction: %+v, want 2 kept, 1 revoked", st)
	}
	ckpt, err := os.ReadFile(filepath.Join(gdir, CheckpointName))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(ckpt), "revoked") || strings.Contains(string(ckpt), `"label": "refused"`) {
		t.Fatalf("checkpoint keeps the revoked tombstone:\n%s", ckpt)
	}
	fresh := openT(t, dir, opts)
	mustContain(t, fresh, gone.Identity, gone.Fingerprint, true)
	mustContain(t, fresh, folded.Identity, folded.Fingerprint, true)
	mustContain(t, fresh, refused.Identity, refused.Fingerprint, false)

	// Revoked after its tombstone went into the checkpoint.
	record(folded.Revocation())
	mustContain(t, fresh, folded.Identity, folded.Fingerprint, false)
	mustContain(t, openT(t, dir, opts), folded.Identity, folded.Fingerprint, false)
	if st, err := j.Compact(ctx); err != nil || st.Kept != 1 || st.Revoked != 1 {
		t.Fatalf("second compaction: %+v, %v; want 1 kept, 1 revoked", st, err)
	}
	mustContain(t, openT(t, dir, opts), folded.Identity, folded.Fingerprint, false)
	mustContain(t, openT(t, dir, opts), gone.Identity, gone.Fingerprint, true)

	// A compaction that crashed before emptying the journal leaves the
	// tombstone and its revocation in the journal next to a checkpoint
	// without them: the revocation still holds.
	if err := os.WriteFile(jpath, lines, 0o660); err != nil {
		t.Fatal(err)
	}
	crashed := openT(t, dir, opts)
	mustContain(t, crashed, refused.Identity, refused.Fingerprint, false)
	mustContain(t, crashed, gone.Identity, gone.Fingerprint, true)

	// After a revocation, a new destroy of the object counts again, and
	// survives compaction.
	again := record(tomb("refused", []byte{2}))
	if _, err := j.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	mustContain(t, openT(t, dir, opts), again.Identity, again.Fingerprint, true)
}

func TestNewSetRevocation(t *testing.T) {
	when := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	tb := tomb("k", []byte{1})
	tb.Time = when
	keep := tomb("other", []byte{2})
	keep.Time = when
	for name, ts := range map[string][]Tombstone{
		"revocation after":  {keep, tb, tb.Revocation()},
		"revocation before": {keep, tb.Revocation(), tb},
	} {
		s := NewSet(ts...)
		if s.Contains(tb.Identity, tb.Fingerprint) || s.ContainsIdentity(tb.Identity) || s.Len() != 1 ||
			!s.Contains(keep.Identity, keep.Fingerprint) {
			t.Errorf("%s: set holds %v, want only %v", name, s.All(), keep)
		}
	}
	re := tomb("k", []byte{1})
	re.Time = when.Add(time.Nanosecond)
	if s := NewSet(tb, tb.Revocation(), re); !s.Contains(tb.Identity, tb.Fingerprint) {
		t.Error("a destroy recorded again after a revocation does not count")
	}
}

func TestRevocationNeedsItsTombstoneTime(t *testing.T) {
	j := openT(t, t.TempDir(), Options{})
	rev := tomb("x", []byte{1})
	rev.Revoked = true
	if err := j.Record(ctxT(t), rev); err == nil || !strings.Contains(err.Error(), "revocation") {
		t.Fatalf("revocation without a time: %v", err)
	}
}

// An object made again through the group revives: Revive revokes every
// tombstone of its identity and fingerprint that counts (two processes
// destroyed it, say), for every reader, and nothing else; with nothing to
// revoke it writes nothing; a later destroy counts again.
func TestReviveRevokesEveryTombstoneOfTheVersion(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	clk := &clock{now: time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)}
	opts := Options{Now: clk.Now, CompactBytes: -1}
	j := openT(t, dir, opts)
	other := openT(t, dir, opts)
	for _, tb := range []Tombstone{tomb("again", []byte{1}), tomb("other-fp", []byte{2})} {
		if err := j.Record(ctx, tb); err != nil {
			t.Fatal(err)
		}
	}
	clk.Add(time.Second)
	if err := other.Record(ctx, tomb("again", []byte{1})); err != nil { // a second destroy, elsewhere
		t.Fatal(err)
	}
	again := ident("again")
	again.Label = "other-fp"
	if err := j.Record(ctx, Tombstone{Identity: again, Fingerprint: []byte{2}}); err != nil {
		t.Fatal(err)
	}
	n, err := j.Revive(ctx, ident("again"), []byte{1})
	if err != nil || n != 2 {
		t.Fatalf("Revive = %d, %v; want both tombstones revoked", n, err)
	}
	mustContain(t, j, ident("again"), []byte{1}, false)
	mustContain(t, other, ident("again"), []byte{1}, false)
	mustContain(t, other, again, []byte{2}, true)
	mustContain(t, other, ident("other-fp"), []byte{2}, true)

	path := filepath.Join(dir, "1000001", JournalName)
	before := len(readLines(t, path))
	if n, err := other.Revive(ctx, ident("again"), []byte{1}); err != nil || n != 0 {
		t.Fatalf("second Revive = %d, %v; want nothing to revoke", n, err)
	}
	if n, err := other.Revive(ctx, ident("again"), nil); err != nil || n != 0 {
		t.Fatalf("Revive without a fingerprint = %d, %v; want nothing", n, err)
	}
	if after := len(readLines(t, path)); after != before {
		t.Fatalf("Revive with nothing to revoke wrote %d lines", after-before)
	}
	clk.Add(time.Second)
	if err := j.Record(ctx, tomb("again", []byte{1})); err != nil {
		t.Fatal(err)
	}
	mustContain(t, other, ident("again"), []byte{1}, true)
}
