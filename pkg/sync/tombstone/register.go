package tombstone

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strings"
	"time"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/state"
	"github.com/miekg/pkcs11"
)

// Registers: the member-side record written in place (DESIGN.md,
// "Tombstones on the members"). On SoftHSM a create plus a destroy of a
// token object costs far more than a change of a data object's
// CKA_LABEL in place (docs/BENCHMARKS.md, "SoftHSM costs the code is
// shaped by"). So each writer — one local record: a host's journal
// (shared under its flock by every process of the host) or one process's
// memory — owns one private token data object per member, whose CKA_LABEL
// names the writer and carries the records:
//
//	<the group's state label>/<writer id>/<base64url of: "HGR1", write time, records, CRC-32>
//
// The label keeps the state prefix, so the object stays hidden from the
// application (object.Hidden). Only the owner changes its register, and
// after each change it checks the object is still there, creating it
// again if it is gone (update-then-check). Another writer folds a
// register (copies its records into its own, then destroys it after
// re-reading it unchanged: check-then-destroy) only once it has seen the
// register unchanged for FoldAfter; the owner, for its part, never
// updates in place a register it last wrote FoldAfter/2 ago or more, but
// replaces it. So a fold and an in-place update of the same register
// cannot meet unless the owner stalls for FoldAfter/2 in mid-write; it
// measures that after the write and, if it did, writes its records again
// into a new register (ErrStalled, reported): a stall costs a create,
// never a record.

const registerMagic = "HGR1"

// DefaultChunkRecords is how many records a register holds before they
// are frozen into a chunk: an object of the created form, never changed,
// removed once every record in it is past the horizon (or merged).
const DefaultChunkRecords = 128

// DefaultMaxChunks is how many chunks a member holds before a full read
// of it merges them into one.
const DefaultMaxChunks = 16

// DefaultFoldAfter is how long a register must stay unchanged before
// another writer folds it.
const DefaultFoldAfter = 24 * time.Hour

// registerQuirks are the answers of a token that will not keep records
// in a label (read-only label, length limit): that member is written with
// created objects instead (quirk, not a failure).
var registerQuirks = []uint{
	pkcs11.CKR_ATTRIBUTE_READ_ONLY, pkcs11.CKR_ATTRIBUTE_VALUE_INVALID, pkcs11.CKR_DATA_LEN_RANGE,
	pkcs11.CKR_ACTION_PROHIBITED, pkcs11.CKR_TEMPLATE_INCONSISTENT, pkcs11.CKR_ATTRIBUTE_TYPE_INVALID,
}

func isRegisterQuirk(err error) bool {
	return slices.Contains(registerQuirks, slot.CodeOf(err))
}

// Writer is implemented by a Local shared by several processes (the
// host's journal): they share one register per member, and take its lock
// around each update so that none loses another's records.
type Writer interface {
	// WriterID returns the id of the register, the same for every process
	// sharing this local record.
	WriterID(ctx context.Context) (string, error)
	// LockRegister serialises the updates of the register on member
	// (named by its token serial) across processes.
	LockRegister(ctx context.Context, member string) (unlock func(), err error)
}

// newWriterID returns a fresh random register id.
func newWriterID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// register is one writer's register read from a member.
type register struct {
	handle  pkcs11.ObjectHandle
	writer  string
	label   string    // the whole CKA_LABEL as read
	at      time.Time // when its owner last wrote it (its own clock)
	records recordSet // within the horizon
}

func encodeRegister(prefix, writer string, at time.Time, ts []Tombstone) string {
	b := binary.AppendVarint([]byte(registerMagic), at.UnixNano())
	b = appendRecords(b, ts)
	b = binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(b))
	return prefix + "/" + writer + "/" + base64.RawURLEncoding.EncodeToString(b)
}

