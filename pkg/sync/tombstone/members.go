package tombstone

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/hagroup/hagroup/pkg/sync/state"
	"github.com/miekg/pkcs11"
)

// Tombstones on the members (DESIGN.md, "Group state on the members").
// Every process on every host meets the others only on the members, so a
// destroy is recorded there too: the records go into this writer's
// register on every member that can be reached (register.go; or, on a
// member refusing records in a label, a private data object labelled
// state.Label(serial, StateKind) merged by union with what the
// member holds, see state.Write), and a plan reads the union over
// every member it reaches. A process on another host, with another state directory, thus
// honours a destroy as long as it reaches one member that saw it. The
// local record (the journal, or memory) stays the write-ahead record: it
// is written first; a destroy spreads its own record, and the whole local
// record goes to a member at this process's first write there (after a
// login), after a write that missed a member, and with every plan's
// repair, so a record whose first spreading failed reaches them later.

// StateKind names the tombstone objects on the members.
const StateKind = "tombstones"

// Application is the CKA_APPLICATION of the tombstone objects.
const Application = "hagroup/tombstones"

// Local is the record a process writes ahead of the members: the host's
// *Journal, or memory in a process without a state directory.
type Local interface {
	Record(ctx context.Context, t Tombstone) error
	Revive(ctx context.Context, id object.Identity, fingerprint []byte) (int, error)
	// Records returns every record within the horizon, revocations too.
	Records(ctx context.Context) ([]Tombstone, error)
}

// SharedOptions tune a Shared. The zero value is the production setting.
type SharedOptions struct {
	// Horizon is how long a tombstone counts; 0 means DefaultHorizon.
	Horizon time.Duration
	// OnError is told of a member that could not be read or written (a
	// destroy stays recorded locally and on the other members); nil
	// drops it. It must not block.
	OnError func(member string, err error)
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
	// FoldAfter is how long another writer's register must stay unchanged
	// before this one folds it (register.go); 0 means DefaultFoldAfter.
	FoldAfter time.Duration
	// ChunkRecords is how many records a register holds before they are
	// frozen into a chunk (register.go); 0 means DefaultChunkRecords.
	ChunkRecords int
	// MaxChunks is how many chunks a member holds before a plan's read
	// merges them into one; 0 means DefaultMaxChunks.
	MaxChunks int
}

// Shared is a group's tombstones, kept locally and on the members. It
// implements what pkg/group records destroys with and what pkg/recover
// plans with. Safe for concurrent use.
type Shared struct {
	local   Local
	serial  string
	label   string
	opts    SharedOptions
	members atomic.Pointer[func(recovering bool) []*slot.Slot]

	id       string                 // the register id when local is no Writer
	sharedID atomic.Pointer[string] // the Writer's id, once read
	// spreadAll: the next Record spreads the whole local record, not its
	// own record alone (a member missed a write, or an intent published
	// to the members was settled since).
	spreadAll atomic.Bool
	published atomic.Bool // an intent was published (Publish)

	holdMu sync.Mutex
	holds  map[string]func() // guarded by holdMu: the releases of Intend's holds (inflight.go)

	mu      sync.Mutex
	written map[*slot.Slot]*written // guarded by mu
	seen    map[seenKey]seenLabel   // guarded by mu: when each register was first seen as it is
}

// seenKey names a register on a member under one login (handles may
// change with a re-login).
type seenKey struct {
	m      *slot.Slot
	epoch  uint64
	handle pkcs11.ObjectHandle
}

type seenLabel struct {
	label string
	since time.Time
}

// written is the tombstone object this process last wrote on a member.
// Its next write there folds that one object in without searching the
// member (a search costs a scan of every object on SoftHSM); other
// writers' objects are left to the reads, which take every object.
type written struct {
	mu    sync.Mutex // serialises this process's writes on the member
	epoch uint64     // the slot's Epoch when obj or reg was written
	// reg is this writer's register there (register.go); 0 handle: not
	// known yet.
	reg register
	// quirk: the member refused records in a label; it is written with
	// created objects (obj, records) instead.
	quirk   atomic.Bool
	obj     state.Object
	records recordSet // what obj holds; nil: nothing written yet
	// held is what the member is known to hold besides this writer's
	// register (read at its last full read, and the chunks this process
	// froze since): a write there leaves it out, so that a spread of the
	// whole local record costs what is new, not the history.
	held recordSet
}

