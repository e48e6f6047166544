package group

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/hagroup/hagroup/pkg/sync/tombstone"
	"github.com/miekg/pkcs11"
)

// Write-ahead tombstones (soak seed 1796066983962439033): a destroy's
// tombstone is on record before any member destroys the object, and is
// revoked when the destroy does not happen.

// otherProcess reads the group's tombstone journal as another process on
// the host (haagent, an application) would: through its own Journal on
// the same state directory.
func otherProcess(t *testing.T, f *fixture) *tombstone.Set {
	t.Helper()
	j, err := tombstone.Open(filepath.Dir(f.journal.Dir()), f.g.Serial(), tombstone.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	set, err := j.Snapshot(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// objectOf returns the identity and fingerprint the group knows h by.
func objectOf(t *testing.T, g *Group, h ObjectHandle) (object.Identity, []byte) {
	t.Helper()
	o, ok := g.objs.Get(h)
	if !ok {
		t.Fatalf("object %d unknown to the group", h)
	}
	return o.Identity(), o.Fingerprint()
}

// While the first member's destroy is under way, another process that
// lists the members already finds the tombstone: it cannot take the
// object, gone from the member that served it, for one to copy back.
func TestDestroyRecordsTombstoneAhead(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{interceptor: faults, policy: "primary-backup", journal: true})
	s := openSession(t, f.g)
	_, priv := genEC(t, s, "ahead")
	id, fp := objectOf(t, f.g, priv)
	if len(fp) == 0 {
		t.Fatal("the key has no fingerprint")
	}
	first := f.toks[0].Name
	faults.Hang(first, slot.OpDestroyObject)
	ctx := testContext(t)
	errc := make(chan error, 1)
	go func() { errc <- f.g.DestroyObject(ctx, priv) }()
	if err := faults.WaitHung(ctx, first, 1); err != nil {
		faults.Release(first)
		t.Fatalf("the destroy did not reach %s: %v", first, err)
	}
	set := otherProcess(t, f)
	inGroup, err := f.journal.Contains(ctx, id, fp)
	faults.Release(first)
	if err != nil {
		t.Fatal(err)
	}
	if !set.Contains(id, fp) || !inGroup {
		t.Errorf("while %s destroys the key, its tombstone is not on record (another process: %v, the group's journal: %v)",
			first, set.Contains(id, fp), inGroup)
	}
	if err := <-errc; err != nil {
		t.Fatalf("DestroyObject after the release: %v", err)
	}
	if set := otherProcess(t, f); !set.Contains(id, fp) || set.Len() != 1 {
		t.Errorf("after the destroy the journal holds %v, want the key's tombstone", set.All())
	}
	for i, n := range holdsLabel(t, f, "ahead") {
		if n != 1 {
			t.Errorf("%s holds %d objects labelled ahead, want 1 (the public key)", f.toks[i].Name, n)
		}
	}
	if n := f.events.count(TombstoneFailed, ""); n != 0 {
		t.Errorf("%d TombstoneFailed events", n)
	}
}

// A destroy the first member refuses with a request error removes nothing:
// the tombstone recorded ahead is revoked, the key stays usable, and a
// later destroy of it counts again.
func TestRefusedDestroyRevokesItsTombstone(t *testing.T) {
	for name, code := range map[string]uint{"CKR_ACTION_PROHIBITED": pkcs11.CKR_ACTION_PROHIBITED, "CKR_SESSION_READ_ONLY": pkcs11.CKR_SESSION_READ_ONLY} {
		t.Run(name, func(t *testing.T) {
			faults := slottest.NewFaults()
			f := setup(t, setupOpts{interceptor: faults, policy: "primary-backup", journal: true})
			s := openSession(t, f.g)
			_, priv := genEC(t, s, "kept")
			id, fp := objectOf(t, f.g, priv)
			ctx := testContext(t)
			faults.FailN(f.toks[0].Name, slot.OpDestroyObject, pkcs11.Error(code), 1)
			if err := f.g.DestroyObject(ctx, priv); CodeOf(err) != code {
				t.Fatalf("refused destroy: %v, want 0x%x", err, code)
			}
			if set := otherProcess(t, f); set.Contains(id, fp) || set.ContainsIdentity(id) {
				t.Fatalf("a refused destroy left a tombstone: %v", set.All())
			}
			if in, err := f.journal.Contains(ctx, id, fp); err != nil || in {
				t.Fatalf("the group's journal: contains %v, %v; want false", in, err)
			}
			for i, n := range holdsLabel(t, f, "kept") {
				if n != 2 {
					t.Errorf("%s holds %d objects labelled kept, want 2", f.toks[i].Name, n)
				}
			}
			if _, err := f.g.Sign(ctx, pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil), priv, make([]byte, 32)); err != nil {
				t.Fatalf("Sign with the key after the refused destroy: %v", err)
			}
			if n := f.events.count(TombstoneFailed, ""); n != 0 {
				t.Errorf("%d TombstoneFailed events", n)
			}
			if err := f.g.DestroyObject(ctx, priv); err != nil {
				t.Fatalf("second destroy: %v", err)
			}
			if set := otherProcess(t, f); !set.Contains(id, fp) {
				t.Fatal("the destroy after a revoked one left no tombstone")
			}
		})
	}
}

// A key made with CKA_DESTROYABLE=false, which the token itself refuses to
// destroy, keeps no tombstone either.
func TestUndestroyableKeyKeepsNoTombstone(t *testing.T) {
	f := setup(t, setupOpts{journal: true})
	s := openSession(t, f.g)
	_, priv := genEC(t, s, "fixed", attr(pkcs11.CKA_DESTROYABLE, false))
	id, fp := objectOf(t, f.g, priv)
	err := f.g.DestroyObject(testContext(t), priv)
	if CodeOf(err) != pkcs11.CKR_ACTION_PROHIBITED {
		t.Fatalf("destroy of a CKA_DESTROYABLE=false key: %v, want CKR_ACTION_PROHIBITED", err)
	}
	if set := otherProcess(t, f); set.Contains(id, fp) {
		t.Fatalf("the refused destroy left a tombstone: %v", set.All())
	}
	for i, n := range holdsLabel(t, f, "fixed") {
		if n != 2 {
			t.Errorf("%s holds %d objects labelled fixed, want 2", f.toks[i].Name, n)
		}
	}
}

// A destroy every member fails for health removes nothing the group knows
// of: its tombstone is revoked, here in the in-memory store.
func TestDestroyFailedEverywhereRevokesItsTombstone(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{interceptor: faults, n: 2})
	s := openSession(t, f.g)
	_, priv := genEC(t, s, "stays")
	id, fp := objectOf(t, f.g, priv)
	for _, tok := range f.toks {
		faults.Fail(tok.Name, slot.OpDestroyObject, errDevice)
	}
	ctx := testContext(t)
	if err := f.g.DestroyObject(ctx, priv); !errors.Is(err, ErrNoMember) {
		t.Fatalf("destroy failing on every member: %v, want ErrNoMember", err)
	}
	set, err := f.tombs.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if set.Contains(id, fp) || len(f.tombs.All()) != 0 {
		t.Fatalf("the failed destroy left a tombstone: %v", f.tombs.All())
	}
}

