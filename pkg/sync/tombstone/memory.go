package tombstone

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/hagroup/hagroup/pkg/sync/object"
)

// Memory keeps tombstones in memory for the life of a process: the
// default of pkg/group, for tests and programs without a state directory.
// Safe for concurrent use.
type Memory struct {
	mu   sync.Mutex
	all  []Tombstone
	held map[string]int // intents held (inflight.go), by revocationKey
}

// Record keeps t (a tombstone or a revocation).
func (m *Memory) Record(_ context.Context, t Tombstone) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.all = append(m.all, t)
	return nil
}

// Revive revokes every tombstone of id + fingerprint not yet revoked
// (see pkg/group's Reviver) and returns how many; a nil fingerprint
// revives nothing.
func (m *Memory) Revive(_ context.Context, id object.Identity, fingerprint []byte) (int, error) {
	if fingerprint == nil {
		return 0, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	revoked := m.revokedLocked()
	n := 0
	for _, t := range m.all {
		if t.Revoked || revoked[revocationKey(t)] || !t.Identity.Equal(id) || !bytes.Equal(t.Fingerprint, fingerprint) {
			continue
		}
		m.all = append(m.all, t.Revocation())
		revoked[revocationKey(t)] = true
		n++
	}
	return n, nil
}

// revokedLocked returns the revocation keys of the tombstones revoked so
// far. m.mu must be held.
func (m *Memory) revokedLocked() map[string]bool {
	revoked := map[string]bool{}
	for _, t := range m.all {
		if t.Revoked {
			revoked[revocationKey(t)] = true
		}
	}
	return revoked
}

// Snapshot returns the tombstones recorded so far and not revoked as a
// set, for planning (pkg/recover's TombstoneSource).
func (m *Memory) Snapshot(context.Context) (*Set, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return NewSet(m.all...), nil
}

// Records returns every record kept, tombstones and revocations, for
// Shared to spread to the members.
func (m *Memory) Records(context.Context) ([]Tombstone, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.all), nil
}

// All returns the tombstones recorded so far and not revoked, in the
// order they were recorded; revocations are not listed.
func (m *Memory) All() []Tombstone {
	m.mu.Lock()
	defer m.mu.Unlock()
	revoked := m.revokedLocked()
	out := make([]Tombstone, 0, len(m.all))
	for _, t := range m.all {
		if !t.Revoked && !revoked[revocationKey(t)] {
			out = append(out, t)
		}
	}
	return out
}

// revocationKey names the tombstone a revocation cancels: identity,
// fingerprint and time.
func revocationKey(t Tombstone) string {
	return fmt.Sprintf("%s\x00%x\x00%d", t.Identity.Key(), t.Fingerprint, t.Time.UnixNano())
}