func (s *Shared) writtenOn(m *slot.Slot) *written {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.written == nil {
		s.written = map[*slot.Slot]*written{}
	}
	w := s.written[m]
	if w == nil {
		w = &written{}
		s.written[m] = w
	}
	return w
}

// NewShared returns the tombstones of the group with serial groupSerial,
// written ahead to local. Until SetMembers is called they are kept in
// local only.
func NewShared(local Local, groupSerial string, opts SharedOptions) *Shared {
	if opts.Horizon <= 0 {
		opts.Horizon = DefaultHorizon
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.FoldAfter <= 0 {
		opts.FoldAfter = DefaultFoldAfter
	}
	if opts.ChunkRecords <= 0 {
		opts.ChunkRecords = DefaultChunkRecords
	}
	if opts.MaxChunks <= 0 {
		opts.MaxChunks = DefaultMaxChunks
	}
	return &Shared{local: local, serial: groupSerial, label: state.Label(groupSerial, StateKind), opts: opts, id: newWriterID()}
}

// SetMembers gives the members to keep the tombstones on: members returns
// the slots that can be read and written now (open and logged in): the
// serving members, and with recovering those being caught up too, which
// Snapshot reads and repairs (pkg/group's StateSlots).
func (s *Shared) SetMembers(members func(recovering bool) []*slot.Slot) { s.members.Store(&members) }

func (s *Shared) slots(recovering bool) []*slot.Slot {
	if f := s.members.Load(); f != nil {
		return (*f)(recovering)
	}
	return nil
}

// Record writes t ahead to the local record and to every member reached,
// at once: each is written before the destroy, and neither needs the
// other first, so a destroy waits for the slower of the journal's fsync
// and the members' writes rather than for both in turn. It fails only
// when the local record fails; then t is revoked on the members again
// (the caller takes it as not recorded and so never revokes it should the
// destroy not happen). A member that cannot be written is reported
// (SharedOptions.OnError) and gets the record with a later write or the
// next plan's repair.
func (s *Shared) Record(ctx context.Context, t Tombstone) error {
	if t.GroupSerial == "" {
		t.GroupSerial = s.serial
	}
	if t.Time.IsZero() && !t.Revoked {
		t.Time = s.opts.Now()
	}
	ms := s.slots(false)
	if len(ms) == 0 {
		return s.local.Record(ctx, t)
	}
	// The new record alone, unless an earlier write missed a member or a
	// published intent was settled since: then the whole local record
	// (read before the append, which holds the journal's lock meanwhile).
	// A process's first write on a member reads what the member holds
	// and spreads the rest of the local record there (mergeRegister).
	add := newRecordSet()
	if s.spreadAll.Swap(false) {
		add = s.localRecords(ctx)
	}
	var localErr error
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		localErr = s.local.Record(ctx, t)
	}()
	add.add(t, time.Time{})
	s.spreadTo(ctx, ms, add)
	<-wrote
	if localErr != nil {
		if !t.Revoked {
			s.spreadTo(ctx, ms, newRecordSet(t.Revocation()))
		}
		return localErr
	}
	return nil
}

// Revive revokes the tombstones of the version id + fingerprint (see
// Journal.Revive) locally and then on the members.
func (s *Shared) Revive(ctx context.Context, id object.Identity, fingerprint []byte) (int, error) {
	n, err := s.local.Revive(ctx, id, fingerprint)
	if err != nil || n == 0 {
		return n, err
	}
	s.spread(ctx)
	return n, nil
}

// spread merges the local records into the tombstone object of every
// serving member.
func (s *Shared) spread(ctx context.Context) {
	if ms := s.slots(false); len(ms) > 0 {
		s.spreadTo(ctx, ms, s.localRecords(ctx))
	}
}

// localRecords returns the local record as a recordSet, without the
// intents in flight (inflight.go); one that cannot be read is reported
// and taken as empty.
func (s *Shared) localRecords(ctx context.Context) recordSet {
	local, err := s.local.Records(ctx)
	if err != nil {
		s.report("", fmt.Errorf("read the local tombstones to copy them to the members: %w", err))
	}
	local, _ = s.spreadable(local)
	return newRecordSet(local...)
}

// intentLister is a Local that lists its standing intents without the
// rest of its records (the Journal).
type intentLister interface {
	StandingIntents(ctx context.Context) ([]Tombstone, error)
}

