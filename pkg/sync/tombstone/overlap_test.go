package tombstone

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
)

// created closes its channel once a CreateObject has returned on the
// token: a tombstone object was written there.
type created struct {
	once sync.Once
	done chan struct{}
}

func (c *created) Before(context.Context, string, slot.Op) error { return nil }

func (c *created) Wrap(_ context.Context, _ string, op slot.Op, call func() error) error {
	err := call()
	if op == slot.OpCreateObject && err == nil {
		c.once.Do(func() { close(c.done) })
	}
	return err
}

// gatedLocal is a Local whose Record waits for gate (a slow fsync) and
// then fails with fail, if set.
type gatedLocal struct {
	memoryLocal
	gate <-chan struct{}
	fail error
}

func (g *gatedLocal) Record(ctx context.Context, t Tombstone) error {
	if g.gate != nil {
		select {
		case <-g.gate:
		case <-time.After(20 * time.Second):
			return errors.New("the members were not written while the local record was")
		}
	}
	if g.fail != nil {
		return g.fail
	}
	return g.memoryLocal.Record(ctx, t)
}

// A destroy's tombstone is written to the members while the local record
// is being written (the journal's fsync), not after it: the local write
// here returns only once a member holds the tombstone object.
func TestMembersAreWrittenWithTheLocalRecord(t *testing.T) {
	ctx := context.Background()
	tok := testhsm.Take(t, 1)[0]
	seen := &created{done: make(chan struct{})}
	s, err := slot.Open(ctx, slot.Spec{Name: tok.Name, Module: tok.Module, ModuleEnv: tok.ModuleEnv, TokenLabel: tok.Label,
		PIN: secret.PINFromString(tok.UserPIN), CommandTimeout: 20 * time.Second, Interceptor: seen})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	local := &gatedLocal{gate: seen.done}
	sh := NewShared(local, "61", SharedOptions{OnError: func(m string, err error) { t.Errorf("member %s: %v", m, err) }})
	sh.SetMembers(func(bool) []*slot.Slot { return []*slot.Slot{s} })
	want := tomb("overlap", []byte{1})
	if err := sh.Record(ctx, want); err != nil {
		t.Fatal(err)
	}
	if rs, _ := local.Records(ctx); len(rs) != 1 {
		t.Errorf("the local record holds %d records, want the tombstone", len(rs))
	}
	set, err := shared(t, "61", []*slot.Slot{s}).Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !set.Contains(want.Identity, want.Fingerprint) {
		t.Errorf("the member does not hold the tombstone: %v", set.All())
	}
}

// A tombstone the local record refused is not left standing on the
// members: the caller takes it as not recorded and would never revoke it
// should its destroy not happen, and a catch-up would then delete a live
// object on every member.
func TestLocalFailureLeavesNoTombstoneOnTheMembers(t *testing.T) {
	ctx := context.Background()
	slots := openTokens(t, 2)
	refused := errors.New("disk full")
	sh := NewShared(&gatedLocal{fail: refused}, "62", SharedOptions{OnError: func(m string, err error) { t.Errorf("member %s: %v", m, err) }})
	sh.SetMembers(func(bool) []*slot.Slot { return slots })
	if err := sh.Record(ctx, tomb("refused", []byte{2})); !errors.Is(err, refused) {
		t.Fatalf("Record = %v, want the local record's error", err)
	}
	for _, s := range slots {
		set, err := shared(t, "62", []*slot.Slot{s}).Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if set.Len() != 0 {
			t.Errorf("%s holds a standing tombstone the local record refused: %v", s.Name(), set.All())
		}
	}
}
