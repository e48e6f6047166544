// Package tombstone keeps the record of objects destroyed through an HA
// group, so that a member that was down while an object was destroyed does
// not bring it back when it returns (DESIGN.md, "Deletion survives
// outages").
//
// The record lives in state_dir/<group serial>/, in the spirit of a
// registry kept as a checkpoint plus incremental files:
//
//	tombstones.journal     append-only JSON lines, one per destroy (and one
//	                       per revocation, see below), each written with
//	                       O_APPEND and fsync'd before Record returns
//	tombstones.checkpoint  the compacted set (JSON), replaced atomically
//	                       (temp file, fsync, rename, fsync of the directory)
//	tombstones.lock        flock: shared while reading, exclusive while
//	                       appending or compacting
//
// The files are shared by the agent and every application process on the
// host: writers serialise on the exclusive lock, and a reader holding the
// shared lock always sees a checkpoint and a journal that belong together.
// A crash can leave at most a torn last journal line; readers ignore it and
// the next writer cuts it off before appending.
//
// That journal is this host's write-ahead record and cache. The group's
// truth is on the members: Shared (members.go) spreads every record to
// them and plans with the union of the journal and every member reached,
// so processes on other hosts honour the destroy too.
//
// # Write-ahead and revocation
//
// The group records a tombstone before it destroys the object on the
// first member, so that no process can list the members between the
// destroy and its record and take the object, gone from the member that
// served it but still on one that was away, for one to copy back. When
// the destroy then does not happen (the member refuses it, no member
// holds the object, every member fails), the group revokes the
// tombstone: it records the same Identity, Fingerprint and Time again
// with Revoked set (a journal line with "revoked":true). A revocation
// cancels exactly the tombstone it names, never another one under the
// same identity and fingerprint, such as the tombstone of another
// process that did destroy the object; a later tombstone of the same
// object (recorded with a later time) counts again. Contains, Snapshot
// and NewSet treat a revoked tombstone as absent, and compaction drops
// it together with its revocation.
//
// An object made again through the group with the identity and
// fingerprint of one destroyed before revives: Journal.Revive revokes
// every tombstone of that version that still counts, since a plan
// deletes a tombstoned version wherever it remains, even on every member.
//
// Binaries from before revocations refuse a journal holding a revocation
// line (an unknown field), reporting the journal's file and line, rather
// than taking it for a tombstone and deleting a live object; a
// compaction by a newer binary folds such lines away.
//
// # Horizon
//
// A tombstone older than the horizon (default 90 days, config key
// tombstone_horizon) no longer counts: Contains ignores it and compaction
// drops it. A member that stays away longer than the horizon and then
// returns can therefore bring back an object destroyed more than a horizon
// ago; remove such a member and add it back as a new, empty member instead
// of recovering it.
package tombstone

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hagroup/hagroup/internal/filelock"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"golang.org/x/sys/unix"
)

// File names inside the group's state directory.
const (
	JournalName    = "tombstones.journal"
	CheckpointName = "tombstones.checkpoint"
	LockName       = "tombstones.lock"
)

// DefaultHorizon is how long a tombstone counts when Options.Horizon is 0:
// 90 days.
const DefaultHorizon = 90 * 24 * time.Hour

// DefaultCompactBytes is the journal size past which Record folds the
// journal into the checkpoint.
const DefaultCompactBytes = 4 << 20

// checkpointVersion is the format version written into every checkpoint.
const checkpointVersion = 1

// Tombstone records that an object was destroyed through the group (or,
// recorded ahead of the destroy, is about to be).
type Tombstone struct {
	Identity    object.Identity
	Fingerprint []byte // of the destroyed object; nil when it had none
	Time        time.Time
	GroupSerial string
	// Revoked marks a revocation: the destroy recorded ahead by the
	// tombstone with the same Identity, Fingerprint and Time did not
	// happen, and that tombstone no longer counts. A revocation needs
	// the Time of the tombstone it revokes.
	Revoked bool
	// Intent marks the write-ahead record of a creation sent to a member
	// (Fingerprint nil: the object does not exist yet). The group revokes
	// it when the member answers; one left standing means a creation that
	// was never answered, which may have left an object on that member
	// that the group never made. It matches every version of its
	// identity, but only where one member being caught up holds that
	// version and no other member does (Set.Unanswered, pkg/sync's
	// plan): such an object is destroyed there, not spread; never while
	// its creation runs (inflight.go). It never counts as a destroy
	// (Contains, ContainsIdentity).
	Intent bool
}