// standingIntents returns the local record's intents not revoked and not
// in flight; a record that cannot be read is reported and taken as empty.
func (s *Shared) standingIntents(ctx context.Context) recordSet {
	il, ok := s.local.(intentLister)
	if !ok {
		return s.localRecords(ctx).standingIntents()
	}
	ts, err := il.StandingIntents(ctx)
	if err != nil {
		s.report("", fmt.Errorf("read the local intents to copy them to the members: %w", err))
	}
	ts, _ = s.spreadable(ts)
	return newRecordSet(ts...)
}

// spreadTo merges add into the tombstone object of each of ms, in
// parallel. A member being caught up gets the records from its catch-up's
// plan (Snapshot).
func (s *Shared) spreadTo(ctx context.Context, ms []*slot.Slot, add recordSet) {
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Go(func() {
			if _, err := s.merge(ctx, m, add, nil); err != nil {
				s.spreadAll.Store(true)
				s.report(m.Name(), err)
			}
		})
	}
	wg.Wait()
}

// mergeObjects writes on m an object holding add with what m holds: with held
// (what was read from m just before) or on a member this process has not
// written to since its last re-login, the union of every object read,
// which it then removes; otherwise the union of this process's own last
// object there, which it replaces (see written). Nothing is written when
// the objects already hold every record of add.
func (s *Shared) mergeObjects(ctx context.Context, m *slot.Slot, add recordSet, held *memberRecords) (recordSet, error) {
	w := s.writtenOn(m)
	w.mu.Lock()
	defer w.mu.Unlock()
	epoch := m.Epoch()
	if held == nil && w.records != nil && w.epoch == epoch {
		add = add.settledAway(w.records)
		union := newRecordSet()
		union.addAll(w.records, s.cutoff())
		if !union.addAll(add, s.cutoff()) {
			return union, nil
		}
		return union, s.write(ctx, m, w, epoch, union, []state.Object{w.obj})
	}
	if held == nil { // as mergeRegister: the member gets what it lacks of the local record
		all := s.localRecords(ctx)
		all.addAll(add, time.Time{})
		add = all
	}
	held, err := s.heldOn(ctx, m, held, false)
	if err != nil {
		return nil, err
	}
	add = add.settledAway(held.records)
	union := held.records.clone()
	if !union.addAll(add, s.cutoff()) && len(held.objects) == 1 {
		return union, nil // nothing new, and nothing to fold together
	}
	if len(union) == 0 {
		return union, nil
	}
	// A member whose label refuses records may hold registers of other
	// writers: they stay, read by every reader; objects are folded.
	return union, s.write(ctx, m, w, epoch, union, held.objects)
}

// write stores union on m and removes the objects it folds in; w.mu must
// be held.
func (s *Shared) write(ctx context.Context, m *slot.Slot, w *written, epoch uint64, union recordSet, folded []state.Object) error {
	obj, err := state.Write(ctx, m, s.label, Application, encodeRecords(union.sorted()), folded)
	if obj.Handle != 0 || err == nil {
		w.epoch, w.obj, w.records = epoch, obj, union
	}
	if err != nil {
		return fmt.Errorf("tombstones of group %s: %w", s.serial, err)
	}
	return nil
}

// memberRecords is what one member holds.
type memberRecords struct {
	objects   []state.Object // tombstone objects of the created form (chunks)
	expired   []state.Object // of those, the ones holding no record within the horizon
	registers []register
	records   recordSet
	chunked   recordSet // the records of objects
	// light: only the registers were read (readAs); the chunks'
	// records are not in records.
	light bool
}

// read returns the tombstone records m holds (within the horizon), in
// objects of both forms: registers and created objects (written by a
// member refusing registers, or by an older build). An object that does
// not decode (one caught while another process writes it) is reported
// and left out, so that no write destroys content it never read.
func (s *Shared) read(ctx context.Context, m *slot.Slot) (memberRecords, error) {
	return s.readAs(ctx, m, false)
}