// decodeRegister decodes a register's label; ok is false when label is
// not a register of prefix (another group's, or an object of the old
// form).
func decodeRegister(prefix, label, serial string) (r register, ts []Tombstone, ok bool, err error) {
	rest, found := strings.CutPrefix(label, prefix+"/")
	if !found {
		return register{}, nil, false, nil
	}
	r.label = label
	r.writer, rest, found = strings.Cut(rest, "/")
	if !found {
		return register{}, nil, true, errTorn
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil || len(b) < len(registerMagic)+4 || !bytes.HasPrefix(b, []byte(registerMagic)) {
		return register{}, nil, true, errTorn
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.ChecksumIEEE(body) != sum {
		return register{}, nil, true, errTorn
	}
	d := decoder{b: body[len(registerMagic):]}
	r.at = time.Unix(0, d.varint())
	ts, err = d.records(serial)
	return r, ts, true, err
}

// errRegisterGone is returned by readRegister for a handle that no longer
// names this writer's register.
var errRegisterGone = errors.New("register gone")

// readRegister re-reads the register known was read or written as; one
// still labelled as known is known, not decoded again (thousands of
// records within the horizon make a decode dearer than the token's read).
func (s *Shared) readRegister(ctx context.Context, m *slot.Slot, known register) (register, error) {
	h, writer := known.handle, known.writer
	attrs, err := m.GetAttributes(ctx, h, []uint{pkcs11.CKA_LABEL})
	if err != nil {
		if slot.CodeOf(err) == pkcs11.CKR_OBJECT_HANDLE_INVALID || slot.ClassOf(err) == slot.ClassRequest {
			return register{}, errRegisterGone
		}
		return register{}, fmt.Errorf("member %s: read the tombstone register (object %d): %w", m.Name(), h, err)
	}
	if len(attrs) != 1 || attrs[0].Status != pkcs11.CKR_OK {
		return register{}, errRegisterGone
	}
	if known.records != nil && string(attrs[0].Value) == known.label {
		return known, nil
	}
	r, ts, ok, err := decodeRegister(s.label, string(attrs[0].Value), s.serial)
	if !ok || (err == nil && r.writer != writer) {
		return register{}, errRegisterGone
	}
	if err != nil {
		return register{}, fmt.Errorf("member %s: tombstone register (object %d): %w", m.Name(), h, err)
	}
	r.handle, r.records = h, recordSet{}
	cutoff := s.cutoff()
	for _, t := range ts {
		r.records.add(t, cutoff)
	}
	return r, nil
}

// createRegister makes a new register holding union on m.
func (s *Shared) createRegister(ctx context.Context, m *slot.Slot, writer string, union recordSet) (register, error) {
	at := s.opts.Now()
	label := encodeRegister(s.label, writer, at, union.sorted())
	tmpl, err := state.Template(m, label, Application, nil, true)
	if err != nil {
		return register{}, err
	}
	h, err := m.CreateObject(ctx, tmpl)
	if err != nil {
		return register{}, fmt.Errorf("member %s: create the tombstone register (%d bytes): %w", m.Name(), len(label), err)
	}
	return register{handle: h, writer: writer, label: label, at: at, records: union}, nil
}

// updateRegister writes union into r in place, then checks r is still
// there (a fold may have removed it meanwhile), and creates it again if
// not. A register FoldAfter/2 old or more is replaced instead: another
// writer may be folding it.
func (s *Shared) updateRegister(ctx context.Context, m *slot.Slot, r register, union recordSet) (register, error) {
	now := s.opts.Now()
	if age := now.Sub(r.at); age < 0 || age >= s.opts.FoldAfter/2 {
		n, err := s.createRegister(ctx, m, r.writer, union)
		if err != nil {
			return register{}, err
		}
		return n, s.destroyRegister(ctx, m, r)
	}
	label := encodeRegister(s.label, r.writer, now, union.sorted())
	updated := register{handle: r.handle, writer: r.writer, label: label, at: now, records: union}
	err := m.SetAttributes(ctx, r.handle, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_LABEL, []byte(label))})
	if err == nil {
		_, err = s.readRegister(ctx, m, updated)
	} else if slot.CodeOf(err) == pkcs11.CKR_OBJECT_HANDLE_INVALID {
		err = errRegisterGone
	}
	switch {
	case errors.Is(err, errRegisterGone):
		return s.createRegister(ctx, m, r.writer, union)
	case err != nil:
		return register{}, fmt.Errorf("member %s: update the tombstone register (object %d, %d bytes): %w", m.Name(), r.handle, len(label), err)
	}
	if stalled := s.opts.Now().Sub(r.at); stalled < 0 || stalled >= s.opts.FoldAfter/2 {
		// This writer stalled (a paused VM, a suspended host) between
		// deciding to write in place and its check: a fold may have read
		// the register before the update and destroy it after the check,
		// losing the new records. A new register, which no fold has read,
		// holds them whatever the fold does.
		s.report(m.Name(), fmt.Errorf("%w: %v since the register's last write, %v allowed; its records were written again into a new register",
			ErrStalled, stalled.Round(time.Second), s.opts.FoldAfter/2))
		n, err := s.createRegister(ctx, m, r.writer, union)
		if err != nil {
			return register{}, err
		}
		return n, s.destroyRegister(ctx, m, updated)
	}
	return updated, nil
}