// Revocation returns the record that revokes t.
func (t Tombstone) Revocation() Tombstone {
	r := t
	r.Revoked = true
	return r
}

// String describes the tombstone for messages.
func (t Tombstone) String() string {
	what := "destroyed"
	if t.Revoked {
		what = "revoked destroy of"
	}
	return fmt.Sprintf("%s fingerprint=%s %s %s", t.Identity, object.FormatFingerprint(t.Fingerprint), what,
		t.Time.UTC().Format(time.RFC3339Nano))
}

// key is the map key of a tombstone: identity and fingerprint.
func key(id object.Identity, fp []byte) string {
	return id.Key() + "\x00" + string(fp)
}

// keyOf is the map key of record t: an intent has its own, so that it is
// never taken for a destroy of its identity.
func keyOf(t Tombstone) string {
	if t.Intent {
		return key(t.Identity, nil) + "\x00intent"
	}
	return key(t.Identity, t.Fingerprint)
}

// records holds the tombstones and revocations of one identity and
// fingerprint, by time (Time.UnixNano): a revocation cancels the
// tombstone of its own time only.
type records map[int64]Tombstone

// add merges t: a revocation wins over its tombstone, whichever is read
// first.
func (r records) add(t Tombstone) {
	n := t.Time.UnixNano()
	if old, ok := r[n]; ok && old.Revoked {
		return
	}
	r[n] = t
}

// latest returns the latest tombstone not revoked and not older than
// cutoff (zero: no cutoff).
func (r records) latest(cutoff time.Time) (Tombstone, bool) {
	var best Tombstone
	found := false
	for _, t := range r {
		if t.Revoked || t.Time.Before(cutoff) {
			continue
		}
		if !found || t.Time.After(best.Time) {
			best, found = t, true
		}
	}
	return best, found
}

// Options tune a Journal. The zero value is the production setting.
type Options struct {
	// Horizon is how long a tombstone counts; 0 means DefaultHorizon.
	Horizon time.Duration
	// CompactBytes is the journal size past which Record compacts; 0
	// means DefaultCompactBytes, a negative value never compacts
	// automatically.
	CompactBytes int64
	// Perm is the mode of the files created (the directory gets the same
	// bits plus search permission); 0 means 0660, so that the agent and
	// application processes of one group can share them.
	Perm os.FileMode
	// Now returns the current time; nil means time.Now. Tests inject a
	// clock to age tombstones without waiting.
	Now func() time.Time
}

// Journal is the tombstone record of one group on this host. Safe for
// concurrent use by goroutines; other processes coordinate through the lock
// file.
type Journal struct {
	dir    string
	serial string
	opts   Options

	mu      sync.Mutex
	entries map[string]records // checkpoint + journal as last read, by key()
	ckpt    *os.File           // checkpoint last loaded, kept open so its inode is not reused
	offset  int64              // journal bytes consumed
	line    int                // journal lines consumed, for error messages
	closed  bool
}

