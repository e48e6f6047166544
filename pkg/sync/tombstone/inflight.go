package tombstone

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"

	"github.com/hagroup/hagroup/internal/filelock"
	"golang.org/x/sys/unix"
)

// Creations in flight (DESIGN.md, "Intents of creations"). An intent
// stands from before its creation is sent until the creation returns, so
// a standing intent alone cannot tell a creation that died from one still
// running in another process of the host, whose local record it shares.
// Taken for dead, a running creation loses its objects: another process
// catching up the member the creation was sent to (a member serving in
// one process may be returning in another) would destroy them there as a
// leftover, and an intent spread to the members would let any host do so.
// So each creation holds its intents while it runs, and a held intent is
// neither acted on (Set.InFlight) nor spread.

// holder is a Local that marks intents held, for every process sharing
// it: the Journal with a lock file per intent, Memory within its process.
type holder interface {
	// Hold marks intent t held until release is called (or its process
	// ends).
	Hold(t Tombstone) (release func(), err error)
	// Held reports whether t's Hold is still in force.
	Held(t Tombstone) bool
}

// holdName is the file that marks intent t held: one per intent, named by
// its identity and time.
func holdName(t Tombstone) string {
	h := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d", intentKey(t.Identity), t.Time.UnixNano()))
	return "creating-" + hex.EncodeToString(h[:12]) + ".lock"
}

// Hold takes the lock file of intent t, which the kernel lets go should
// the process die; release removes the file, then lets go of it.
func (j *Journal) Hold(t Tombstone) (func(), error) {
	f, err := filelock.TryLock(j.path(holdName(t)), j.opts.Perm)
	if err != nil {
		return nil, fmt.Errorf("tombstones of group %s: mark the creation of %s in flight: %w", j.serial, t.Identity, err)
	}
	return func() {
		os.Remove(f.Name())
		f.Close()
	}, nil
}

// Held reports whether a process of the host holds intent t. A lock file
// that nobody holds is a creation whose process died: it is removed. A
// file that cannot be read is taken as held, which errs on the side of
// keeping the objects.
func (j *Journal) Held(t Tombstone) bool {
	p := j.path(holdName(t))
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return false
	}
	if err != nil {
		return true
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return true
	}
	os.Remove(p)
	return false
}

// Hold marks intent t held within this process.
func (m *Memory) Hold(t Tombstone) (func(), error) {
	k := revocationKey(t)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.held == nil {
		m.held = map[string]int{}
	}
	m.held[k]++
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.held[k]--; m.held[k] <= 0 {
			delete(m.held, k)
		}
	}, nil
}

// Held reports whether intent t is held in this process.
func (m *Memory) Held(t Tombstone) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.held[revocationKey(t)] > 0
}

// heldIntent reports whether t is an intent whose creation is in flight:
// the local record l holds it.
func heldIntent(l Local, t Tombstone) bool {
	h, ok := l.(holder)
	return ok && t.Intent && !t.Revoked && h.Held(t)
}

// spreadable returns local without the intents in flight, which no
// member may be given (see above), and those intents apart.
func (s *Shared) spreadable(local []Tombstone) (out, inFlight []Tombstone) {
	for _, t := range local {
		if heldIntent(s.local, t) {
			inFlight = append(inFlight, t)
			continue
		}
		out = append(out, t)
	}
	return out, inFlight
}

// Release lets go of the holds Intend took on ts: the creation returned.
func (s *Shared) Release(ts []Tombstone) {
	s.holdMu.Lock()
	defer s.holdMu.Unlock()
	for _, t := range ts {
		k := revocationKey(t)
		if rel := s.holds[k]; rel != nil {
			rel()
			delete(s.holds, k)
		}
	}
}
