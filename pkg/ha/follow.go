package ha

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/hagroup/hagroup/pkg/config"
)

// DefaultFollowEvery is how often FollowConfig looks at the configuration
// file: one stat, which is all a process pays while nothing changes.
const DefaultFollowEvery = time.Second

// FollowOptions tune FollowConfig.
type FollowOptions struct {
	// Every is the period of the file check (DefaultFollowEvery when 0).
	Every time.Duration
	// Applied, when set, is told of every change seen: the group's label,
	// the lines Update returned, or the reason the change was not applied
	// (a file that does not load or validate, a group gone from it, a
	// change that needs the process restarted: ErrReopen). It is called
	// on FollowConfig's goroutine.
	Applied func(group string, lines []string, err error)
}

// FollowConfig makes the groups follow the configuration file at path
// without a restart, as haagent does on SIGHUP: when the file changes
// (its inode, size or modification time, checked every opts.Every; an
// editor's atomic rename is a new inode), it is loaded and each group is
// brought to its new configuration by Update — members added (caught up
// before they take work), removed (after their work in flight), moved to
// or from standby, the policy and recovery settings. The same Update is
// what the agent's reload runs, so every process applies a change the
// same way. A file that does not load keeps the running configuration.
// Changes Update cannot make in place (serial, timeouts) are reported
// (ErrReopen) and wait for a restart; so do groups added to the file.
//
// It runs until ctx ends or the returned stop is called; stop waits for
// the goroutine to end.
func FollowConfig(ctx context.Context, path string, groups []*Group, opts FollowOptions) (stop func()) {
	every := opts.Every
	if every <= 0 {
		every = DefaultFollowEvery
	}
	seen, _ := stamp(path)
	return periodically(ctx, every, func(ctx context.Context) {
		now, err := stamp(path)
		if err != nil || now == seen {
			return // a file being replaced is looked at again next time
		}
		seen = now
		applyConfig(ctx, path, groups, opts.Applied)
	})
}

// fileStamp is what tells FollowConfig that the file changed.
type fileStamp struct {
	dev, ino uint64
	size     int64
	mtime    time.Time
}

func stamp(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	st := fileStamp{size: fi.Size(), mtime: fi.ModTime()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.dev, st.ino = uint64(sys.Dev), sys.Ino
	}
	return st, nil
}

// applyConfig loads path and updates every group from it.
func applyConfig(ctx context.Context, path string, groups []*Group, report func(string, []string, error)) {
	if report == nil {
		report = func(string, []string, error) {}
	}
	cfg, err := config.Load(path)
	if err != nil {
		for _, h := range groups {
			report(h.g.Label(), nil, fmt.Errorf("configuration not applied, the running one is kept: %w", err))
		}
		return
	}
	for _, h := range groups {
		g, ok := cfg.Group(h.g.Label())
		if !ok {
			report(h.g.Label(), nil, fmt.Errorf("group %q is no longer in %s: it keeps running until the process restarts: %w", h.g.Label(), path, ErrReopen))
			continue
		}
		lines, err := h.Update(ctx, *g, cfg.Settings(g))
		if err != nil && !errors.Is(err, ErrReopen) {
			err = fmt.Errorf("group %q: apply %s: %w", h.g.Label(), path, err)
		}
		if err != nil || len(lines) > 0 {
			report(h.g.Label(), lines, err)
		}
	}
}