// Open opens (creating when needed) the tombstone record of the group with
// serial groupSerial under stateDir. It reads nothing yet; the first read
// loads the checkpoint and the journal.
func Open(stateDir, groupSerial string, opts Options) (*Journal, error) {
	if err := checkSerial(groupSerial); err != nil {
		return nil, err
	}
	if stateDir == "" {
		return nil, errors.New("tombstones: empty state directory")
	}
	if opts.Horizon < 0 {
		return nil, fmt.Errorf("tombstones of group %s: negative horizon %v", groupSerial, opts.Horizon)
	}
	if opts.Horizon == 0 {
		opts.Horizon = DefaultHorizon
	}
	if opts.CompactBytes == 0 {
		opts.CompactBytes = DefaultCompactBytes
	}
	if opts.Perm == 0 {
		opts.Perm = 0o660
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	dir := filepath.Join(stateDir, groupSerial)
	if err := mkdirShared(dir, opts.Perm); err != nil {
		return nil, fmt.Errorf("tombstones of group %s: %w", groupSerial, err)
	}
	return &Journal{dir: dir, serial: groupSerial, opts: opts, entries: map[string]records{}}, nil
}

// checkSerial refuses a group serial that cannot name a directory.
func checkSerial(s string) error {
	if s == "" || s == "." || s == ".." || strings.ContainsAny(s, "/\x00") {
		return fmt.Errorf("tombstones: group serial %q cannot name a state directory", s)
	}
	return nil
}

// mkdirShared creates dir (and parents) and gives a newly made leaf the
// directory form of perm.
func mkdirShared(dir string, perm os.FileMode) error {
	dperm := perm | (perm&0o444)>>2 // search wherever read is allowed
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := os.MkdirAll(dir, dperm); err != nil {
		return err
	}
	return os.Chmod(dir, dperm)
}

// Dir returns the group's state directory.
func (j *Journal) Dir() string { return j.dir }

// Horizon returns how long a tombstone counts.
func (j *Journal) Horizon() time.Duration { return j.opts.Horizon }

func (j *Journal) path(name string) string { return filepath.Join(j.dir, name) }

// lock takes the lock file in mode how and returns its release; a closed
// journal refuses. j.mu must be held.
func (j *Journal) lock(ctx context.Context, how int) (func(), error) {
	if j.closed {
		return nil, fmt.Errorf("tombstones of group %s: journal closed", j.serial)
	}
	var f *os.File
	var err error
	if how == unix.LOCK_SH {
		f, err = filelock.LockShared(ctx, j.path(LockName), j.opts.Perm)
	} else {
		f, err = filelock.Lock(ctx, j.path(LockName), j.opts.Perm)
	}
	if err != nil {
		return nil, fmt.Errorf("tombstones of group %s: %w", j.serial, err)
	}
	return func() { f.Close() }, nil
}

// Record appends t to the journal and returns once it is on disk. A zero
// t.Time is set to now; an empty t.GroupSerial to the journal's group. A
// revocation (t.Revoked; see Tombstone.Revocation) must carry the Time of
// the tombstone it revokes.
// When the journal has grown past Options.CompactBytes it is folded into
// the checkpoint in the same step; a failure of that compaction does not
// fail Record (the tombstone is safely in the journal) and is reported by
// the next Compact.
func (j *Journal) Record(ctx context.Context, t Tombstone) error {
	if t.GroupSerial == "" {
		t.GroupSerial = j.serial
	}
	if t.GroupSerial != j.serial {
		return fmt.Errorf("tombstones of group %s: tombstone for %s names group %s", j.serial, t.Identity, t.GroupSerial)
	}
	if t.Time.IsZero() {
		if t.Revoked {
			return fmt.Errorf("tombstones of group %s: revocation for %s names no tombstone time", j.serial, t.Identity)
		}
		t.Time = j.opts.Now()
	}
	line, err := json.Marshal(toWire(t))
	if err != nil {
		return fmt.Errorf("tombstones of group %s: encode %s: %w", j.serial, t.Identity, err)
	}
	line = append(line, '\n')

	j.mu.Lock()
	defer j.mu.Unlock()
	unlock, err := j.lock(ctx, unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	size, err := j.appendLocked(line)
	if err != nil {
		return fmt.Errorf("tombstones of group %s: record %s in %s: %w", j.serial, t.Identity, j.path(JournalName), err)
	}
	if j.opts.CompactBytes > 0 && size > j.opts.CompactBytes {
		_, _ = j.compactLocked() // the tombstone is durable either way; see the doc comment
	}
	return nil
}

// Revive revokes every tombstone of the version id + fingerprint that
// still counts (within the horizon, not revoked), and returns how many it
// revoked. The group calls it when it makes that version again (a public
// key or certificate imported again, a key unwrapped again from the same
// blob): the destroy is then over, and a plan must not delete the new
// object on the old tombstone's account. Revoking every one, not just the
// latest, matters: an older tombstone of the version would count again
// once the latest is revoked. Nothing is written when none counts; the
// revocations, when there are any, are on disk before Revive returns. A
// nil fingerprint revives nothing (a fingerprint-less object is matched by
// identity, and an identity may have been destroyed with other
// material).
func (j *Journal) Revive(ctx context.Context, id object.Identity, fingerprint []byte) (int, error) {
	if fingerprint == nil {
		return 0, nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	// A shared lock first: the usual case (nothing to revoke) writes
	// nothing and should not keep every other reader out.
	if n, err := j.liveLocked(ctx, id, fingerprint, unix.LOCK_SH); err != nil || n == 0 {
		return 0, err
	}
	unlock, err := j.lock(ctx, unix.LOCK_EX)
	if err != nil {
		return 0, err
	}
	defer unlock()
	if err := j.refreshLocked(); err != nil {
		return 0, err
	}
	var lines []byte
	n := 0
	for _, t := range j.liveEntries(id, fingerprint) {
		line, err := json.Marshal(toWire(t.Revocation()))
		if err != nil {
			return 0, fmt.Errorf("tombstones of group %s: encode revocation of %s: %w", j.serial, t.Identity, err)
		}
		lines = append(append(lines, line...), '\n')
		n++
	}
	if n == 0 {
		return 0, nil
	}
	if _, err := j.appendLocked(lines); err != nil {
		return 0, fmt.Errorf("tombstones of group %s: revoke the tombstones of %s (made again) in %s: %w", j.serial, id, j.path(JournalName), err)
	}
	return n, nil
}

// liveLocked counts, under a lock of kind how, the tombstones of id +
// fingerprint that still count. j.mu must be held.
func (j *Journal) liveLocked(ctx context.Context, id object.Identity, fingerprint []byte, how int) (int, error) {
	unlock, err := j.lock(ctx, how)
	if err != nil {
		return 0, err
	}
	defer unlock()
	if err := j.refreshLocked(); err != nil {
		return 0, err
	}
	return len(j.liveEntries(id, fingerprint)), nil
}

// liveEntries returns the tombstones of id + fingerprint that still count:
// not revoked, and inside the horizon. j.mu must be held and the journal
// refreshed.
func (j *Journal) liveEntries(id object.Identity, fingerprint []byte) []Tombstone {
	cutoff := j.cutoff()
	var live []Tombstone
	for _, t := range j.entries[key(id, fingerprint)] {
		if !t.Revoked && !t.Time.Before(cutoff) {
			live = append(live, t)
		}
	}
	return live
}

// appendLocked appends line to the journal, first cutting off a torn last
// line a crashed writer may have left, and fsyncs. It returns the journal's
// new size. The exclusive lock must be held.
func (j *Journal) appendLocked(line []byte) (int64, error) {
	path := j.path(JournalName)
	f, err := filelock.OpenShared(path, os.O_RDWR|os.O_APPEND|os.O_CREATE, j.opts.Perm)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	size := fi.Size()
	if size == 0 {
		// Possibly new: make its directory entry durable too.
		if err := syncDir(j.dir); err != nil {
			return 0, err
		}
	} else if cut, err := lastLineEnd(f, size); err != nil {
		return 0, err
	} else if cut != size {
		if err := f.Truncate(cut); err != nil {
			return 0, fmt.Errorf("cut torn line: %w", err)
		}
		size = cut
		if j.offset > cut { // cannot happen (readers skip torn lines), but never read past the cut
			j.resetLocked()
		}
	}
	if _, err := f.Write(line); err != nil {
		return 0, err
	}
	if err := f.Sync(); err != nil {
		return 0, err
	}
	return size + int64(len(line)), nil
}

// lastLineEnd returns the offset just past the last '\n' in the first size
// bytes of f (0 when there is none).
func lastLineEnd(f *os.File, size int64) (int64, error) {
	buf := make([]byte, 4096)
	end := size
	for end > 0 {
		n := int64(len(buf))
		if n > end {
			n = end
		}
		if _, err := f.ReadAt(buf[:n], end-n); err != nil {
			return 0, err
		}
		if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
			return end - n + int64(i) + 1, nil
		}
		end -= n
	}
	return 0, nil
}

// Contains reports whether a tombstone within the horizon, not revoked,
// says that the object with this identity and fingerprint was destroyed.
// It reads what other processes have recorded since the last read.
func (j *Journal) Contains(ctx context.Context, id object.Identity, fingerprint []byte) (bool, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.readLocked(ctx); err != nil {
		return false, err
	}
	_, ok := j.entries[key(id, fingerprint)].latest(j.cutoff())
	return ok, nil
}

// Snapshot returns the tombstones within the horizon and not revoked as
// they stand now, including those recorded by other processes.
func (j *Journal) Snapshot(ctx context.Context) (*Set, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.readLocked(ctx); err != nil {
		return nil, err
	}
	cutoff := j.cutoff()
	s := newSet(len(j.entries))
	var inFlight []Tombstone
	for k, r := range j.entries {
		if t, ok := r.latest(cutoff); ok {
			if heldIntent(j, t) {
				inFlight = append(inFlight, t)
				continue
			}
			s.put(k, t)
		}
	}
	return s.inFlight(inFlight), nil
}

func (j *Journal) cutoff() time.Time { return j.opts.Now().Add(-j.opts.Horizon) }

// readLocked brings j.entries up to date under the shared lock.
func (j *Journal) readLocked(ctx context.Context) error {
	unlock, err := j.lock(ctx, unix.LOCK_SH)
	if err != nil {
		return err
	}
	defer unlock()
	return j.refreshLocked()
}

// refreshLocked reloads the checkpoint if it was replaced and reads the
// journal lines appended since the last read. A lock (shared or exclusive)
// must be held.
func (j *Journal) refreshLocked() error {
	if err := j.loadCheckpointLocked(); err != nil {
		return err
	}
	err := j.readJournalLocked()
	if errors.Is(err, errShrunk) {
		// The journal shrank without a new checkpoint: start over.
		j.resetLocked()
		if err = j.loadCheckpointLocked(); err == nil {
			err = j.readJournalLocked()
		}
	}
	return err
}

// resetLocked forgets everything read, so the next refresh reads all.
func (j *Journal) resetLocked() {
	if j.ckpt != nil {
		j.ckpt.Close()
		j.ckpt = nil
	}
	j.entries = map[string]records{}
	j.offset, j.line = 0, 0
}

// loadCheckpointLocked loads the checkpoint when it is not the one loaded
// last. Compaction always writes a new checkpoint (a new inode, by rename)
// before it empties the journal, so an unchanged checkpoint means the
// journal only grew since. The last checkpoint is kept open, so its inode
// number cannot be reused by a later one and the comparison is exact.
func (j *Journal) loadCheckpointLocked() error {
	path := j.path(CheckpointName)
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		if j.ckpt != nil { // removed by hand: forget what it said
			j.resetLocked()
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("tombstones of group %s: %w", j.serial, err)
	}
	if j.ckpt != nil {
		old, err1 := j.ckpt.Stat()
		cur, err2 := f.Stat()
		if err1 == nil && err2 == nil && os.SameFile(old, cur) {
			f.Close()
			return nil
		}
	}
	entries, err := readCheckpoint(f, j.serial)
	if err != nil {
		f.Close()
		return fmt.Errorf("tombstones of group %s: checkpoint %s: %w", j.serial, path, err)
	}
	j.resetLocked()
	j.ckpt = f
	for _, t := range entries {
		j.addLocked(t)
	}
	return nil
}

// addLocked merges t (a tombstone or a revocation).
func (j *Journal) addLocked(t Tombstone) {
	k := keyOf(t)
	r := j.entries[k]
	if r == nil {
		r = records{}
		j.entries[k] = r
	}
	r.add(t)
}

var errShrunk = errors.New("journal shrank")

// readJournalLocked parses the complete lines appended since j.offset. A
// last line without its newline is a torn write from a crashed writer
// (writers hold the exclusive lock, so nobody is writing now): it is left
// unread, and the next writer cuts it off.
func (j *Journal) readJournalLocked() error {
	path := j.path(JournalName)
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		if j.offset > 0 {
			return errShrunk
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("tombstones of group %s: %w", j.serial, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("tombstones of group %s: %w", j.serial, err)
	}
	if fi.Size() < j.offset {
		return errShrunk
	}
	if fi.Size() == j.offset {
		return nil
	}
	data := make([]byte, fi.Size()-j.offset)
	if _, err := f.ReadAt(data, j.offset); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("tombstones of group %s: read %s: %w", j.serial, path, err)
	}
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			return nil // nothing, or a torn last line
		}
		raw := data[:i]
		t, err := parseLine(raw, j.serial)
		if err != nil {
			return fmt.Errorf("tombstones of group %s: %s:%d: %w", j.serial, path, j.line+1, err)
		}
		j.addLocked(t)
		j.offset += int64(i + 1)
		j.line++
		data = data[i+1:]
	}
}