// readAs is read, or, light, without the chunks' content: what a
// destroy's first write on a member needs, at a cost bounded by the
// writers and the chunks' number rather than by the history.
func (s *Shared) readAs(ctx context.Context, m *slot.Slot, light bool) (memberRecords, error) {
	if !m.LoggedIn() {
		return memberRecords{}, fmt.Errorf("tombstones of group %s: member %s: %w", s.serial, m.Name(), state.ErrNotLoggedIn)
	}
	hs, err := state.Find(ctx, m, Application)
	if err != nil {
		return memberRecords{}, fmt.Errorf("tombstones of group %s: member %s: find: %w", s.serial, m.Name(), err)
	}
	out := memberRecords{records: recordSet{}, chunked: recordSet{}, light: light}
	cutoff := s.cutoff()
	for _, h := range hs {
		st, ok, err := state.Read(ctx, m, h, Application, !light)
		if err != nil {
			if slot.CodeOf(err) == pkcs11.CKR_OBJECT_HANDLE_INVALID {
				continue
			}
			return memberRecords{}, fmt.Errorf("tombstones of group %s: member %s: read object %d: %w", s.serial, m.Name(), h, err)
		}
		if !ok {
			continue // being written by another process (SoftHSM shows it half made), or not ours
		}
		label := st.Label
		if label == s.label {
			if !light {
				s.readObject(m, state.Object{Handle: h, Value: st.Value}, &out, cutoff)
			}
			continue
		}
		r, ts, ok, err := decodeRegister(s.label, label, s.serial)
		if !ok {
			continue // another group's
		}
		if err != nil {
			s.report(m.Name(), fmt.Errorf("tombstones of group %s: register %d: %w", s.serial, h, err))
			continue
		}
		r.handle, r.records = h, recordSet{}
		for _, t := range ts {
			r.records.add(t, cutoff)
		}
		out.records.addAll(r.records, time.Time{})
		out.registers = append(out.registers, r)
	}
	s.see(m, out.registers)
	return out, nil
}

// readObject adds a tombstone object of the created form to out.
func (s *Shared) readObject(m *slot.Slot, o state.Object, out *memberRecords, cutoff time.Time) {
	ts, err := decodeRecords(o.Value, s.serial)
	if err != nil {
		// Never destroyed on our account: its content is unknown.
		s.report(m.Name(), fmt.Errorf("tombstones of group %s: object %d: %w", s.serial, o.Handle, err))
		return
	}
	out.objects = append(out.objects, o)
	live := false
	for _, t := range ts {
		live = live || !t.Time.Before(cutoff)
		out.records.add(t, cutoff)
		out.chunked.add(t, cutoff)
	}
	if !live {
		out.expired = append(out.expired, o)
	}
}

// see notes when each register of m was first seen as it is now.
func (s *Shared) see(m *slot.Slot, rs []register) {
	now, epoch := s.opts.Now(), m.Epoch()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil {
		s.seen = map[seenKey]seenLabel{}
	}
	there := map[pkcs11.ObjectHandle]bool{}
	for _, r := range rs {
		there[r.handle] = true
	}
	for k := range s.seen {
		if k.m == m && (k.epoch != epoch || !there[k.handle]) {
			delete(s.seen, k)
		}
	}
	for _, r := range rs {
		k := seenKey{m, epoch, r.handle}
		if old, ok := s.seen[k]; !ok || old.label != r.label {
			s.seen[k] = seenLabel{label: r.label, since: now}
		}
	}
}