// ErrStalled says a writer stalled in mid-write for longer than the fold
// protocol's margin (FoldAfter/2): detected after the write, and repaired
// by writing the records again into a new register.
var ErrStalled = errors.New("tombstone register writer stalled in mid-write")

// destroyRegister destroys r if it still holds what was read of it
// (check-then-destroy).
func (s *Shared) destroyRegister(ctx context.Context, m *slot.Slot, r register) error {
	attrs, err := m.GetAttributes(ctx, r.handle, []uint{pkcs11.CKA_LABEL})
	if err != nil {
		if slot.CodeOf(err) == pkcs11.CKR_OBJECT_HANDLE_INVALID || slot.ClassOf(err) == slot.ClassRequest {
			return nil
		}
		return fmt.Errorf("member %s: re-read tombstone register %d before removing it: %w", m.Name(), r.handle, err)
	}
	if len(attrs) != 1 || string(attrs[0].Value) != r.label {
		return nil // changed: its owner is alive
	}
	if err := m.DestroyObject(ctx, r.handle); err != nil && slot.CodeOf(err) != pkcs11.CKR_OBJECT_HANDLE_INVALID {
		return fmt.Errorf("member %s: remove tombstone register %d: %w", m.Name(), r.handle, err)
	}
	return nil
}

// tooManyChunks reports whether h holds more chunks with records within
// the horizon than MaxChunks.
func (s *Shared) tooManyChunks(h *memberRecords) bool {
	return len(h.objects)-len(h.expired) > s.opts.MaxChunks
}

// mergeChunks writes the records of every chunk held on m into one new
// chunk, then destroys each chunk it read if unchanged: chunks are never
// changed in place, so two writers merging at once lose nothing (each
// new chunk holds everything read). It keeps the number of objects on a
// member to a few per writer and horizon.
func (s *Shared) mergeChunks(ctx context.Context, m *slot.Slot, held *memberRecords) error {
	if _, err := state.Write(ctx, m, s.label, Application, encodeRecords(held.chunked.sorted()), held.objects); err != nil {
		return fmt.Errorf("tombstones of group %s: merge %d chunks: %w", s.serial, len(held.objects), err)
	}
	return nil
}

// errQuirk is returned by mergeRegister when m refused records in a label.
var errQuirk = errors.New("the member keeps no records in a label")

// merge writes add on m with the records m holds: into this writer's
// register, or as created objects on a member that refused registers
// (remembered per member: a quirk of the token, not a failure).
func (s *Shared) merge(ctx context.Context, m *slot.Slot, add recordSet, held *memberRecords) (recordSet, error) {
	w := s.writtenOn(m)
	if !w.quirk.Load() {
		union, err := s.mergeRegister(ctx, m, w, add, held)
		if !errors.Is(err, errQuirk) {
			return union, err
		}
		w.quirk.Store(true)
	}
	return s.mergeObjects(ctx, m, add, held)
}

// writerID returns the id of this writer's registers: the local
// record's when it is shared (Writer), else this process's.
func (s *Shared) writerID(ctx context.Context) (string, error) {
	if id := s.sharedID.Load(); id != nil {
		return *id, nil
	}
	wr, ok := s.local.(Writer)
	if !ok {
		return s.id, nil
	}
	id, err := wr.WriterID(ctx)
	if err != nil {
		return "", fmt.Errorf("tombstones of group %s: %w", s.serial, err)
	}
	s.sharedID.Store(&id)
	return id, nil
}

// lockRegister serialises the updates of this writer's register on m
// with the other processes sharing the local record.
func (s *Shared) lockRegister(ctx context.Context, m *slot.Slot) (func(), error) {
	wr, ok := s.local.(Writer)
	if !ok {
		return func() {}, nil // w.mu serialises this process's writes
	}
	name := m.Token().Serial
	if name == "" {
		name = m.Name()
	}
	unlock, err := wr.LockRegister(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("tombstones of group %s: member %s: %w", s.serial, m.Name(), err)
	}
	return unlock, nil
}

// folds reports whether a write on m would fold something: another
// writer's register left unchanged for FoldAfter, or a created object
// holding nothing within the horizon.
func (s *Shared) folds(ctx context.Context, m *slot.Slot, h *memberRecords) bool {
	if s.writtenOn(m).quirk.Load() {
		return len(h.objects) > 1
	}
	if len(h.expired) > 0 || s.tooManyChunks(h) {
		return true
	}
	writer, err := s.writerID(ctx)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(h.registers, func(r register) bool { return s.foldable(m, r, writer) })
}

