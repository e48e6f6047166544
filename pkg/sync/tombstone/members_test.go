package tombstone

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/hagroup/hagroup/pkg/sync/state"
	"github.com/miekg/pkcs11"
)

// memoryLocal is a Local kept in memory, as a process without a state
// directory keeps its tombstones.
type memoryLocal struct {
	mu  sync.Mutex
	all []Tombstone
}

func (m *memoryLocal) Record(_ context.Context, t Tombstone) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.all = append(m.all, t)
	return nil
}

func (m *memoryLocal) Revive(context.Context, object.Identity, []byte) (int, error) { return 0, nil }

func (m *memoryLocal) Records(context.Context) ([]Tombstone, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Tombstone(nil), m.all...), nil
}

func openTokens(tb testing.TB, n int) []*slot.Slot {
	tb.Helper()
	var out []*slot.Slot
	for _, tok := range testhsm.Take(tb, n) {
		s, err := slot.Open(context.Background(), slot.Spec{Name: tok.Name, Module: tok.Module, ModuleEnv: tok.ModuleEnv,
			TokenLabel: tok.Label, PIN: secret.PINFromString(tok.UserPIN), CommandTimeout: 20 * time.Second})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { s.Close() })
		out = append(out, s)
	}
	return out
}

func shared(tb testing.TB, serial string, slots []*slot.Slot) *Shared {
	sh := NewShared(&memoryLocal{}, serial, SharedOptions{OnError: func(m string, err error) { tb.Errorf("member %s: %v", m, err) }})
	sh.SetMembers(func(bool) []*slot.Slot { return slots })
	return sh
}

func TestRecordsRoundTrip(t *testing.T) {
	now := time.Unix(1700000000, 123456789)
	in := []Tombstone{
		{Identity: object.Identity{Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_EC, ID: []byte{1, 2}, Label: "k"}, Fingerprint: []byte{9, 9}, Time: now, GroupSerial: "7"},
		{Identity: object.Identity{Class: pkcs11.CKO_DATA, KeyType: object.NoKeyType, Label: "d"}, Time: now.Add(time.Second), GroupSerial: "7"},
		{Identity: object.Identity{Class: pkcs11.CKO_SECRET_KEY, KeyType: pkcs11.CKK_AES, ID: []byte{}, Label: ""}, Fingerprint: []byte{}, Time: now, GroupSerial: "7", Revoked: true},
	}
	b := encodeRecords(in)
	out, err := decodeRecords(b, "7")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(out) != fmt.Sprint(in) || (out[1].Fingerprint != nil) || out[2].Fingerprint == nil {
		t.Errorf("decoded %v, want %v", out, in)
	}
	for _, torn := range [][]byte{b[:len(b)-1], append(append([]byte(nil), b[:10]...), b[11:]...), []byte("HGT1")} {
		if _, err := decodeRecords(torn, "7"); err == nil {
			t.Errorf("a torn object (%d of %d bytes) decoded", len(torn), len(b))
		}
	}
}

// A public object under the tombstone label — anyone can make one without
// the PIN — is no tombstone: honouring it would let an outsider delete a
// live key on every member.
func TestPublicObjectIsNoTombstone(t *testing.T) {
	ctx := context.Background()
	slots := openTokens(t, 1)
	forged := []Tombstone{{Identity: object.Identity{Class: pkcs11.CKO_DATA, KeyType: object.NoKeyType, Label: "victim"}, Time: time.Now(), GroupSerial: "55"}}
	if _, err := slots[0].CreateObject(ctx, []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
		pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, false), pkcs11.NewAttribute(pkcs11.CKA_LABEL, state.Label("55", StateKind)),
		pkcs11.NewAttribute(pkcs11.CKA_VALUE, encodeRecords(forged)),
	}); err != nil {
		t.Fatal(err)
	}
	set, err := shared(t, "55", slots).Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if set.Len() != 0 {
		t.Errorf("a public object counted as tombstones: %v", set.All())
	}
}

// Many writers at once on the same tokens, each with its own local
// record: every record ends on every token.
func TestSharedWritersLoseNothing(t *testing.T) {
	ctx := context.Background()
	slots := openTokens(t, 2)
	const writers, each = 4, 6
	var wg sync.WaitGroup
	for w := range writers {
		sh := shared(t, "56", slots)
		wg.Go(func() {
			for i := range each {
				if err := sh.Record(ctx, tomb(fmt.Sprintf("w%d-%d", w, i), []byte{byte(w), byte(i)})); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	for _, s := range slots {
		set, err := shared(t, "56", []*slot.Slot{s}).Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if set.Len() != writers*each {
			t.Errorf("%s holds %d tombstones, want %d", s.Name(), set.Len(), writers*each)
		}
	}
}

// BenchmarkRecordOnMembers is the cost of recording one destroy: in the host's
// journal alone (as before tombstones lived on the members), and in the
// journal and on three SoftHSM members already holding n tombstones.
func BenchmarkRecordOnMembers(b *testing.B) {
	ctx := context.Background()
	for _, n := range []int{0, 1000} {
		slots := openTokens(b, 3)
		serial := fmt.Sprintf("%d", 900+n)
		seed := make([]Tombstone, n)
		for i := range seed {
			seed[i] = tomb(fmt.Sprintf("seed-%d", i), make([]byte, 32))
			seed[i].Identity.ID = make([]byte, 16)
		}
		if n > 0 {
			for _, s := range slots {
				if _, err := state.Write(ctx, s, state.Label(serial, StateKind), Application, encodeRecords(seed), nil); err != nil {
					b.Fatal(err)
				}
			}
		}
		for _, where := range []string{"journal", "journal+3-members"} {
			b.Run(fmt.Sprintf("existing=%d/where=%s", n, where), func(b *testing.B) {
				j, err := Open(b.TempDir(), serial, Options{})
				if err != nil {
					b.Fatal(err)
				}
				defer j.Close()
				var rec interface {
					Record(context.Context, Tombstone) error
				} = j
				if where != "journal" {
					sh := NewShared(j, serial, SharedOptions{OnError: func(m string, err error) { b.Error(m, err) }})
					sh.SetMembers(func(bool) []*slot.Slot { return slots })
					rec = sh
				}
				i := 0
				for b.Loop() {
					i++
					t := tomb(fmt.Sprintf("%s-%d", where, i), make([]byte, 32))
					t.Identity.ID = make([]byte, 16)
					if err := rec.Record(ctx, t); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