// Compact folds the journal into a new checkpoint, dropping tombstones
// older than the horizon and revoked ones (with their revocations), and
// empties the journal.
func (j *Journal) Compact(ctx context.Context) (CompactStats, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	unlock, err := j.lock(ctx, unix.LOCK_EX)
	if err != nil {
		return CompactStats{}, err
	}
	defer unlock()
	return j.compactLocked()
}

// CompactStats says what a compaction did.
type CompactStats struct {
	Kept    int   // tombstones in the new checkpoint
	Expired int   // tombstones dropped as older than the horizon
	Revoked int   // revoked tombstones dropped
	Folded  int64 // journal bytes folded into the checkpoint
}

// compactLocked does Compact's work under the exclusive lock.
func (j *Journal) compactLocked() (CompactStats, error) {
	var st CompactStats
	if err := j.refreshLocked(); err != nil {
		return st, err
	}
	st.Folded = j.offset
	cutoff := j.cutoff()
	keep := make([]Tombstone, 0, len(j.entries))
	for _, r := range j.entries {
		// Every tombstone not revoked is kept, not only the latest of
		// its object: a later one may still be revoked by its writer.
		for _, t := range r {
			switch {
			case t.Revoked:
				st.Revoked++
				if t.Intent {
					// A settled creation whose process died before its
					// release left its lock file: Held removes it.
					j.Held(t)
				}
			case t.Time.Before(cutoff):
				st.Expired++
			default:
				keep = append(keep, t)
			}
		}
	}
	sortTombstones(keep)
	st.Kept = len(keep)
	data, err := encodeCheckpoint(j.serial, j.opts.Now(), j.opts.Horizon, keep)
	if err != nil {
		return st, fmt.Errorf("tombstones of group %s: encode checkpoint: %w", j.serial, err)
	}
	j.removeTemps()
	ckptPath := j.path(CheckpointName)
	if err := writeFileAtomic(ckptPath, data, j.opts.Perm); err != nil {
		return st, fmt.Errorf("tombstones of group %s: write checkpoint %s: %w", j.serial, ckptPath, err)
	}
	// The checkpoint holds everything now; a crash before the truncation
	// only leaves lines that are in both, which merge to the same set.
	jpath := j.path(JournalName)
	if err := truncateSync(jpath); err != nil {
		return st, fmt.Errorf("tombstones of group %s: empty journal %s: %w", j.serial, jpath, err)
	}
	j.resetLocked()
	if err := j.loadCheckpointLocked(); err != nil {
		return st, err
	}
	return st, nil
}

