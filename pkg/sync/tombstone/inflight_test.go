package tombstone

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/slot"
)

// A creation running in one process of the host holds its intents: a
// second process sharing the journal neither takes them for a creation
// that died (Unanswered) nor spreads them to the members, where another
// host could act on them. The soak found the harm: a catch-up in one
// process destroyed, as a leftover, the public half of a key pair that
// another process was still making on the member it was catching up.
// Once the creation ends unanswered, the intent counts and spreads.
func TestIntentInFlightIsNeitherUnansweredNorSpread(t *testing.T) {
	ctx := ctxT(t)
	slots := openTokens(t, 1)
	dir := t.TempDir()
	open := func() *Shared {
		sh := NewShared(openT(t, dir, Options{}), "1000001", SharedOptions{OnError: func(m string, err error) { t.Errorf("member %s: %v", m, err) }})
		sh.SetMembers(func(bool) []*slot.Slot { return slots })
		return sh
	}
	creator, other := open(), open()
	id := ident("being-made")
	ts, err := creator.Intend(ctx, []Tombstone{{Identity: id}})
	if err != nil {
		t.Fatal(err)
	}
	set, err := other.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if set.Unanswered(id) || !set.InFlight(id) {
		t.Errorf("while the creation runs, another process's snapshot: Unanswered %v, InFlight %v; want false, true", set.Unanswered(id), set.InFlight(id))
	}
	if err := other.Record(ctx, tomb("destroyed", []byte{1})); err != nil { // its first write spreads the local record
		t.Fatal(err)
	}
	held, err := chunked(t, "1000001", 8, 16, slots...).read(ctx, slots[0])
	if err != nil {
		t.Fatal(err)
	}
	if NewSet(held.records.sorted()...).Unanswered(id) {
		t.Error("a running creation's intent was spread to the member: another host would destroy what it makes")
	}
	// The creation ends unanswered (Pending.End): released, then published.
	creator.Release(ts)
	creator.Publish(ctx)
	set, err = other.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !set.Unanswered(id) || set.InFlight(id) {
		t.Errorf("after the creation went unanswered: Unanswered %v, InFlight %v; want true, false", set.Unanswered(id), set.InFlight(id))
	}
	held, err = chunked(t, "1000001", 8, 16, slots...).read(ctx, slots[0])
	if err != nil {
		t.Fatal(err)
	}
	if !NewSet(held.records.sorted()...).Unanswered(id) {
		t.Error("the unanswered intent did not reach the member")
	}
}

// A journal's hold is a lock file: one left by a process that died (no
// one holds its lock) is no hold, and is removed; one held is.
func TestJournalHoldEndsWithItsHolder(t *testing.T) {
	dir := t.TempDir()
	j := openT(t, dir, Options{})
	in := Tombstone{Identity: ident("k"), Time: tomb("k", nil).Time, Intent: true}
	release, err := j.Hold(in)
	if err != nil {
		t.Fatal(err)
	}
	if !openT(t, dir, Options{}).Held(in) {
		t.Error("a held intent is not Held from another journal of the host")
	}
	release()
	if j.Held(in) {
		t.Error("a released intent is still Held")
	}
	// A dead holder: its file stays, unlocked.
	path := j.path(holdName(in))
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if j.Held(in) {
		t.Error("an intent whose holder died is Held")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("the dead holder's lock file stays: %v", err)
	}
}

// A creation's process that dies between settling its intent and letting
// go of its hold leaves the lock file: the compaction that drops the
// settled intent removes it, and leaves the file of a holder still alive.
func TestCompactionRemovesADeadCreationsLockFile(t *testing.T) {
	dir := t.TempDir()
	j := openT(t, dir, Options{})
	ctx := context.Background()
	now := time.Now()
	dead := Tombstone{Identity: ident("dead"), Time: now, Intent: true}
	alive := Tombstone{Identity: ident("alive"), Time: now, Intent: true}
	release, err := j.Hold(alive)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	deadPath := j.path(holdName(dead))
	if err := os.WriteFile(deadPath, nil, 0o600); err != nil { // held by nobody
		t.Fatal(err)
	}
	for _, r := range []Tombstone{dead, dead.Revocation(), alive, alive.Revocation()} {
		if err := j.Record(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	st, err := j.Compact(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Revoked != 2 {
		t.Errorf("compaction dropped %d revoked intents, want 2", st.Revoked)
	}
	if _, err := os.Stat(deadPath); !os.IsNotExist(err) {
		t.Errorf("the dead creation's lock file stays after the compaction: %v", err)
	}
	if _, err := os.Stat(j.path(holdName(alive))); err != nil {
		t.Errorf("the compaction removed a live holder's lock file: %v", err)
	}
}