// failingTombstones is a tombstone store whose disk fails n times.
type failingTombstones struct {
	mu   sync.Mutex
	left int
	mem  tombstone.Memory
}

func (s *failingTombstones) Record(ctx context.Context, t tombstone.Tombstone) error {
	s.mu.Lock()
	fail := s.left > 0
	if fail {
		s.left--
	}
	s.mu.Unlock()
	if fail {
		return errors.New("write tombstones.journal: no space left on device")
	}
	return s.mem.Record(ctx, t)
}

// A tombstone that cannot be recorded ahead does not stop the destroy: it
// is recorded once the destroy is done, and TombstoneFailed reports it
// only when that fails too.
func TestDestroyWhenTombstoneCannotBeRecordedAhead(t *testing.T) {
	f := setup(t, setupOpts{n: 2})
	s := openSession(t, f.g)
	ctx := testContext(t)
	for _, tc := range []struct {
		fails, events int
	}{{1, 0}, {2, 1}} {
		store := &failingTombstones{left: tc.fails}
		f.g.tombstones = store
		label := "disk-" + string(rune('0'+tc.fails))
		_, priv := genEC(t, s, label)
		id, fp := objectOf(t, f.g, priv)
		before := f.events.count(TombstoneFailed, "")
		if err := f.g.DestroyObject(ctx, priv); err != nil {
			t.Fatalf("%d failed records: DestroyObject: %v", tc.fails, err)
		}
		if got := f.events.count(TombstoneFailed, "") - before; got != tc.events {
			t.Errorf("%d failed records: %d TombstoneFailed events, want %d", tc.fails, got, tc.events)
		}
		set, _ := store.mem.Snapshot(ctx)
		if want := tc.events == 0; set.Contains(id, fp) != want {
			t.Errorf("%d failed records: tombstone on record %v, want %v", tc.fails, !want, want)
		}
		for i, n := range holdsLabel(t, f, label) {
			if n != 1 {
				t.Errorf("%s holds %d objects labelled %s, want 1", f.toks[i].Name, n, label)
			}
		}
	}
}
