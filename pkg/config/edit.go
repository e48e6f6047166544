package config

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Edit changes the configuration file at path under an exclusive lock: it
// waits (as long as ctx allows) for the lock on path+".lock", loads the
// file (or starts from an empty configuration when there is none), runs fn
// on it, validates the result and replaces the file atomically. When fn or
// validation fails, the file is left as it was. An existing file that does
// not load is not edited: it must be fixed by hand first.
//
// Concurrent Edits, in this process or others, are serialised, so none is
// lost. The file keeps its mode (a new one gets 0600). It is rewritten in
// Encode's layout, its comments kept above (or after) the header or key
// they preceded (or followed), wherever that now is; the comments of a
// removed group, member or key go with it. The lock file stays beside the
// file; an Edit that fails where there was no file removes it again, so a
// failed first edit leaves nothing behind (see lockFile for why that is
// safe against a waiting editor).
func Edit(ctx context.Context, path string, fn func(*Config) error) error {
	return editor{}.edit(ctx, path, fn)
}

// editor runs Edit; its writer carries the test hook.
type editor struct {
	w atomicWriter
}

func (e editor) edit(ctx context.Context, path string, fn func(*Config) error) error {
	if path == "" {
		return errors.New("config: edit: no configuration path given")
	}
	unlock, unlockAndRemove, err := lockFile(ctx, path+".lock")
	if err != nil {
		return fmt.Errorf("config: edit %s: %w", path, err)
	}
	removeStaleTemps(path)
	err = e.editLocked(ctx, path, fn)
	if _, serr := os.Lstat(path); err != nil && errors.Is(serr, fs.ErrNotExist) {
		unlockAndRemove()
	} else {
		unlock()
	}
	return err
}

// editLocked is Edit's work once the lock is held.
func (e editor) editLocked(ctx context.Context, path string, fn func(*Config) error) error {

	perm := os.FileMode(0o600)
	c, err := Load(path)
	switch {
	case errors.Is(err, ErrNoConfig):
		c = &Config{Path: path}
	case err != nil:
		var fe *FieldError
		if errors.As(err, &fe) {
			return fmt.Errorf("config: edit %s: the file is not valid, fix it first:\n%w", path, err)
		}
		return fmt.Errorf("config: edit %s: %w", path, err)
	default:
		if st, err := os.Stat(path); err == nil {
			perm = st.Mode().Perm()
		}
	}
	// The file's comments, by the identity of what they describe, before
	// fn adds, removes or reorders groups and members.
	var kept notes
	if c.src != nil {
		kept = c.src.notes.byIdentity(c)
	}
	if err := fn(c); err != nil {
		return err
	}
	// Positions from the old file no longer match what fn may have moved.
	c.src = nil
	c.Path = path
	c.normalise()
	if err := c.Validate(); err != nil {
		return fmt.Errorf("config: edit %s: the change leaves the configuration invalid:\n%w", path, err)
	}
	data, err := encode(c, kept)
	if err != nil {
		return fmt.Errorf("config: edit %s: %w", path, err)
	}
	if err := e.w.write(path, data, perm); err != nil {
		return fmt.Errorf("config: edit %s: %w", path, err)
	}
	return nil
}

// tempPrefix is the name prefix of path's temporary files: hidden, and
// never matching path itself, so a reader of path never sees one.
func tempPrefix(path string) string { return "." + filepath.Base(path) + ".tmp-" }

// removeStaleTemps removes temporary files that a writer of path left
// behind when it died between creating and renaming one. Only Edit calls
// it, under the lock, when no other writer of path can be at work.
func removeStaleTemps(path string) {
	dir := filepath.Dir(path)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	prefix := tempPrefix(path)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) && e.Type().IsRegular() {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// WriteFileAtomic replaces the file at path with data, so that a reader
// sees either the old content or the new, whole, and a crash leaves one of
// them: it writes a temporary file in the same directory with mode perm,
// syncs it, renames it over path and syncs the directory. On failure the
// temporary file is removed and path is untouched. When path is a symbolic
// link, the file it points to is replaced. When run as root, an existing
// file keeps its owner.
//
// It is the one helper every writer of hagroup files uses.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	return atomicWriter{}.write(path, data, perm)
}

// atomicWriter implements WriteFileAtomic. beforeRename, when set, runs
// after the temporary file is complete and before the rename: tests use it
// to kill a writer at the worst moment.
type atomicWriter struct {
	beforeRename func(tmp string)
}

func (w atomicWriter) write(path string, data []byte, perm os.FileMode) (err error) {
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	var owner *syscall.Stat_t
	if st, err := os.Lstat(path); err == nil {
		if !st.Mode().IsRegular() {
			return fmt.Errorf("write %s: not a regular file but %s", path, fileKind(st.Mode()))
		}
		if sys, ok := st.Sys().(*syscall.Stat_t); ok && os.Geteuid() == 0 {
			owner = sys
		}
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, tempPrefix(path)+"*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(perm.Perm()); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if owner != nil {
		if err := f.Chown(int(owner.Uid), int(owner.Gid)); err != nil {
			return fmt.Errorf("write %s: keep owner: %w", path, err)
		}
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("write %s: sync: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if w.beforeRename != nil {
		w.beforeRename(tmp)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	// The rename is durable only once the directory is synced.
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("write %s: sync directory: %w", path, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("write %s: sync directory: %w", path, err)
	}
	return nil
}
