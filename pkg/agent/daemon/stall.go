package daemon

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/hagroup/hagroup/pkg/agent"
)

// A group's unresolved tombstone stall outlives the agent and its
// reloads: it is kept in the state directory until a synchronisation
// resolves it. Forgotten at a restart, it would let `synchronize --check`
// pass while a stalled writer's lost records may still be missing.

// stallPath is where group's unresolved stall is kept (the label hex-coded:
// a label may hold any character).
func (d *Daemon) stallPath(group string) string {
	return filepath.Join(d.agent.StateDir, "tombstone-stalls", hex.EncodeToString([]byte(group))+".json")
}

// keepStall writes group's unresolved stall, or removes it (st nil). The
// write is whole or absent: a temporary file renamed over the last.
func (d *Daemon) keepStall(group string, st *agent.TombstoneStall) error {
	path := d.stallPath(group)
	if st == nil {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("forget the tombstone stall of group %q: %w", group, err)
		}
		return nil
	}
	body, err := json.Marshal(st)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("keep the tombstone stall of group %q: %w", group, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".stall-*")
	if err != nil {
		return fmt.Errorf("keep the tombstone stall of group %q: %w", group, err)
	}
	defer os.Remove(tmp.Name()) // gone after the rename; left only on failure
	_, err = tmp.Write(body)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("keep the tombstone stall of group %q in %s: %w", group, path, err)
	}
	return nil
}

// keptStall returns group's stall kept by an earlier run, or nil. A record
// that cannot be read is a stall still: it was written because one
// happened, and only a synchronisation may end it.
func (d *Daemon) keptStall(group string) *agent.TombstoneStall {
	path := d.stallPath(group)
	body, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	var st agent.TombstoneStall
	if err == nil {
		err = json.Unmarshal(body, &st)
	}
	if err != nil {
		return &agent.TombstoneStall{Detail: fmt.Sprintf("the record of an earlier stall (%s) cannot be read: %v", path, err)}
	}
	return &st
}