// removeTemps deletes checkpoint temp files a crashed compaction left
// (only compaction creates them, under the exclusive lock).
func (j *Journal) removeTemps() {
	matches, _ := filepath.Glob(j.path(CheckpointName + ".tmp*"))
	for _, m := range matches {
		os.Remove(m)
	}
}

// truncateSync empties the file at path, if any, durably.
func truncateSync(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(0); err != nil {
		return err
	}
	return f.Sync()
}

// writeFileAtomic writes data to path through a temp file in the same
// directory: write, fsync, rename, fsync the directory. On failure the temp
// file is removed and path is untouched.
func writeFileAtomic(path string, data []byte, perm os.FileMode) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err = tmp.Chmod(perm); err != nil {
		return err
	}
	if _, err = tmp.Write(data); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	return syncDir(dir)
}

// Close releases the journal's open files. Safe to call more than once.
func (j *Journal) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if !j.closed {
		j.resetLocked()
		j.closed = true
	}
	return nil
}

// Set is a snapshot of a group's tombstones within the horizon and not
// revoked, the latest of each identity and fingerprint. It is immutable
// and safe for concurrent use; it satisfies the tombstone interface sync
// planning takes.
type Set struct {
	entries map[string]Tombstone
	ids     map[string]bool // Identity.Key of every destroy
	intents map[string]bool // Identity.Key of every unanswered creation
	busy    map[string]bool // intentKey of every creation in flight (inflight.go)
}

