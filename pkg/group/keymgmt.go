package group

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hagroup/hagroup/pkg/group/leftover"
	"github.com/hagroup/hagroup/pkg/group/vtable"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	hasync "github.com/hagroup/hagroup/pkg/sync"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/hagroup/hagroup/pkg/sync/tombstone"
	"github.com/miekg/pkcs11"
)

// Key management: objects are made on the primary (the first active member
// in configured order) and replicated to every other active and standby
// member, in parallel, before the call returns. A member that cannot take
// the object is failed (it catches up on recovery) and a ReplicationFailed
// event says why; the call succeeds while the primary holds the object.
// The primary is chosen, and failed over, by exec (attempt.go): a creation
// that has changed no member moves to the next primary, and one that
// failed leaves nothing on the member (makeOn, pkg/group/leftover).
//
// Identity must be unique among token objects: an object made with the
// CKA_CLASS, CKA_KEY_TYPE, CKA_ID and CKA_LABEL of an existing one is
// removed again and the call fails with CKR_TEMPLATE_INCONSISTENT, since
// members could not tell the two apart. An object with neither CKA_ID nor
// CKA_LABEL gets a random 16-byte CKA_ID (a data object, which has no
// CKA_ID, gets the label AnonymousLabelPrefix + 32 random hex digits); the
// halves of a key pair made
// without any CKA_ID get one shared random CKA_ID even when labelled.

// AnonymousLabelPrefix starts the CKA_LABEL the group gives a data object
// made with neither CKA_ID nor CKA_LABEL (data objects have no CKA_ID),
// followed by 32 random hex digits.
const AnonymousLabelPrefix = "hagroup-anon-"

// intent is what the group learned from an application template.
type intent struct {
	tmpl          []*pkcs11.Attribute
	class         uint
	classKnown    bool // class was given or read from the template (CKO_DATA is 0)
	token         bool
	unextractable bool
	explicitID    bool // the application named the object (CKA_ID or CKA_LABEL)
	genMech       uint // the generation mechanism, for GenerateKey and GenerateKeyPair (kindOf)
	generated     bool // genMech is set (CKM_RSA_PKCS_KEY_PAIR_GEN is 0)
	copied        bool // a copy of the one input (kindOf)
}

func attrIndex(tmpl []*pkcs11.Attribute, t uint) int {
	return slices.IndexFunc(tmpl, func(a *pkcs11.Attribute) bool { return a != nil && a.Type == t })
}

// hasValue reports whether tmpl sets attribute t to a non-empty value.
func hasValue(tmpl []*pkcs11.Attribute, t uint) bool {
	i := attrIndex(tmpl, t)
	return i >= 0 && len(tmpl[i].Value) > 0
}

func attrBool(tmpl []*pkcs11.Attribute, t uint) (v, ok bool) {
	if i := attrIndex(tmpl, t); i >= 0 {
		return len(tmpl[i].Value) > 0 && tmpl[i].Value[0] != 0, true
	}
	return false, false
}

func setAttr(tmpl []*pkcs11.Attribute, a *pkcs11.Attribute) []*pkcs11.Attribute {
	if i := attrIndex(tmpl, a.Type); i >= 0 {
		tmpl[i] = a
		return tmpl
	}
	return append(tmpl, a)
}

func randomID() ([]byte, error) {
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return nil, fmt.Errorf("random CKA_ID: %w", err)
	}
	return id, nil
}

// prepare copies tmpl and adapts it for the group. class is the class the
// operation makes (0: read CKA_CLASS from tmpl). id, when not nil, is the
// CKA_ID to give an object that has neither CKA_ID nor CKA_LABEL. from is
// the source of a copy (nil otherwise). A private or secret key gets the
// group's protection (protect).
func (g *Group) prepare(ctx context.Context, primary *member.Member, tmpl []*pkcs11.Attribute, class uint, id []byte, from *vtable.Object) (intent, error) {
	in := intent{tmpl: append([]*pkcs11.Attribute(nil), tmpl...), class: class, classKnown: class != 0}
	if i := attrIndex(tmpl, pkcs11.CKA_CLASS); i >= 0 && class == 0 {
		in.class, in.classKnown = ulong(tmpl[i].Value), true
	}
	in.token, _ = attrBool(tmpl, pkcs11.CKA_TOKEN)
	in.explicitID = hasValue(tmpl, pkcs11.CKA_ID) || hasValue(tmpl, pkcs11.CKA_LABEL)
	if !in.explicitID && id != nil {
		if in.classKnown && in.class == pkcs11.CKO_DATA {
			// Data objects have no CKA_ID: name them instead.
			in.tmpl = setAttr(in.tmpl, pkcs11.NewAttribute(pkcs11.CKA_LABEL, AnonymousLabelPrefix+hex.EncodeToString(id)))
		} else {
			in.tmpl = setAttr(in.tmpl, pkcs11.NewAttribute(pkcs11.CKA_ID, id))
		}
	}
	if in.class == pkcs11.CKO_PRIVATE_KEY || in.class == pkcs11.CKO_SECRET_KEY {
		if err := g.protect(ctx, primary, &in, tmpl, from); err != nil {
			return intent{}, err
		}
	}
	return in, nil
}

// domainTrusted reports whether the group's domain key on m is CKA_TRUSTED,
// so that keys made with CKA_WRAP_WITH_TRUSTED can still be replicated.
// The replicator keeps the answer for m's login epoch: no search per key.
func (g *Group) domainTrusted(ctx context.Context, m *member.Member) bool {
	trusted, err := g.rep.DomainKeyTrusted(ctx, m.Slot())
	return err == nil && trusted
}

// made is one object made on the primary.
type made struct {
	in  intent
	h   pkcs11.ObjectHandle
	obj object.Object
	// fresh: no object on the primary had the identity before the call
	// (leftover.Searches.Held), so no serving member, which holds what the
	// group holds, has it either.
	fresh bool
}