// mergeRegister writes add into this writer's register on m. With held
// (m just read) or on a member not written since the last re-login, it
// also folds what may be folded; otherwise it re-reads only its own
// register (another process of the host may have changed it).
func (s *Shared) mergeRegister(ctx context.Context, m *slot.Slot, w *written, add recordSet, held *memberRecords) (recordSet, error) {
	writer, err := s.writerID(ctx)
	if err != nil {
		return nil, err
	}
	unlock, err := s.lockRegister(ctx, m)
	if err != nil {
		return nil, err
	}
	defer unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	epoch := m.Epoch()
	var own, fold []register
	var expired []state.Object
	// w.held nil: not known (no full read yet); a spread of more than
	// a destroy's records then reads the member whole.
	full := held != nil || w.reg.handle == 0 || w.epoch != epoch || (w.held == nil && len(add) > s.opts.ChunkRecords)
	if !full {
		r, err := s.readRegister(ctx, m, w.reg)
		switch {
		case err == nil:
			own = []register{r}
			add = add.missingFrom(w.held) // what the rest of the member holds
		case errors.Is(err, errRegisterGone):
			// Removed under its owner: what it held may be gone from the
			// member; the full read below writes it again.
			add = add.clone()
			add.addAll(w.reg.records, time.Time{})
			full = true
		default:
			return nil, err
		}
	}
	if full {
		// A destroy's first write here (or after a re-login or a removed
		// register) reads the registers only, and adds the intents still
		// standing in the local record (a process of the host may have
		// died mid-call); a spread reads the member whole and writes what
		// it lacks of the whole local record.
		light := held == nil && len(add) <= s.opts.ChunkRecords
		switch {
		case light:
			add = add.clone()
			add.addAll(s.standingIntents(ctx), time.Time{})
		case held == nil:
			all := s.localRecords(ctx)
			all.addAll(add, time.Time{})
			add = all
		}
		if held, err = s.heldOn(ctx, m, held, light); err != nil {
			return nil, err
		}
		w.held = nil
		if !held.light {
			w.held = held.records.clone()
		}
		add = add.settledAway(held.records)
		for k := range add {
			if _, ok := held.records[k]; ok && !add[k].Revoked {
				delete(add, k) // another object there holds it
			}
		}
		if s.tooManyChunks(held) {
			if err := s.mergeChunks(ctx, m, held); err != nil {
				return nil, err
			}
		}
		for _, r := range held.registers {
			switch {
			case r.writer == writer:
				own = append(own, r)
			case s.foldable(m, r, writer):
				fold = append(fold, r)
			}
		}
		expired = held.expired
	}
	union := recordSet{}
	for _, r := range own {
		union.addAll(r.records, s.cutoff())
	}
	if len(own) > 0 {
		add = add.settledAway(own[0].records, w.held)
	}
	changed := union.addAll(add, s.cutoff())
	for _, r := range fold {
		if union.addAll(r.records, s.cutoff()) {
			changed = true
		}
	}
	if len(own) > 0 && !changed && len(own) == 1 && len(fold) == 0 && len(expired) == 0 {
		w.epoch, w.reg = epoch, own[0]
		return union, nil
	}
	if len(union) > s.opts.ChunkRecords {
		// Frozen into a chunk, the records leave the register, which a
		// destroy rewrites whole: its size, and so a destroy's cost,
		// stays within ChunkRecords whatever the history.
		if _, err := state.Write(ctx, m, s.label, Application, encodeRecords(union.sorted()), nil); err != nil {
			return nil, fmt.Errorf("tombstones of group %s: freeze %d records into a chunk: %w", s.serial, len(union), err)
		}
		if w.held != nil { // nil stays "not known": the other chunks were not read
			w.held.addAll(union, time.Time{})
		}
		union = recordSet{}
	}
	if len(union) > 0 || len(own) > 0 {
		var r register
		if len(own) == 0 {
			r, err = s.createRegister(ctx, m, writer, union)
		} else {
			r, err = s.updateRegister(ctx, m, own[0], union)
		}
		if err != nil {
			if isRegisterQuirk(err) {
				return nil, errQuirk
			}
			return nil, fmt.Errorf("tombstones of group %s: %w", s.serial, err)
		}
		w.epoch, w.reg = epoch, r
	}
	// Only once the records are in this writer's register.
	var errs []error
	for _, r := range append(own[min(1, len(own)):], fold...) {
		errs = append(errs, s.destroyRegister(ctx, m, r))
	}
	for _, o := range expired {
		errs = append(errs, state.DestroyIfSame(ctx, m, s.label, Application, o))
	}
	if err := errors.Join(errs...); err != nil {
		return union, fmt.Errorf("tombstones of group %s: %w", s.serial, err)
	}
	return union, nil
}
