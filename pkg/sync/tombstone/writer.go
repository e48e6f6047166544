package tombstone

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/hagroup/hagroup/internal/filelock"
	"golang.org/x/sys/unix"
)

// WriterName is the file holding the id of the host's tombstone
// registers on the members (register.go), shared by every process using
// the journal.
const WriterName = "tombstones.writer"

var _ Writer = (*Journal)(nil)

// WriterID returns the id of this journal's registers, made on first use.
func (j *Journal) WriterID(ctx context.Context) (string, error) {
	if id, err := j.readWriterID(); id != "" || err != nil {
		return id, err
	}
	unlock, err := j.lock(ctx, unix.LOCK_EX)
	if err != nil {
		return "", err
	}
	defer unlock()
	if id, err := j.readWriterID(); id != "" || err != nil {
		return id, err
	}
	id := newWriterID()
	if err := writeFileAtomic(j.path(WriterName), []byte(id+"\n"), j.opts.Perm); err != nil {
		return "", fmt.Errorf("tombstones of group %s: %w", j.serial, err)
	}
	return id, nil
}

// readWriterID returns the id in WriterName, "" when there is none yet.
func (j *Journal) readWriterID() (string, error) {
	b, err := os.ReadFile(j.path(WriterName))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("tombstones of group %s: %w", j.serial, err)
	}
	id := strings.TrimSpace(string(b))
	if _, err := hex.DecodeString(id); err != nil || id == "" {
		return "", fmt.Errorf("tombstones of group %s: %s: not a register id (hex): %q", j.serial, j.path(WriterName), id)
	}
	return id, nil
}

// LockRegister takes the host-wide lock of the register on member.
func (j *Journal) LockRegister(ctx context.Context, member string) (func(), error) {
	sum := sha256.Sum256([]byte(member))
	f, err := filelock.Lock(ctx, j.path("tombstones.register-"+hex.EncodeToString(sum[:6])+".lock"), j.opts.Perm)
	if err != nil {
		return nil, fmt.Errorf("tombstones of group %s: lock the register of member %s: %w", j.serial, member, err)
	}
	return func() { f.Close() }, nil
}