func newSet(n int) *Set {
	return &Set{entries: make(map[string]Tombstone, n), ids: map[string]bool{}, intents: map[string]bool{}}
}

// put adds the live record t under its key k.
func (s *Set) put(k string, t Tombstone) {
	if t.Intent {
		s.intents[intentKey(t.Identity)] = true
		return
	}
	s.entries[k] = t
	s.ids[t.Identity.Key()] = true
}

// Unanswered reports whether a creation of an object with this identity
// was sent to a member and never answered (an Intent not revoked, within
// the horizon): an object of that identity that one member being caught up
// holds alone was never made by the group.
func (s *Set) Unanswered(id object.Identity) bool {
	return s != nil && s.intents[intentKey(id)]
}

// InFlight reports whether a creation of an object with this identity is
// running now in a process of this host (its intent is held: inflight.go):
// an object of that identity that one member being caught up holds alone
// may be what it is making, and is neither destroyed nor spread yet.
func (s *Set) InFlight(id object.Identity) bool {
	return s != nil && s.busy[intentKey(id)]
}

// inFlight marks the intents ts in flight: never Unanswered while they
// run. It returns s.
func (s *Set) inFlight(ts []Tombstone) *Set {
	for _, t := range ts {
		if s.busy == nil {
			s.busy = map[string]bool{}
		}
		k := intentKey(t.Identity)
		s.busy[k] = true
		delete(s.intents, k)
	}
	return s
}