// foldable reports whether this process has seen another writer's
// register r unchanged on m for FoldAfter.
func (s *Shared) foldable(m *slot.Slot, r register, writer string) bool {
	if r.writer == writer {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	seen, ok := s.seen[seenKey{m, m.Epoch(), r.handle}]
	return ok && seen.label == r.label && s.opts.Now().Sub(seen.since) >= s.opts.FoldAfter
}

// Snapshot returns the tombstones within the horizon and not revoked: the
// union of the local record and of every member reached. A member that
// lacks some of them gets the union written (the tombstones replicate
// like the objects they protect); one that cannot be read is reported
// and left out — a destroy it alone saw is then not known until it is
// reached again.
func (s *Shared) Snapshot(ctx context.Context) (*Set, error) {
	local, err := s.local.Records(ctx)
	if err != nil {
		return nil, err
	}
	local, inFlight := s.spreadable(local)
	cutoff := s.cutoff()
	union := newRecordSet()
	union.addAll(newRecordSet(local...), cutoff)
	ms := s.slots(true)
	held := make([]*memberRecords, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() {
			h, err := s.read(ctx, m)
			if err != nil {
				s.report(m.Name(), err)
				return
			}
			held[i] = &h
		})
	}
	wg.Wait()
	for _, h := range held {
		if h != nil {
			union.addAll(h.records, cutoff)
		}
	}
	for i, m := range ms {
		if h := held[i]; h != nil && (!h.records.holds(union) || s.folds(ctx, m, h)) {
			wg.Go(func() {
				if _, err := s.merge(ctx, m, union, h); err != nil {
					s.report(m.Name(), err)
				}
			})
		}
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return NewSet(union.sorted()...).inFlight(inFlight), nil
}

func (s *Shared) cutoff() time.Time { return s.opts.Now().Add(-s.opts.Horizon) }

func (s *Shared) report(member string, err error) {
	if s.opts.OnError != nil {
		s.opts.OnError(member, err)
	}
}

// recordSet holds tombstones and revocations by identity, fingerprint and
// time; a revocation replaces its tombstone (records.add's rule).
type recordSet map[recordID]Tombstone

// recordID is a record's key in a recordSet: what keyOf names, and the
// time. A struct of the raw fields, not a formatted string: every write
// of a destroy rebuilds sets of every record within the horizon, and the
// strings were most of its CPU (docs/BENCHMARKS.md, "Write cost with
// history").
type recordID struct {
	class, keyType         uint
	id, label, fingerprint string
	intent                 bool
	at                     int64
}

func recordKey(t Tombstone) recordID {
	k := recordID{class: t.Identity.Class, keyType: t.Identity.KeyType, id: string(t.Identity.ID),
		label: t.Identity.Label, intent: t.Intent, at: t.Time.UnixNano()}
	if !t.Intent {
		k.fingerprint = string(t.Fingerprint)
	}
	return k
}

func newRecordSet(ts ...Tombstone) recordSet {
	r := make(recordSet, len(ts))
	for _, t := range ts {
		r.add(t, time.Time{})
	}
	return r
}

// add merges t unless it is older than cutoff, and reports whether that
// changed r.
func (r recordSet) add(t Tombstone, cutoff time.Time) bool {
	if t.Time.Before(cutoff) {
		return false
	}
	k := recordKey(t)
	old, ok := r[k]
	if ok && (old.Revoked || !t.Revoked) {
		return false
	}
	r[k] = t
	return true
}

// settledAway returns r without the intents settled in r (the intent and
// its revocation both there) that have does not hold: a creation answered
// never needs its intent on a member, and leaving such pairs out keeps
// the members' objects to the destroys and the unanswered creations. A
// revocation of an intent have holds (one published, then settled by a
// later creation of its identity) stays, so that it reaches the member.
func (r recordSet) settledAway(have ...recordSet) recordSet {
	out := recordSet{}
	for k, t := range r {
		if t.Intent && t.Revoked && !slices.ContainsFunc(have, func(h recordSet) bool { _, ok := h[k]; return ok }) {
			continue // the revocation replaced its intent in r (add)
		}
		out[k] = t
	}
	return out
}

// standingIntents returns the intents of r not revoked: creations never
// answered, which every member must know of.
func (r recordSet) standingIntents() recordSet {
	out := recordSet{}
	for k, t := range r {
		if t.Intent && !t.Revoked {
			out[k] = t
		}
	}
	return out
}

// missingFrom returns the records of r that adding to have would change:
// those no set of have holds, or holds unrevoked when r revokes them.
func (r recordSet) missingFrom(have ...recordSet) recordSet {
	out := recordSet{}
	for k, t := range r {
		if !slices.ContainsFunc(have, func(h recordSet) bool { old, ok := h[k]; return ok && (old.Revoked || !t.Revoked) }) {
			out[k] = t
		}
	}
	return out
}

// addAll merges every record of o and reports whether r changed.
func (r recordSet) addAll(o recordSet, cutoff time.Time) bool {
	changed := false
	for _, t := range o {
		if r.add(t, cutoff) {
			changed = true
		}
	}
	return changed
}

// holds reports whether r already has every record of o.
func (r recordSet) holds(o recordSet) bool {
	for k, t := range o {
		have, ok := r[k]
		if !ok || (t.Revoked && !have.Revoked) {
			return false
		}
	}
	return true
}

func (r recordSet) clone() recordSet {
	c := make(recordSet, len(r))
	for k, t := range r {
		c[k] = t
	}
	return c
}

func (r recordSet) sorted() []Tombstone {
	out := make([]Tombstone, 0, len(r))
	for _, t := range r {
		out = append(out, t)
	}
	sortTombstones(out)
	return out
}

// The member form: a magic, the records, and a CRC-32 of all that, so a
// torn read is recognised. Per record: flags, class, key type, CKA_ID,
// CKA_LABEL, fingerprint, time (Unix nanoseconds). About 50 bytes plus
// the CKA_ID and the label.
const recordsMagic = "HGT1"

const (
	flagRevoked = 1 << iota
	flagNoKeyType
	flagNoFingerprint
	flagIntent
)

func encodeRecords(ts []Tombstone) []byte {
	b := appendRecords([]byte(recordsMagic), ts)
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(b))
}

