package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/config"
)

// A group's unresolved tombstone stall is kept in the agent's state
// directory as well as in memory, so that an agent restarted or reloaded
// before a synchronisation resolved it still shows it (listgroups, exit 3;
// synchronize --check, exit 3).

// stallFile is where g's unresolved stall is kept.
func (d *Daemon) stallFile(g config.Group) string {
	return filepath.Join(d.agent.StateDir, g.Serial, "tombstone-stall.json")
}

// loadStall returns the stall kept for g, nil when none is. A kept record
// that cannot be read stands as a stall, its detail saying why: only a
// synchronisation clears it, never a damaged file.
func (d *Daemon) loadStall(g config.Group) *agent.TombstoneStall {
	path := d.stallFile(g)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	var st agent.TombstoneStall
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	if err != nil {
		d.log.Error("read the kept tombstone stall", "group", g.Label, "file", path, "error", err)
		return &agent.TombstoneStall{Time: time.Now(), Detail: fmt.Sprintf("the kept record of an unresolved stall (%s) cannot be read: %v", path, err)}
	}
	return &st
}

// keepStall writes st as g's unresolved stall, or removes the kept one
// when st is nil. A failure is logged: the stall stays in memory.
func (d *Daemon) keepStall(g config.Group, st *agent.TombstoneStall) {
	path := d.stallFile(g)
	if st == nil {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			d.log.Error("remove the resolved tombstone stall", "group", g.Label, "file", path, "error", err)
		}
		return
	}
	b, err := json.Marshal(st)
	if err == nil {
		err = os.MkdirAll(filepath.Dir(path), 0o700)
	}
	if err == nil {
		err = config.WriteFileAtomic(path, b, 0o600)
	}
	if err != nil {
		d.log.Error("keep the tombstone stall across restarts", "group", g.Label, "file", path, "error", err)
	}
}