// intentKey is an identity's key without its key type, which a creation's
// template need not give (the mechanism implies it).
func intentKey(id object.Identity) string {
	id.KeyType = object.NoKeyType
	return id.Key()
}

// NewSet returns a Set of ts, for tombstones kept elsewhere (in memory,
// by a program without a state directory). A revocation in ts cancels
// the tombstone it names, wherever it stands in ts. No horizon applies.
func NewSet(ts ...Tombstone) *Set {
	all := map[string]records{}
	for _, t := range ts {
		k := keyOf(t)
		r := all[k]
		if r == nil {
			r = records{}
			all[k] = r
		}
		r.add(t)
	}
	s := newSet(len(all))
	for k, r := range all {
		if t, ok := r.latest(time.Time{}); ok {
			s.put(k, t)
		}
	}
	return s
}

// Contains reports whether the object with this identity and fingerprint
// was destroyed through the group within the horizon.
func (s *Set) Contains(id object.Identity, fingerprint []byte) bool {
	if s == nil {
		return false
	}
	_, ok := s.entries[key(id, fingerprint)]
	return ok
}

// ContainsIdentity reports whether an object with this identity, whatever
// its fingerprint, was destroyed through the group within the horizon. A
// plan asks it of objects whose fingerprint a member cannot compute (a
// private key whose public half is gone), which Contains cannot match.
func (s *Set) ContainsIdentity(id object.Identity) bool {
	if s == nil {
		return false
	}
	return s.ids[id.Key()]
}

// Len returns the number of identity+fingerprint pairs with a tombstone.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.entries)
}

// All returns the tombstones (the latest of each identity+fingerprint),
// oldest first.
func (s *Set) All() []Tombstone {
	if s == nil {
		return nil
	}
	out := make([]Tombstone, 0, len(s.entries))
	for _, t := range s.entries {
		out = append(out, t)
	}
	sortTombstones(out)
	return out
}

func sortTombstones(ts []Tombstone) {
	// Each key once: formatting it in the comparison made the sort of a
	// member's register (thousands of records) most of a destroy's CPU.
	type keyed struct {
		t   Tombstone
		key string
	}
	ks := make([]keyed, len(ts))
	for i, t := range ts {
		ks[i] = keyed{t, keyOf(t)}
	}
	slices.SortFunc(ks, func(a, b keyed) int {
		if c := a.t.Time.Compare(b.t.Time); c != 0 {
			return c
		}
		return strings.Compare(a.key, b.key)
	})
	for i := range ks {
		ts[i] = ks[i].t
	}
}

// On-disk form. Byte strings are hex so an operator can read the files.

type wireIdentity struct {
	Class   uint   `json:"class"`
	KeyType *uint  `json:"key_type,omitempty"` // absent for NoKeyType
	ID      string `json:"id"`
	Label   string `json:"label"`
}

type wireTombstone struct {
	Identity    wireIdentity `json:"identity"`
	Fingerprint string       `json:"fingerprint"`
	Time        time.Time    `json:"time"`
	Group       string       `json:"group"`
	Revoked     bool         `json:"revoked,omitempty"` // a revocation of the tombstone of this time
	Intent      bool         `json:"intent,omitempty"`  // the write-ahead record of a creation
}

type wireCheckpoint struct {
	Version    int             `json:"version"`
	Group      string          `json:"group"`
	Written    time.Time       `json:"written"`
	Horizon    string          `json:"horizon"`
	Tombstones []wireTombstone `json:"tombstones"`
}

