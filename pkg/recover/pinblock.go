package recover

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hagroup/hagroup/pkg/config"
)

// ErrPINBlocked: the member's token refused the PIN it is logged in with
// (incorrect, locked or expired), so nothing logs it in automatically —
// in any process sharing the state directory — until an operator
// recovers it (Recoverer.Recover clears the mark and tries once).
var ErrPINBlocked = errors.New("PIN refused: automatic login and recovery stopped until an operator recovers the member")

// PINBlock is the mark of a member whose token refused its PIN.
type PINBlock struct {
	Time time.Time `json:"time"`
	// Reason is the refusal (a CKR code and where it happened; never a
	// PIN).
	Reason string `json:"reason"`
	PID    int    `json:"pid"`
}

// PINBlocks holds the PIN marks of one group's members: in
// StateDir/<group serial>/<member>.pinblock, written atomically, so that
// the agent and every application process on the host see one another's
// marks; without a state directory, in this process's memory. It
// implements group.PINGuard. Safe for concurrent use.
type PINBlocks struct {
	dir  string
	perm os.FileMode

	mu  sync.Mutex
	mem map[string]memMark // marks made by this process (all of them without dir)
}

// memMark is a mark this process made; onDisk says its file was written,
// so the file's removal (by another process's Clear) clears it.
type memMark struct {
	PINBlock
	onDisk bool
}

// NewPINBlocks returns the marks of group serial in stateDir ("" keeps
// them in memory); files are created with mode perm (0: 0660).
func NewPINBlocks(stateDir, serial string, perm os.FileMode) (*PINBlocks, error) {
	if perm == 0 {
		perm = 0o660
	}
	b := &PINBlocks{perm: perm, mem: map[string]memMark{}}
	if stateDir != "" {
		if err := checkName("group serial", serial); err != nil {
			return nil, err
		}
		b.dir = filepath.Join(stateDir, serial)
	}
	return b, nil
}

func (b *PINBlocks) path(name string) (string, error) {
	if err := checkName("member name", name); err != nil {
		return "", err
	}
	return filepath.Join(b.dir, name+".pinblock"), nil
}

// Get returns member name's mark. A mark that exists but cannot be read
// counts as a mark: when in doubt, no PIN is offered.
func (b *PINBlocks) Get(name string) (PINBlock, bool) {
	b.mu.Lock()
	mk, ok := b.mem[name]
	b.mu.Unlock()
	if b.dir == "" || (ok && !mk.onDisk) {
		return mk.PINBlock, ok
	}
	p, err := b.path(name)
	if err != nil {
		return PINBlock{Reason: err.Error()}, true
	}
	data, err := os.ReadFile(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return PINBlock{}, false // never marked, or cleared by any process
	case err != nil:
		return PINBlock{Reason: fmt.Sprintf("mark %s unreadable: %v", p, err)}, true
	}
	var disk PINBlock
	if err := json.Unmarshal(data, &disk); err != nil {
		return PINBlock{Reason: fmt.Sprintf("mark %s unreadable: %v", p, err)}, true
	}
	return disk, true
}

// Mark records that member name's token refused its PIN with reason.
// The mark is kept in memory even when the file cannot be written, so
// that this process at least stops.
func (b *PINBlocks) Mark(name string, reason error) error {
	mk := PINBlock{Time: time.Now().UTC(), Reason: reason.Error(), PID: os.Getpid()}
	err := b.write(name, mk)
	b.mu.Lock()
	b.mem[name] = memMark{PINBlock: mk, onDisk: b.dir != "" && err == nil}
	b.mu.Unlock()
	return err
}

func (b *PINBlocks) write(name string, mk PINBlock) error {
	if b.dir == "" {
		return nil
	}
	p, err := b.path(name)
	if err != nil {
		return err
	}
	data, err := json.Marshal(mk)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(b.dir, b.perm|(b.perm&0o444)>>2); err != nil {
		return fmt.Errorf("PIN mark of member %s: %w", name, err)
	}
	if err := config.WriteFileAtomic(p, append(data, '\n'), b.perm); err != nil {
		return fmt.Errorf("PIN mark of member %s: %w", name, err)
	}
	return nil
}

// Clear removes member name's mark.
func (b *PINBlocks) Clear(name string) error {
	b.mu.Lock()
	delete(b.mem, name)
	b.mu.Unlock()
	if b.dir == "" {
		return nil
	}
	p, err := b.path(name)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("clear the PIN mark of member %s: %w", name, err)
	}
	return nil
}

// Blocked implements group.PINGuard: the mark as an error wrapping
// ErrPINBlocked, or nil.
func (b *PINBlocks) Blocked(name string) error {
	mk, ok := b.Get(name)
	if !ok {
		return nil
	}
	return mk.err(name)
}

// Refused implements group.PINGuard: it marks member name.
func (b *PINBlocks) Refused(name string, err error) {
	b.Mark(name, err) // an unwritable mark still holds in memory
}

func (mk PINBlock) err(name string) error {
	if mk.Time.IsZero() {
		return fmt.Errorf("member %s: %w (%s)", name, ErrPINBlocked, mk.Reason)
	}
	return fmt.Errorf("member %s: %w (refused %s: %s)", name, ErrPINBlocked, mk.Time.Format(time.RFC3339), mk.Reason)
}