// appendRecords appends the records to b, each as the comment above says.
func appendRecords(b []byte, ts []Tombstone) []byte {
	for _, t := range ts {
		var f byte
		if t.Revoked {
			f |= flagRevoked
		}
		if t.Identity.KeyType == object.NoKeyType {
			f |= flagNoKeyType
		}
		if t.Fingerprint == nil {
			f |= flagNoFingerprint
		}
		if t.Intent {
			f |= flagIntent
		}
		b = append(b, f)
		b = binary.AppendUvarint(b, uint64(t.Identity.Class))
		if f&flagNoKeyType == 0 {
			b = binary.AppendUvarint(b, uint64(t.Identity.KeyType))
		}
		b = appendBytes(b, t.Identity.ID)
		b = appendBytes(b, []byte(t.Identity.Label))
		b = appendBytes(b, t.Fingerprint)
		b = binary.AppendVarint(b, t.Time.UnixNano())
	}
	return b
}

func appendBytes(b, v []byte) []byte {
	return append(binary.AppendUvarint(b, uint64(len(v))), v...)
}

var errTorn = errors.New("does not decode (torn, or not written by hagroup)")

func decodeRecords(b []byte, serial string) ([]Tombstone, error) {
	if len(b) < len(recordsMagic)+4 || !bytes.HasPrefix(b, []byte(recordsMagic)) {
		return nil, errTorn
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.ChecksumIEEE(body) != sum {
		return nil, errTorn
	}
	d := decoder{b: body[len(recordsMagic):]}
	return d.records(serial)
}

// records decodes the records up to the end of d.
func (d *decoder) records(serial string) ([]Tombstone, error) {
	var out []Tombstone
	for len(d.b) > 0 && d.err == nil {
		f := d.byte()
		t := Tombstone{GroupSerial: serial, Revoked: f&flagRevoked != 0, Intent: f&flagIntent != 0}
		t.Identity.Class = uint(d.uvarint())
		t.Identity.KeyType = object.NoKeyType
		if f&flagNoKeyType == 0 {
			t.Identity.KeyType = uint(d.uvarint())
		}
		t.Identity.ID = d.bytes()
		t.Identity.Label = string(d.bytes())
		t.Fingerprint = d.bytes()
		if f&flagNoFingerprint != 0 {
			t.Fingerprint = nil
		}
		t.Time = time.Unix(0, d.varint())
		out = append(out, t)
	}
	if d.err != nil {
		return nil, d.err
	}
	return out, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) byte() byte {
	if d.err != nil || len(d.b) == 0 {
		d.err = errTorn
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint() uint64 { return varint(d, binary.Uvarint) }
func (d *decoder) varint() int64   { return varint(d, binary.Varint) }

// varint takes the next varint off d with read (binary.Uvarint or
// binary.Varint).
func varint[T uint64 | int64](d *decoder, read func([]byte) (T, int)) T {
	if d.err != nil {
		return 0
	}
	v, n := read(d.b)
	if n <= 0 {
		d.err = errTorn
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil || n > uint64(len(d.b)) {
		d.err = errTorn
		return nil
	}
	v := make([]byte, n)
	copy(v, d.b[:n])
	d.b = d.b[n:]
	return v
}

// heldOn returns held, or what m holds read now when held is nil (its
// registers only with light: see readAs).
func (s *Shared) heldOn(ctx context.Context, m *slot.Slot, held *memberRecords, light bool) (*memberRecords, error) {
	if held != nil {
		return held, nil
	}
	h, err := s.readAs(ctx, m, light)
	if err != nil {
		return nil, err
	}
	return &h, nil
}