func toWire(t Tombstone) wireTombstone {
	w := wireTombstone{
		Identity: wireIdentity{
			Class: t.Identity.Class,
			ID:    hex.EncodeToString(t.Identity.ID),
			Label: t.Identity.Label,
		},
		Fingerprint: hex.EncodeToString(t.Fingerprint),
		Time:        t.Time.UTC(),
		Group:       t.GroupSerial,
		Revoked:     t.Revoked,
		Intent:      t.Intent,
	}
	if t.Identity.KeyType != object.NoKeyType {
		kt := t.Identity.KeyType
		w.Identity.KeyType = &kt
	}
	return w
}

func fromWire(w wireTombstone, serial string) (Tombstone, error) {
	if w.Group != serial {
		return Tombstone{}, fmt.Errorf("tombstone names group %q", w.Group)
	}
	if w.Time.IsZero() {
		return Tombstone{}, errors.New("tombstone without a time")
	}
	id, err := hex.DecodeString(w.Identity.ID)
	if err != nil {
		return Tombstone{}, fmt.Errorf("identity id: %w", err)
	}
	fp, err := hex.DecodeString(w.Fingerprint)
	if err != nil {
		return Tombstone{}, fmt.Errorf("fingerprint: %w", err)
	}
	t := Tombstone{
		Identity:    object.Identity{Class: w.Identity.Class, KeyType: object.NoKeyType, ID: id, Label: w.Identity.Label},
		Fingerprint: fp,
		Time:        w.Time,
		GroupSerial: w.Group,
		Revoked:     w.Revoked,
		Intent:      w.Intent,
	}
	if len(t.Identity.ID) == 0 {
		t.Identity.ID = nil
	}
	if len(t.Fingerprint) == 0 {
		t.Fingerprint = nil
	}
	if w.Identity.KeyType != nil {
		t.Identity.KeyType = *w.Identity.KeyType
	}
	return t, nil
}

func parseLine(raw []byte, serial string) (Tombstone, error) {
	var w wireTombstone
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return Tombstone{}, err
	}
	return fromWire(w, serial)
}

func encodeCheckpoint(serial string, now time.Time, horizon time.Duration, ts []Tombstone) ([]byte, error) {
	c := wireCheckpoint{
		Version:    checkpointVersion,
		Group:      serial,
		Written:    now.UTC(),
		Horizon:    horizon.String(),
		Tombstones: make([]wireTombstone, len(ts)),
	}
	for i, t := range ts {
		c.Tombstones[i] = toWire(t)
	}
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

func readCheckpoint(r io.Reader, serial string) ([]Tombstone, error) {
	var c wireCheckpoint
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, err
	}
	if c.Version != checkpointVersion {
		return nil, fmt.Errorf("unsupported version %d (want %d)", c.Version, checkpointVersion)
	}
	if c.Group != serial {
		return nil, fmt.Errorf("checkpoint names group %q", c.Group)
	}
	out := make([]Tombstone, 0, len(c.Tombstones))
	for i, w := range c.Tombstones {
		t, err := fromWire(w, serial)
		if err != nil {
			return nil, fmt.Errorf("tombstone %d: %w", i+1, err)
		}
		out = append(out, t)
	}
	return out, nil
}

// StandingIntents returns the intents within the horizon not revoked:
// Records' intents, without building the rest (a destroy's first write
// on a member spreads them: Shared).
func (j *Journal) StandingIntents(ctx context.Context) ([]Tombstone, error) {
	return j.within(ctx, func(t Tombstone) bool { return t.Intent && !t.Revoked })
}

// Records returns every record within the horizon as it stands now,
// tombstones and revocations alike, oldest first: what Shared spreads to
// the members (a revocation must travel with its tombstone, or a copy of
// the tombstone alone would delete an object made again).
func (j *Journal) Records(ctx context.Context) ([]Tombstone, error) {
	out, err := j.within(ctx, func(Tombstone) bool { return true })
	if err != nil {
		return nil, err
	}
	sortTombstones(out)
	return out, nil
}

// within returns the records within the horizon that keep accepts.
func (j *Journal) within(ctx context.Context, keep func(Tombstone) bool) ([]Tombstone, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.readLocked(ctx); err != nil {
		return nil, err
	}
	cutoff := j.cutoff()
	var out []Tombstone
	for _, r := range j.entries {
		for _, t := range r {
			if !t.Time.Before(cutoff) && keep(t) {
				out = append(out, t)
			}
		}
	}
	return out, nil
}