// createOn runs a key-management call on the primary and replicates what
// it made. do runs on the primary with the inputs resolved there; target
// is the primary's pooled slot for token objects or this session's
// physical session for session objects.
func (s *Session) createOn(ctx context.Context, op string, ins []intent, inputs []*vtable.Object,
	do func(ctx context.Context, target slotOps, hs []pkcs11.ObjectHandle) ([]pkcs11.ObjectHandle, error)) (_ []ObjectHandle, err error) {
	g := s.g
	if err := g.gate.Enter(); err != nil {
		return nil, err
	}
	defer g.gate.Leave()
	if err := usable(op, inputs); err != nil {
		return nil, err
	}
	done, err := g.beginWrite(ctx, op)
	if err != nil {
		return nil, err
	}
	defer done()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkOpen(op); err != nil {
		return nil, err
	}
	wrapped := false
	for _, in := range ins {
		// A class not known yet (an unwrapped or derived key without
		// CKA_CLASS) may be a key that travels wrapped.
		wrapped = wrapped || !in.classKnown || wrappedClass(in.class)
	}
	if err := g.checkHold(op, ins, inputs); err != nil {
		return nil, err
	}
	if err := g.checkReplicable(op, wrapped); err != nil {
		return nil, err
	}
	session := false
	for _, in := range ins {
		session = session || !in.token
	}
	left := newLeftovers(ins, inputs)
	var target slotOps
	var out []pkcs11.ObjectHandle
	pending := g.intend(ctx, op, ins) // write-ahead (intent.go)
	defer func() { g.settle(ctx, pending, err) }()
	p, err := g.exec(ctx, plan{
		op: op, objs: inputs,
		next: func(skip memberSet) *member.Member { return g.creator(wrapped, skip) },
		ready: func(ctx context.Context, m *member.Member) (err error) {
			target = m.Slot()
			if session {
				target, err = s.physSession(ctx, m)
			}
			return err
		},
	}, func(ctx context.Context, m *member.Member, sl *slot.Slot, hs []pkcs11.ObjectHandle) (err error) {
		var clean bool
		// (Abandoned in the module, the creation could make the object
		// after the leftover search looked for it.)
		out, clean, err = makeOn(ctx, op, sl, target, left, func() ([]pkcs11.ObjectHandle, error) { return do(sentWrite(ctx), target, hs) })
		pending.Attempted(err)
		if !clean && !session {
			g.keptLeftover(m, op, err)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	ms := make([]made, len(out))
	for i, h := range out {
		ms[i] = made{in: ins[i], h: h, fresh: !left.Held(i)}
	}
	undo := func() {
		for _, m := range ms {
			if err := target.DestroyObject(context.WithoutCancel(ctx), m.h); err != nil && m.in.token && !gone(err) {
				g.keptLeftover(p, op, err)
			}
		}
	}
	for i := range ms {
		var obj object.Object
		if _, err := g.call(ctx, p, func() (err error) {
			obj, err = object.ReadObject(ctx, p.Slot(), ms[i].h)
			return err
		}); err != nil {
			undo()
			return nil, opErr(op, p.Name(), err)
		}
		ms[i].obj = obj
		// The search before the call (makeOn) found no object of the
		// identity: none is looked for again, since on a token whose
		// search visits every object (SoftHSM) each search costs what the
		// token holds. What it may miss is a creation of the same identity
		// by another process at the same moment (docs/DESIGN.md, "Creation").
		if obj.Token && ms[i].in.explicitID && !ms[i].fresh {
			var dup []pkcs11.ObjectHandle
			if _, err := g.call(ctx, p, func() (err error) {
				dup, err = p.Slot().FindObjects(ctx, object.TokenTemplate(obj.Identity))
				return err
			}); err != nil {
				undo()
				return nil, opErr(op, p.Name(), err)
			}
			if len(dup) > 1 {
				undo()
				return nil, &Error{Code: pkcs11.CKR_TEMPLATE_INCONSISTENT, Op: op, Member: p.Name(),
					msg: "an object with identity " + obj.Identity.String() + " already exists; identities must be unique in an HA group"}
			}
		}
	}

	revived := g.revive(ctx, ms)

	// The virtual entries, before replication so that the physical handles
	// can be recorded as they come.
	vs := make([]*vtable.Object, len(ms))
	for i, m := range ms {
		var o *vtable.Object
		if m.obj.Token {
			var created bool
			o, created = g.objs.Intern(m.obj.Identity)
			if !created {
				// A stale entry (the object was destroyed behind our back
				// and is now made again): start it afresh.
				g.objs.Remove(o)
				o, _ = g.objs.Intern(m.obj.Identity)
			}
			o.Set(p.Index(), p.Epoch(), m.h)
		} else {
			o = g.objs.AddSessionObject(m.obj.Identity)
			g.objs.SetSessionPhys(o, p, m.h)
			s.objects[o.Handle] = o
		}
		o.SetFingerprint(m.obj.Fingerprint)
		if m.in.unextractable {
			o.Unextractable.Store(true)
		}
		vs[i] = o
	}
	// (Cut short, the copies would fail as refusals of the members not
	// reached yet.)
	if err := g.replicate(sentWrite(ctx), s, p, ms, vs); err != nil {
		var rs hasync.Refusals
		if errors.As(err, &rs) {
			err = g.refuse(op, rs)
		}
		// The primary cannot export what it made (say, a key type its
		// token will not wrap): the object cannot be highly available, so
		// it is not made at all.
		for _, o := range vs {
			g.objs.Remove(o)
			if !o.Token {
				delete(s.objects, o.Handle)
			}
		}
		undo()
		g.rebury(ctx, revived)
		return nil, opErr(op, p.Name(), err)
	}
	res := make([]ObjectHandle, len(vs))
	for i, o := range vs {
		res[i] = o.Handle
	}
	g.changes.Add(uint64(len(vs)))
	return res, nil
}

// revive revokes the tombstones of the token objects in ms, just made on
// the primary: an object made again through the group with the
// identity and fingerprint of one destroyed before (a public key imported
// again, a key unwrapped again from the same blob) is alive, and a plan,
// which deletes a tombstoned version wherever it remains, must leave it
// alone. It runs before the replication, so that the new object's copies
// are never taken for the destroyed one's. A revocation that cannot be
// recorded does not fail the creation; a TombstoneFailed event says that
// a catch-up may delete the object. It returns the objects whose
// tombstones it revoked: should the creation be undone, they are
// destroyed again and get a tombstone again.
func (g *Group) revive(ctx context.Context, ms []made) []object.Object {
	r, ok := g.tombstones.(Reviver)
	if !ok {
		return nil
	}
	var out []object.Object
	for _, m := range ms {
		if !m.obj.Token || m.obj.Fingerprint == nil {
			continue
		}
		n, err := r.Revive(context.WithoutCancel(ctx), m.obj.Identity, m.obj.Fingerprint)
		if err != nil {
			g.emit(Event{Kind: TombstoneFailed, Object: m.obj.Identity, Fingerprint: m.obj.Fingerprint,
				Err: fmt.Errorf("made again through the group, but the tombstone of its earlier destroy could not be revoked (a catch-up may delete it): %w", err)})
		}
		if n > 0 {
			out = append(out, m.obj)
		}
	}
	return out
}

// rebury records a tombstone again for each of objs, whose tombstones
// revive revoked for a creation that was then undone: the object is
// destroyed again, and copies of it on a member that was away must not
// come back.
func (g *Group) rebury(ctx context.Context, objs []object.Object) {
	for _, o := range objs {
		t := tombstone.Tombstone{Identity: o.Identity, Fingerprint: o.Fingerprint, Time: time.Now(), GroupSerial: g.serial}
		if err := g.tombstones.Record(context.WithoutCancel(ctx), t); err != nil {
			g.emit(Event{Kind: TombstoneFailed, Object: t.Identity, Fingerprint: t.Fingerprint, Err: err})
		}
	}
}

// makeOn runs do, a creation on member slot sl (target: sl or this
// session's physical session there), and leaves nothing behind when it
// fails (see pkg/group/leftover). One ambiguous answer (CKR_GENERAL_ERROR:
// SoftHSM 2.6's now and then to a creation that overlaps another on the
// token) is tried again once the member holds nothing of it, on SoftHSM
// only (retriesAmbiguous). A failure
// after which the member may keep a key of its own making (it did not
// answer, or a hung generation may still finish) is final (stop): made
// again elsewhere under the same identity it would be a second, different
// key. A request that was never sent (slot.ErrNotSent: the member's server
// was already gone) made nothing, and the generation fails over. Other creations (an import, an unwrap, a derivation, a copy) make
// the same object wherever they run, so exec may try them on the next
// member. clean reports whether the member is known to hold nothing of a
// failed call.
func makeOn(ctx context.Context, op string, sl *slot.Slot, target slotOps, left leftover.Searches,
	do func() ([]pkcs11.ObjectHandle, error)) (_ []pkcs11.ObjectHandle, clean bool, _ error) {
	if err := left.Snapshot(ctx, sl); err != nil {
		return nil, true, err
	}
	for again := false; ; again = true {
		out, err := do()
		if err == nil {
			return out, true, nil
		}
		// A request that never reached the member left nothing there. A
		// member that did not answer is not asked again: what it may hold
		// stays unknown.
		clean := errors.Is(err, slot.ErrNotSent) ||
			!errors.Is(err, slot.ErrTimeout) && left.Remove(context.WithoutCancel(ctx), sl, target)
		switch {
		case slot.ClassOf(err) != slot.ClassHealth:
			return nil, clean, err
		case member.HeldBack(err) && clean && !again && ctx.Err() == nil && retriesAmbiguous(sl):
			continue // not charged yet (member.Charged): asked again first
		case !clean && (op == "GenerateKey" || op == "GenerateKeyPair"):
			return nil, clean, &stop{err}
		}
		return nil, clean, err
	}
}

// slotOps is what key management needs from a pooled slot or a session.
type slotOps interface {
	CreateObject(ctx context.Context, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error)
	CopyObject(ctx context.Context, h pkcs11.ObjectHandle, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error)
	DestroyObject(ctx context.Context, h pkcs11.ObjectHandle) error
	GenerateKey(ctx context.Context, m *pkcs11.Mechanism, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error)
	GenerateKeyPair(ctx context.Context, m *pkcs11.Mechanism, pub, priv []*pkcs11.Attribute) (pkcs11.ObjectHandle, pkcs11.ObjectHandle, error)
	UnwrapKey(ctx context.Context, m *pkcs11.Mechanism, unwrapping pkcs11.ObjectHandle, blob []byte, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error)
	DeriveKey(ctx context.Context, m *pkcs11.Mechanism, base pkcs11.ObjectHandle, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error)
}

// replicate copies the objects made on primary p to every other serving
// member in parallel. s.mu held (session objects go into s's physical
// sessions). A target that fails is failed and reported. When the primary
// itself refuses to export an object (a request error on the primary's
// side, such as CKR_KEY_NOT_WRAPPABLE), no member can ever get it: every
// copy made is taken back, no member is failed, and the error is returned.
// A target that cannot hold an object (capability.go; one that joined
// after createOn's check) or refuses its copy as a request makes nothing
// stay anywhere: every copy is taken back and a Refusals error returned.
func (g *Group) replicate(ctx context.Context, s *Session, p *member.Member, ms []made, vs []*vtable.Object) error {
	var targets []*member.Member
	for _, m := range g.serving() {
		if m != p {
			targets = append(targets, m)
		}
	}
	if len(targets) == 0 {
		return nil
	}
	if rs := g.targetsCannotHold(p, targets, ms); rs != nil {
		return rs
	}
	// Physical sessions for session objects are opened here, under s.mu,
	// before the goroutines start.
	// A target is not searched for an identity the primary did not hold
	// before the call (made.fresh): a serving member holds what the group
	// holds, and each search of a SoftHSM token visits all its objects.
	absent := true
	for _, m := range ms {
		absent = absent && m.fresh
	}
	dsts := make([]hasync.Target, len(targets))
	errs := make([]error, len(targets))
	for i, t := range targets {
		dsts[i] = hasync.Target{Slot: t.Slot(), Absent: absent}
		if !ms[0].obj.Token {
			// A new session object is new on every member, even where its
			// identity is another's (a copy keeps its source's): looking
			// for an existing one would take the source for it.
			dsts[i].Absent = true
			ps, err := s.physSession(ctx, t)
			if err != nil {
				errs[i] = err
				continue
			}
			dsts[i].Session = ps
		}
	}
	// Every target at once (token object creation is slow on some
	// tokens: SoftHSM's file store waits on the disk), each object read
	// and wrapped on the primary once for them all.
	made := make([]pkcs11.ObjectHandle, len(ms))
	for j, m := range ms {
		made[j] = m.h
	}
	src := g.rep.Share(p.Slot(), made)
	copies := make([][]pkcs11.ObjectHandle, len(targets))
	failedAt := make([]int, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		copies[i] = make([]pkcs11.ObjectHandle, len(ms))
		if errs[i] != nil {
			continue
		}
		wg.Go(func() { failedAt[i], errs[i] = g.copyTo(ctx, t, dsts[i], src, copies[i]) })
	}
	wg.Wait()
	src.Close(ctx)
	takeBack := func(i int) {
		for _, h := range copies[i] {
			if h == 0 {
				continue
			}
			if err := g.destroyIn(context.WithoutCancel(ctx), dsts[i], h); err != nil && dsts[i].Session == nil && !gone(err) {
				g.keptLeftover(targets[i], "replication", err)
			}
		}
		copies[i] = nil
	}
	// A refusal by the primary shows in any copy's error.
	for _, err := range errs {
		if err != nil && sourceRefused(err, p) {
			for k := range targets {
				takeBack(k)
			}
			return err
		}
	}
	// So does a target's refusal: the object cannot be on every member.
	if rs := targetsRefused(targets, errs, ms, failedAt); rs != nil {
		for k := range targets {
			takeBack(k)
		}
		return rs
	}
	// The primary died under the copies and no other member got the
	// object whole: nobody serving holds it, so it is not made as far as
	// the caller can tell (CKR_DEVICE_ERROR; the object may remain on the
	// failed primary, as after any creation cut short by its death).
	var sourceErr error
	holder := -1
	for i := range targets {
		switch {
		case errs[i] != nil && sourceUnwell(errs[i], p) && sourceErr == nil:
			sourceErr = errs[i]
		case errs[i] == nil && holder < 0:
			holder = i
		}
	}
	held := holder >= 0
	if sourceErr != nil && held && ms[0].obj.Token {
		// Another member holds the objects whole: the targets the
		// primary died under get them from it, rather than staying in
		// rotation without them (a search routed there would not find
		// a key the caller was just given), read and wrapped there
		// once for them all.
		h := g.rep.Share(targets[holder].Slot(), copies[holder])
		for i := range targets {
			if errs[i] == nil || !sourceUnwell(errs[i], p) {
				continue
			}
			dsts[i].Absent = false // the failed copy may have got there after all
			failedAt[i], errs[i] = g.copyTo(ctx, targets[i], dsts[i], h, copies[i])
		}
		h.Close(ctx)
		g.failMember(p, fmt.Errorf("replication source: %w", sourceErr))
	}
	if sourceErr != nil && !held {
		for k := range targets {
			takeBack(k)
		}
		g.failMember(p, fmt.Errorf("replication source: %w", sourceErr))
		return fmt.Errorf("the primary failed before another member held a copy: %w", sourceErr)
	}
	if err := unservedCopy(errs); err != nil {
		// The rule (member.Charged): an ambiguous answer charges a target
		// only once another target served the same copy. None did: the
		// request's fault; nothing is made, and only a target that
		// answered clearly unwell is failed.
		for k, t := range targets {
			takeBack(k)
			if errs[k] != nil && !member.HeldBack(errs[k]) && !sourceUnwell(errs[k], p) {
				g.replicationFailed(t, ms[failedAt[k]].obj.Identity, errs[k])
			}
		}
		return err
	}
	sourceFailed := false
	for i, t := range targets {
		if errs[i] != nil {
			// Take back the other half of a key pair so the member holds
			// all or nothing; recovery brings it in whole.
			takeBack(i)
			if sourceUnwell(errs[i], p) {
				// The primary died under the copy: the target is not at
				// fault and stays in rotation; the primary is failed, and
				// a catch-up brings the object to the target later.
				g.emit(Event{Kind: ReplicationFailed, Member: t.Name(), Object: ms[failedAt[i]].obj.Identity, Err: errs[i]})
				if !sourceFailed {
					sourceFailed = true
					g.failMember(p, fmt.Errorf("replication source of %v: %w", ms[failedAt[i]].obj.Identity, errs[i]))
				}
				continue
			}
			g.replicationFailed(t, ms[failedAt[i]].obj.Identity, errs[i])
			continue
		}
		for j, m := range ms {
			if m.obj.Token {
				vs[j].Set(t.Index(), t.Epoch(), copies[i][j])
			} else {
				g.objs.SetSessionPhys(vs[j], t, copies[i][j])
			}
			t.AddReplication()
			g.emit(Event{Kind: ObjectReplicated, Member: t.Name(), Object: m.obj.Identity, Fingerprint: m.obj.Fingerprint})
		}
	}
	return nil
}

// copyTo copies the objects of src to target t (dst), into copies, but
// none copied already. One target's objects go one
// after the other (one physical session takes one call at a time, and
// pkg/sync makes one copy into a token at a time anyway), in the order
// made — the public half of a key pair first — and none after a failure:
// a target that dies under the copies keeps at most a public key, whose
// fingerprint its recovery can read, never a private key without its
// public half, which SoftHSM will not fingerprint and which a recovery
// then takes for a different key under the same identity. An ambiguous
// answer (CKR_GENERAL_ERROR: SoftHSM's now and then to a creation that
// overlaps another on the token) gets one more try on SoftHSM
// (retriesAmbiguous); a failed copy leaves
// nothing behind, and a second try finds a copy the first one made after
// all. The second try (hasync.Shared.CopyAgain) reuses the source's
// shared reads and wrap when they succeeded (the answer was the
// target's, and the blob is the same for every target), and reads and
// wraps the source afresh when they failed: the ambiguous answer was
// then the primary's, and the shared source would only give back its
// kept failure. It returns the index of the object that failed and its
// error.
func (g *Group) copyTo(ctx context.Context, t *member.Member, dst hasync.Target, src *hasync.Shared, copies []pkcs11.ObjectHandle) (int, error) {
	for j := range copies {
		try := src.Copy
		for again := false; copies[j] == 0; again, try = true, src.CopyAgain {
			start := t.Begin()
			c, err := try(ctx, j, dst)
			t.End(start, err)
			if err != nil && (again || !member.HeldBack(err) || ctx.Err() != nil || !retriesAmbiguous(t.Slot())) {
				return j, err
			}
			copies[j] = c
		}
	}
	return 0, nil
}

// unservedCopy returns a target's answer that the rule holds back
// (member.HeldBack) when no target took the copy, nil otherwise.
func unservedCopy(errs []error) error {
	if slices.Contains(errs, nil) {
		return nil // served
	}
	for _, err := range errs {
		if member.HeldBack(err) {
			return err
		}
	}
	return nil
}

// sourceUnwell reports whether a replication error is the primary p
// failing for a health reason (killed, hung) while being read or wrapped:
// the fault is the source's, not the target's.
func sourceUnwell(err error, p *member.Member) bool {
	var se *slot.Error
	return errors.As(err, &se) && se.Member == p.Name() && member.Charged(err, false)
}

// sourceRefused reports whether a replication error is the primary p
// refusing the request (not a target failing, not p being unwell): an
// answer the rule does not charge to p (member.Charged: no other member
// served the same read), or the primary's domain key failing its audit.
func sourceRefused(err error, p *member.Member) bool {
	var se *slot.Error
	var we *domainkey.WeakError
	if errors.As(err, &we) {
		// The primary's domain key is weak: nothing leaves it.
		return we.Member == p.Name()
	}
	return errors.As(err, &se) && se.Member == p.Name() && !member.Charged(err, false)
}

// destroyIn takes back a copy made on dst (errors ignored: the copy is
// made again or removed by the member's next catch-up).
func (g *Group) destroyIn(ctx context.Context, dst hasync.Target, h pkcs11.ObjectHandle) error {
	if dst.Session != nil {
		return dst.Session.DestroyObject(ctx, h)
	}
	return dst.Slot.DestroyObject(ctx, h)
}

// keptLeftover fails m, which may still hold a token object that a
// creation failing with err made there and could not take back: in
// rotation it would serve an object the group never made, and a catch-up
// of another member would spread it. Out of rotation, its recovery
// deletes what the creation left (the creation's intents are published:
// tombstone.Pending.End), before it serves again.
func (g *Group) keptLeftover(m *member.Member, op string, err error) {
	g.failMember(m, fmt.Errorf("%s failed and what it made could not be taken back: %w", op, err))
}

// gone reports whether err says the object is not there to destroy.
func gone(err error) bool {
	switch CodeOf(err) {
	case pkcs11.CKR_OBJECT_HANDLE_INVALID, pkcs11.CKR_KEY_HANDLE_INVALID:
		return true
	}
	return false
}

// replicationFailed reports the failure and fails the member: it no longer
// holds what the group holds, so it must not serve until recovery has
// brought it up to date.
func (g *Group) replicationFailed(m *member.Member, id object.Identity, err error) {
	g.emit(Event{Kind: ReplicationFailed, Member: m.Name(), Object: id, Err: err})
	g.failMember(m, fmt.Errorf("replication of %v: %w", id, err))
}

// intent adapts tmpl for the group (Group.prepare) on the primary.
func (s *Session) intent(ctx context.Context, op string, tmpl []*pkcs11.Attribute, class uint, id []byte, from *vtable.Object) (intent, error) {
	p := s.g.primary()
	if p == nil {
		return intent{}, wrap(ErrNoMember, op, "", nil)
	}
	return s.g.prepare(ctx, p, tmpl, class, id, from)
}

// createOne makes one object by do (see createOn) from tmpl, of class
// (0: the template's), an unnamed one under a random CKA_ID.
func (s *Session) createOne(ctx context.Context, op string, tmpl []*pkcs11.Attribute, class uint, inputs []*vtable.Object,
	do func(ctx context.Context, t slotOps, in intent, hs []pkcs11.ObjectHandle) (pkcs11.ObjectHandle, error)) (ObjectHandle, error) {
	id, err := randomID()
	if err != nil {
		return 0, err
	}
	in, err := s.intent(ctx, op, tmpl, class, id, nil)
	if err != nil {
		return 0, err
	}
	return s.createIntent(ctx, op, in, inputs, do)
}

func (s *Session) createIntent(ctx context.Context, op string, in intent, inputs []*vtable.Object,
	do func(ctx context.Context, t slotOps, in intent, hs []pkcs11.ObjectHandle) (pkcs11.ObjectHandle, error)) (ObjectHandle, error) {
	hs, err := s.createOn(ctx, op, []intent{in}, inputs, func(ctx context.Context, t slotOps, hs []pkcs11.ObjectHandle) ([]pkcs11.ObjectHandle, error) {
		h, err := do(ctx, t, in, hs)
		return []pkcs11.ObjectHandle{h}, err
	})
	if err != nil {
		return 0, err
	}
	return hs[0], nil
}

// CreateObject makes an object from tmpl on the primary and replicates it.
func (s *Session) CreateObject(ctx context.Context, tmpl []*pkcs11.Attribute) (ObjectHandle, error) {
	return s.createOne(ctx, "CreateObject", tmpl, 0, nil, func(ctx context.Context, t slotOps, in intent, _ []pkcs11.ObjectHandle) (pkcs11.ObjectHandle, error) {
		return t.CreateObject(ctx, in.tmpl)
	})
}

// GenerateKey generates a secret key on the primary and replicates it.
func (s *Session) GenerateKey(ctx context.Context, mech *pkcs11.Mechanism, tmpl []*pkcs11.Attribute) (ObjectHandle, error) {
	id, err := randomID()
	if err != nil {
		return 0, err
	}
	in, err := s.intent(ctx, "GenerateKey", tmpl, pkcs11.CKO_SECRET_KEY, id, nil)
	if err != nil {
		return 0, err
	}
	in.genMech, in.generated = mechType(mech), true
	return s.createIntent(ctx, "GenerateKey", in, nil, func(ctx context.Context, t slotOps, in intent, _ []pkcs11.ObjectHandle) (pkcs11.ObjectHandle, error) {
		return t.GenerateKey(ctx, mech, in.tmpl)
	})
}

// GenerateKeyPair generates a key pair on the primary and replicates both
// halves (all or nothing per member).
func (s *Session) GenerateKeyPair(ctx context.Context, mech *pkcs11.Mechanism, pub, priv []*pkcs11.Attribute) (ObjectHandle, ObjectHandle, error) {
	const op = "GenerateKeyPair"
	id, err := randomID()
	if err != nil {
		return 0, 0, err
	}
	pin, err := s.intent(ctx, op, pub, pkcs11.CKO_PUBLIC_KEY, id, nil)
	if err != nil {
		return 0, 0, err
	}
	prin, err := s.intent(ctx, op, priv, pkcs11.CKO_PRIVATE_KEY, id, nil)
	if err != nil {
		return 0, 0, err
	}
	switch {
	case hasValue(pub, pkcs11.CKA_ID) && !hasValue(priv, pkcs11.CKA_ID):
		prin.tmpl = setAttr(prin.tmpl, pub[attrIndex(pub, pkcs11.CKA_ID)])
	case hasValue(priv, pkcs11.CKA_ID) && !hasValue(pub, pkcs11.CKA_ID):
		pin.tmpl = setAttr(pin.tmpl, priv[attrIndex(priv, pkcs11.CKA_ID)])
	case !hasValue(pub, pkcs11.CKA_ID) && !hasValue(priv, pkcs11.CKA_ID):
		// Pair the halves by one CKA_ID (the one the application gave
		// either half, else a random one, even when the halves are
		// labelled): tokens that hide the public key of a private key
		// (SoftHSM for EC) let the group fingerprint the private half only
		// through its public half with the same CKA_ID.
		pin.tmpl = setAttr(pin.tmpl, pkcs11.NewAttribute(pkcs11.CKA_ID, id))
		prin.tmpl = setAttr(prin.tmpl, pkcs11.NewAttribute(pkcs11.CKA_ID, id))
	}
	pin.genMech, prin.genMech = mechType(mech), mechType(mech)
	pin.generated, prin.generated = true, true
	hs, err := s.createOn(ctx, op, []intent{pin, prin}, nil, func(ctx context.Context, t slotOps, _ []pkcs11.ObjectHandle) ([]pkcs11.ObjectHandle, error) {
		a, b, err := t.GenerateKeyPair(ctx, mech, pin.tmpl, prin.tmpl)
		return []pkcs11.ObjectHandle{a, b}, err
	})
	if err != nil {
		return 0, 0, err
	}
	return hs[0], hs[1], nil
}

// CopyObject copies an object on the primary (with tmpl's changes) and
// replicates the copy. A token copy must differ from its source in CKA_ID
// or CKA_LABEL (identities are unique).
func (s *Session) CopyObject(ctx context.Context, h ObjectHandle, tmpl []*pkcs11.Attribute) (ObjectHandle, error) {
	src, err := s.g.object("CopyObject", h)
	if err != nil {
		return 0, err
	}
	class := src.Identity().Class
	in, err := s.intent(ctx, "CopyObject", tmpl, class, nil, src)
	if err != nil {
		return 0, err
	}
	if _, set := attrBool(tmpl, pkcs11.CKA_TOKEN); !set {
		in.token = src.Token
	}
	if !in.classKnown {
		// The copy has its source's class (CKO_DATA is 0).
		in.class, in.classKnown = class, true
	}
	in.explicitID = true // the copy keeps the source's identity unless tmpl changes it
	in.copied = true
	return s.createIntent(ctx, "CopyObject", in, []*vtable.Object{src}, func(ctx context.Context, t slotOps, in intent, hs []pkcs11.ObjectHandle) (pkcs11.ObjectHandle, error) {
		return t.CopyObject(ctx, hs[0], in.tmpl)
	})
}

// UnwrapKey unwraps blob under unwrapping on the primary and replicates the
// new key.
func (s *Session) UnwrapKey(ctx context.Context, mech *pkcs11.Mechanism, unwrapping ObjectHandle, blob []byte, tmpl []*pkcs11.Attribute) (ObjectHandle, error) {
	uk, err := s.g.key("UnwrapKey", unwrapping, argUnwrapping)
	if err != nil {
		return 0, err
	}
	return s.createOne(ctx, "UnwrapKey", tmpl, 0, []*vtable.Object{uk}, func(ctx context.Context, t slotOps, in intent, hs []pkcs11.ObjectHandle) (pkcs11.ObjectHandle, error) {
		return t.UnwrapKey(ctx, mech, hs[0], blob, in.tmpl)
	})
}

// DeriveKey derives a key from base on the primary and replicates it.
func (s *Session) DeriveKey(ctx context.Context, mech *pkcs11.Mechanism, base ObjectHandle, tmpl []*pkcs11.Attribute) (ObjectHandle, error) {
	bk, err := s.g.key("DeriveKey", base, argOpKey)
	if err != nil {
		return 0, err
	}
	return s.createOne(ctx, "DeriveKey", tmpl, pkcs11.CKO_SECRET_KEY, []*vtable.Object{bk}, func(ctx context.Context, t slotOps, in intent, hs []pkcs11.ObjectHandle) (pkcs11.ObjectHandle, error) {
		return t.DeriveKey(ctx, mech, hs[0], in.tmpl)
	})
}

// writeObject enters the group, finds the usable object h and takes the
// write barrier, for a change of h on every member; done releases both.
func (g *Group) writeObject(ctx context.Context, op string, h ObjectHandle) (*vtable.Object, func(), error) {
	if err := g.gate.Enter(); err != nil {
		return nil, nil, err
	}
	o, err := g.object(op, h)
	if err == nil {
		err = usable(op, []*vtable.Object{o})
	}
	if err != nil {
		g.gate.Leave()
		return nil, nil, err
	}
	release, err := g.beginWrite(ctx, op)
	if err != nil {
		g.gate.Leave()
		return nil, nil, err
	}
	return o, func() { release(); g.gate.Leave() }, nil
}

// DestroyObject destroys an object on every serving member that holds it:
// first on one member (a refusal such as CKR_ACTION_PROHIBITED is returned
// as it is and nothing else is touched), then on the others in parallel.
// A member that fails to destroy it is failed (recovery removes it there).
// A second copy of a token object on a member (see destroyCopies) goes
// too. Token objects leave a tombstone (Options.Tombstones) so that a member
// that was away cannot bring the object back. The tombstone is recorded
// before the first member's destroy: a catch-up in another process that
// lists the members while the destroy is under way must find it, or it
// would take the object, gone from the member that served it but still
// on one that was away, for one to copy back everywhere. When the destroy
// then does not happen (the first member refuses it, the object is in
// conflict, every member fails), the tombstone is revoked: this destroy
// removed nothing, and a later catch-up must not delete the object on its
// account. When no serving member holds the object the tombstone stands:
// the object is gone, perhaps deleted by a catch-up that honoured this
// very tombstone, and copies on members that were away must not come
// back; the destroy then succeeds when its tombstone was recorded, and
// returns CKR_OBJECT_HANDLE_INVALID when it was not. (A revocation
// cancels this tombstone only, never another process's tombstone of the
// same object.)
func (g *Group) DestroyObject(ctx context.Context, h ObjectHandle) error {
	const op = "DestroyObject"
	o, done, err := g.writeObject(ctx, op, h)
	if err != nil {
		return err
	}
	defer done()
	if err := g.untold(op); err != nil {
		return err
	}
	var ahead tombstone.Tombstone
	recorded, destroyed := false, false
	if o.Token {
		ahead = tombstone.Tombstone{Identity: o.Identity(), Fingerprint: o.Fingerprint(), Time: time.Now(), GroupSerial: g.serial}
		// Should this fail, the destroy goes on and the record is tried
		// again once it is done.
		recorded = g.tombstones.Record(context.WithoutCancel(ctx), ahead) == nil
		defer func() {
			if recorded && !destroyed {
				g.revokeTombstone(ctx, ahead)
			}
		}()
	}
	destroyedOn := func(m *member.Member) {
		g.emit(Event{Kind: ObjectDestroyed, Member: m.Name(), Object: o.Identity(), Fingerprint: o.Fingerprint()})
	}
	err = g.writeAll(ctx, op, o, g.destroyAttempt(o), destroyedOn)
	if errors.Is(err, ErrObjectHandle) && recorded {
		// No serving member holds it, and this destroy's tombstone
		// stands: what was asked is done. It may be gone on that very
		// tombstone's account (a catch-up that read it deleted the object
		// before this destroy reached a member), which a bare token never
		// shows, so the answer is the bare token's CKR_OK (DESIGN.md,
		// "Differences from the member token").
		err = nil
	}
	if errors.Is(err, ErrObjectHandle) {
		// No serving member holds it, and no tombstone of this destroy
		// was recorded: the object is gone and stays gone (revoking
		// nothing brings it back from a member that was away).
		destroyed = true
		g.objs.Remove(o)
		return err
	}
	if err != nil {
		return err
	}
	destroyed = true
	g.objs.Remove(o)
	g.changes.Add(1)
	if o.Token {
		g.forgetSkipped(o.Identity())
		if !recorded {
			t := ahead
			t.Time = time.Now()
			if err := g.tombstones.Record(context.WithoutCancel(ctx), t); err != nil {
				g.emit(Event{Kind: TombstoneFailed, Object: t.Identity, Fingerprint: t.Fingerprint, Err: err})
			}
		}
	}
	return nil
}

// revokeTombstone revokes the tombstone t, recorded ahead of a destroy
// that did not happen. Should that fail, a catch-up may delete the object
// on every member that holds it where some member lacks it: a
// TombstoneFailed event says so.
func (g *Group) revokeTombstone(ctx context.Context, t tombstone.Tombstone) {
	if err := g.tombstones.Record(context.WithoutCancel(ctx), t.Revocation()); err != nil {
		g.emit(Event{Kind: TombstoneFailed, Object: t.Identity, Fingerprint: t.Fingerprint,
			Err: fmt.Errorf("the destroy did not happen, but its tombstone, recorded ahead, could not be revoked (a catch-up may delete the object): %w", err)})
	}
}

// destroyAttempt destroys o on one member, and any second copy of it
// there (destroyCopies). A handle the member no longer knows
// (CKR_OBJECT_HANDLE_INVALID: destroyed there meanwhile, by another
// process's destroy or a recovery applying a tombstone, or a stale cached
// handle) is looked up again by exec; a member that no longer holds the
// object is skipped.
func (g *Group) destroyAttempt(o *vtable.Object) attempt {
	return func(ctx context.Context, m *member.Member, s *slot.Slot, hs []pkcs11.ObjectHandle) error {
		if err := s.DestroyObject(ctx, hs[0]); err != nil {
			return err
		}
		g.destroyCopies(ctx, o, m)
		return nil
	}
}

// destroyCopies destroys, after o's destroy on token member m, any other
// copy of o that m still holds: an object with o's identity and o's
// fingerprint (or none that the member can compute: a SoftHSM EC private
// key whose public half is gone). A catch-up in another process can leave
// such a second copy: its listing of m predated the replication that put
// o there, so it copied o to m too (a copy to a member the listing showed
// without the object does not search it first). The destroy would leave that copy behind, on a member whose
// tombstone then names an object it still holds. Objects of the identity
// with other key material (a conflict) are left alone. It is best effort:
// o is destroyed on m already; a member that fails here is failed, and
// its recovery deletes what remains under the tombstone.
func (g *Group) destroyCopies(ctx context.Context, o *vtable.Object, m *member.Member) {
	id, want := o.Identity(), o.Fingerprint()
	if !o.Token || want == nil {
		// Without o's fingerprint a second object of the identity could
		// be another key (a conflict): left to the plan, which deletes
		// the tombstoned version.
		return
	}
	var hs []pkcs11.ObjectHandle
	if _, err := g.call(ctx, m, func() (err error) {
		hs, err = m.Slot().FindObjects(ctx, object.TokenTemplate(id))
		return err
	}); err != nil {
		g.copiesLeft(ctx, m, id, err)
		return
	}
	for _, h := range hs {
		fp, err := g.fingerprint(ctx, m, h, id)
		if err != nil {
			g.copiesLeft(ctx, m, id, err)
			return
		}
		if fp != nil && !bytes.Equal(fp, want) {
			continue
		}
		if _, err := g.call(ctx, m, func() error { return m.Slot().DestroyObject(ctx, h) }); err != nil && !slot.StaleHandle(err) {
			g.copiesLeft(ctx, m, id, err)
			return
		}
	}
}

// copiesLeft reports that m may still hold a copy of the destroyed id:
// a member that failed for it is failed, so that its recovery removes it.
func (g *Group) copiesLeft(ctx context.Context, m *member.Member, id object.Identity, err error) {
	if ctx.Err() != nil || slot.ClassOf(err) != slot.ClassHealth {
		return
	}
	g.replicationFailed(m, id, fmt.Errorf("destroy: look for a second copy: %w", err))
}

// DestroyObject is Group.DestroyObject for the PKCS#11 module; a session
// object made in this session is also dropped from it.
func (s *Session) DestroyObject(ctx context.Context, h ObjectHandle) error {
	s.mu.Lock()
	err := s.checkOpen("DestroyObject")
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if err := s.g.DestroyObject(ctx, h); err != nil {
		return err
	}
	s.mu.Lock()
	if s.objects != nil {
		delete(s.objects, h)
	}
	s.mu.Unlock()
	return nil
}

// SetAttributes changes attributes of an object on every serving member
// that holds it: first on one member (whose refusal is returned as it is),
// then on the others in parallel; a member that fails is failed. The
// latching attributes of a private or secret key move as on the bare
// token, and every member copy stays as protected as the application's
// view (see latch).
// A change of CKA_ID or CKA_LABEL changes the object's identity.
func (g *Group) SetAttributes(ctx context.Context, h ObjectHandle, attrs []*pkcs11.Attribute) error {
	const op = "SetAttributes"
	o, done, err := g.writeObject(ctx, op, h)
	if err != nil {
		return err
	}
	defer done()
	if err := g.untold(op); err != nil {
		return err
	}
	attrs = append([]*pkcs11.Attribute(nil), attrs...)
	var l latching
	if o.IsKey() && o.Identity().Class != pkcs11.CKO_PUBLIC_KEY {
		if attrs, l, err = g.latch(ctx, op, o, attrs); err != nil {
			return err
		}
	}
	makeUnextractable := l.unextractable
	newID := o.Identity()
	if i := attrIndex(attrs, pkcs11.CKA_ID); i >= 0 {
		newID.ID = bytes.Clone(attrs[i].Value)
		if len(newID.ID) == 0 {
			newID.ID = nil
		}
	}
	if i := attrIndex(attrs, pkcs11.CKA_LABEL); i >= 0 {
		newID.Label = string(attrs[i].Value)
	}
	addedWWT := false
	if ms := g.serving(); makeUnextractable && attrIndex(attrs, pkcs11.CKA_WRAP_WITH_TRUSTED) < 0 && len(ms) > 0 && g.domainTrusted(ctx, ms[0]) {
		// Mark it for other processes too (see WrapKey), where the token
		// lets CKA_WRAP_WITH_TRUSTED go from false to true.
		attrs = append(attrs, pkcs11.NewAttribute(pkcs11.CKA_WRAP_WITH_TRUSTED, true))
		addedWWT = true
	}
	set := func(ctx context.Context, m *member.Member, sl *slot.Slot, hs []pkcs11.ObjectHandle) error {
		if len(attrs) == 0 {
			return nil
		}
		err := sl.SetAttributes(ctx, hs[0], attrs)
		if err != nil && addedWWT && slot.CodeOf(err) == pkcs11.CKR_ATTRIBUTE_READ_ONLY {
			// The token keeps CKA_WRAP_WITH_TRUSTED fixed (SoftHSM): the
			// promise then holds in this process only.
			if rest := attrs[:len(attrs)-1]; len(rest) > 0 {
				return sl.SetAttributes(ctx, hs[0], rest)
			}
			return nil
		}
		return err
	}
	replicated := func(m *member.Member) {
		g.emit(Event{Kind: ObjectReplicated, Member: m.Name(), Object: newID, Fingerprint: o.Fingerprint()})
	}
	if err := g.writeAll(ctx, op, o, set, replicated); err != nil {
		return err
	}
	g.changes.Add(1)
	l.apply(o)
	if !newID.Equal(o.Identity()) {
		g.objs.Rekey(o, newID)
	}
	return nil
}
