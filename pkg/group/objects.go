package group

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"sync"

	"github.com/hagroup/hagroup/pkg/group/vtable"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// ObjectHandle is a virtual object handle: stable for the life of the
// process, never reused, never 0 (CK_INVALID_HANDLE). The table behind it
// is pkg/group/vtable.
type ObjectHandle = vtable.Handle

// unusable reports why o may not be used: it was destroyed, or two
// different keys share its identity.
func unusable(o *vtable.Object) error {
	switch {
	case o.Gone.Load():
		return ErrObjectHandle
	case o.Conflict.Load():
		return ErrConflict
	}
	return nil
}

// object returns the live object behind a virtual handle.
func (g *Group) object(op string, h ObjectHandle) (*vtable.Object, error) {
	o, ok := g.objs.Get(h)
	if !ok {
		return nil, wrap(ErrObjectHandle, op, "", nil)
	}
	return o, nil
}

// Identity returns what the group knows object h by: its class, key type,
// CKA_ID and CKA_LABEL, without asking a member.
func (g *Group) Identity(h ObjectHandle) (object.Identity, error) {
	o, err := g.object("Identity", h)
	if err != nil {
		return object.Identity{}, err
	}
	return o.Identity(), nil
}

// key returns the live key object behind a virtual handle given as
// argument arg of op; bad is the error when none is.
func (g *Group) key(op string, h ObjectHandle, arg keyArg) (*vtable.Object, error) {
	o, ok := g.objs.Get(h)
	if !ok || !o.IsKey() {
		return nil, wrap(arg.bad(), op, "", nil)
	}
	return o, nil
}

// known schedules a call on o to an active member where o's handle is
// known for the member's epoch (found by a search or a find-all, checked
// or not), and to the scheduler's choice when none is: on any other
// member the object would first be searched for, a scan of the whole
// token on most makes. For calls that read an object, not the signing
// path's placement.
func (g *Group) known(o *vtable.Object) func(memberSet) *member.Member {
	return func(skip memberSet) *member.Member {
		for _, m := range g.view().members {
			if m.State() != member.Active || m.Slot() == nil || skip.has(m.Index()) {
				continue
			}
			if _, ok := o.Cached(m); ok {
				return m
			}
		}
		return g.pick(skip)
	}
}

// keyArg is the argument a key handle is given as. A token answers a
// handle that names no key with a code that depends on the argument
// (SoftHSM: CKR_OBJECT_HANDLE_INVALID at C_*Init and C_DeriveKey, the
// wrapping and unwrapping codes at C_WrapKey and C_UnwrapKey), and so does
// the group, whether the handle is unknown or no serving member holds it.
type keyArg int

const (
	argOpKey      keyArg = iota // C_{Sign,Verify,Encrypt,Decrypt}Init, C_DeriveKey
	argKey                      // the key C_WrapKey wraps, C_DigestKey
	argWrapping                 // C_WrapKey's wrapping key
	argUnwrapping               // C_UnwrapKey's unwrapping key
)

func (a keyArg) bad() *Error {
	switch a {
	case argKey:
		return ErrKeyHandle
	case argWrapping:
		return ErrWrappingKeyHandle
	case argUnwrapping:
		return ErrUnwrappingKeyHandle
	}
	return ErrObjectHandle
}

// resolve returns o's physical handle on m, looking it up by identity when
// it is not known for m's current epoch. It returns errAbsent when m does
// not hold the object, ErrConflict when m holds a different key under the
// same identity, or the member's error (already charged to it).
func (g *Group) resolve(ctx context.Context, o *vtable.Object, m *member.Member) (pkcs11.ObjectHandle, error) {
	i, ep := m.Index(), m.Epoch()
	if r := o.Ref(i); r != nil && r.Epoch == ep {
		switch {
		case r.Absent:
			return 0, errAbsent
		case r.Unverified:
			return g.verifyRef(ctx, o, m, r)
		}
		return r.Handle, nil
	}
	if !o.Token {
		// Session objects live only where the group put them.
		return 0, errAbsent
	}
	s := m.Slot()
	id := o.Identity()
	var hs []pkcs11.ObjectHandle
	if _, err := g.call(ctx, m, func() (err error) {
		// findOn: a member whose login ended under the group would
		// answer [] for a private object, and it would be taken as
		// absent there (skipped by a destroy, which then leaves it).
		hs, err = g.findOn(ctx, m, s, object.TokenTemplate(id))
		return err
	}); err != nil {
		return 0, err
	}
	if len(hs) == 0 {
		o.SetAbsent(i, ep)
		return 0, errAbsent
	}
	want := o.Fingerprint()
	var chosen pkcs11.ObjectHandle
	var chosenFP []byte
	found := false
	for _, h := range hs {
		fp, err := g.fingerprint(ctx, m, h, id)
		if err != nil {
			return 0, err
		}
		switch {
		case !found:
			chosen, chosenFP, found = h, fp, true
		case fp != nil && chosenFP != nil && !bytes.Equal(fp, chosenFP):
			if want == nil {
				g.conflict(o, m, chosenFP, fp)
				return 0, ErrConflict
			}
			if bytes.Equal(fp, want) {
				chosen, chosenFP = h, fp
			}
		}
	}
	if want != nil && chosenFP != nil && !bytes.Equal(want, chosenFP) {
		g.conflict(o, m, want, chosenFP)
		return 0, ErrConflict
	}
	o.SetFingerprint(chosenFP)
	o.Set(i, ep, chosen)
	return chosen, nil
}

// verifyRef checks the key material behind an unverified handle against o's
// fingerprint (or gives o its fingerprint) before the handle is used.
func (g *Group) verifyRef(ctx context.Context, o *vtable.Object, m *member.Member, r *vtable.Ref) (pkcs11.ObjectHandle, error) {
	fp, err := g.fingerprint(ctx, m, r.Handle, o.Identity())
	if err != nil {
		return 0, err
	}
	if want := o.Fingerprint(); want != nil && fp != nil && !bytes.Equal(want, fp) {
		g.conflict(o, m, want, fp)
		return 0, ErrConflict
	}
	o.SetFingerprint(fp)
	o.Verified(m.Index(), r)
	return r.Handle, nil
}

// fingerprint returns the fingerprint of h, an object of identity id, on
// m, nil when the member cannot compute one.
func (g *Group) fingerprint(ctx context.Context, m *member.Member, h pkcs11.ObjectHandle, id object.Identity) ([]byte, error) {
	var fp []byte
	class, err := g.call(ctx, m, func() (err error) {
		fp, err = object.FingerprintAs(ctx, m.Slot(), h, id)
		if errors.Is(err, object.ErrNoFingerprint) {
			return nil
		}
		return err
	})
	if err != nil && class != slot.ClassHealth {
		return nil, nil // a request-class failure: no fingerprint to compare
	}
	return fp, err
}

// conflict marks o unusable and reports it once.
func (g *Group) conflict(o *vtable.Object, m *member.Member, a, b []byte) {
	if o.Conflict.CompareAndSwap(false, true) {
		g.emit(Event{Kind: ConflictFound, Member: m.Name(), Object: o.Identity(), Fingerprint: a, Other: b,
			Err: errors.New("two different keys share one identity; not used until resolved")})
	}
}

func ulong(b []byte) uint {
	switch len(b) {
	case 8:
		return uint(binary.NativeEndian.Uint64(b))
	case 4:
		return uint(binary.NativeEndian.Uint32(b))
	case 1:
		return uint(b[0])
	}
	return 0
}

// Find returns the virtual handles of the objects matching tmpl that the
// current login can see. A non-empty template is searched on one healthy
// member (with failover) and the results mapped to the other members
// lazily, when first used there; when that member finds nothing, the
// other serving members are asked in turn (findElsewhere) before "none" is
// answered. A member lacking MechWrapPad can neither be sent every key
// nor send its own, so it may hold keys the others lack and lack theirs:
// while one serves with another member, every serving member is searched
// and the results joined, so each member serves the keys it holds. An
// empty template ("find all") lists every
// serving member once, in parallel, and joins the listings on identity, so
// its cost is one listing per member, not a look-up per object per member.
// Objects whose identity is shared by different key material on one member
// are reported (ConflictFound) and left out; on two members, where the
// second copy is first used (resolve). Domain keys are never shown.
func (g *Group) Find(ctx context.Context, tmpl []*pkcs11.Attribute) ([]ObjectHandle, error) {
	if len(tmpl) == 0 {
		return g.findAll(ctx)
	}
	if ms := g.serving(); len(ms) > 1 && slices.ContainsFunc(ms, func(m *member.Member) bool { return m.Lacks(MechWrapPad) }) {
		return g.findEvery(ctx, ms, tmpl)
	}
	var out []ObjectHandle
	var by *member.Member
	_, err := g.exec(ctx, plan{op: "FindObjects"}, func(ctx context.Context, m *member.Member, s *slot.Slot, _ []pkcs11.ObjectHandle) error {
		hs, err := g.findOn(ctx, m, s, tmpl)
		if err != nil {
			return err
		}
		by = m
		out, err = g.internFound(ctx, m, s, hs)
		return err
	})
	if err == nil && len(out) == 0 {
		return g.findElsewhere(ctx, by, tmpl)
	}
	return out, err
}

// findElsewhere searches the serving members other than first, one after
// the other, for tmpl, which first found nothing of, and returns what the
// first to find anything found. A member's empty answer is not taken for
// the group's, as exec takes no member's "not held" for it: a serving
// member can answer a search without an object it holds (SoftHSM behind
// one process per connection, as hsmserve serves it, now and then hides
// from one of them an object another process made: the soak's "missing
// after its creation returned"). It costs a search of every serving
// member only when none finds anything. A member that cannot answer is
// passed over (and charged by the rule).
func (g *Group) findElsewhere(ctx context.Context, first *member.Member, tmpl []*pkcs11.Attribute) ([]ObjectHandle, error) {
	if err := g.gate.Enter(); err != nil {
		return nil, err
	}
	defer g.gate.Leave()
	for _, m := range g.serving() {
		s := m.Slot()
		if m == first || s == nil {
			continue
		}
		var got []ObjectHandle
		if _, err := g.call(ctx, m, func() error {
			hs, err := g.findOn(ctx, m, s, tmpl)
			if err != nil {
				return err
			}
			got, err = g.internFound(ctx, m, s, hs)
			return err
		}); err != nil {
			if ctx.Err() != nil {
				return nil, opErr("FindObjects", m.Name(), err)
			}
			continue
		}
		if len(got) > 0 {
			return got, nil
		}
	}
	return nil, nil
}

// findOn searches member m for tmpl. A token's login can end under the
// group — another process using the same token logged out (the login
// state of a token is shared by everyone using it through one module
// instance, as it is behind hsmserve), or the token restarted — and a
// search then answers no private objects, without an error. So when the
// group is logged in as the user and the search finds nothing, m's login
// is asserted again (a no-op on a member still logged in) and the search
// made once more.
func (g *Group) findOn(ctx context.Context, m *member.Member, s *slot.Slot, tmpl []*pkcs11.Attribute) ([]pkcs11.ObjectHandle, error) {
	hs, err := s.FindObjects(ctx, tmpl)
	if ut, in := g.LoggedIn(); err != nil || len(hs) > 0 || !in || ut != pkcs11.CKU_USER {
		return hs, err
	}
	if !g.reassertLogin(ctx, m) {
		return hs, nil
	}
	return s.FindObjects(ctx, tmpl)
}

// reassertLogin logs m in again as the group is logged in (see findOn)
// and reports whether it is logged in now. A member that refuses is
// charged as a login would charge it.
func (g *Group) reassertLogin(ctx context.Context, m *member.Member) bool {
	g.logins.Lock()
	defer g.logins.Unlock()
	ut, in := g.logins.LoggedIn()
	return in && g.relogin(ctx, m, ut) == nil
}

// findEvery searches every member of ms for tmpl and joins the results,
// each object once. A member whose health fails is passed over (and
// charged); a request error is returned as it is.
func (g *Group) findEvery(ctx context.Context, ms []*member.Member, tmpl []*pkcs11.Attribute) ([]ObjectHandle, error) {
	const op = "FindObjects"
	if err := g.gate.Enter(); err != nil {
		return nil, err
	}
	defer g.gate.Leave()
	var out []ObjectHandle
	seen := map[ObjectHandle]bool{}
	answered := 0
	var lastHealth error
	for _, m := range ms {
		s := m.Slot()
		if s == nil {
			continue
		}
		var got []ObjectHandle
		_, err := g.call(ctx, m, func() error {
			hs, err := g.findOn(ctx, m, s, tmpl)
			if err != nil {
				return err
			}
			got, err = g.internFound(ctx, m, s, hs)
			return err
		})
		if err != nil {
			if slot.ClassOf(err) == slot.ClassHealth && ctx.Err() == nil {
				lastHealth = err
				m.AddFailover()
				continue
			}
			return nil, opErr(op, m.Name(), err)
		}
		answered++
		for _, h := range got {
			if !seen[h] {
				seen[h] = true
				out = append(out, h)
			}
		}
	}
	if answered == 0 {
		return nil, wrap(ErrNoMember, op, "", lastHealth)
	}
	return out, nil
}

// internFound maps physical handles found on m to virtual objects.
func (g *Group) internFound(ctx context.Context, m *member.Member, s *slot.Slot, hs []pkcs11.ObjectHandle) ([]ObjectHandle, error) {
	ep := m.Epoch()
	type found struct {
		id object.Identity
		hs []pkcs11.ObjectHandle
	}
	var order []string
	byKey := map[string]*found{}
	var out []ObjectHandle
	for _, h := range hs {
		id, token, ok, err := object.ReadIdentity(ctx, s, h)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		if !token {
			if o := g.objs.SessionObjectAt(m, h); o != nil {
				out = append(out, o.Handle)
			}
			continue
		}
		k := id.Key()
		f := byKey[k]
		if f == nil {
			f = &found{id: id}
			byKey[k] = f
			order = append(order, k)
		}
		f.hs = append(f.hs, h)
	}
	for _, k := range order {
		f := byKey[k]
		o, _ := g.objs.Intern(f.id)
		if unusable(o) != nil {
			continue
		}
		if len(f.hs) == 1 {
			if ph, ok := o.Cached(m); ok && ph == f.hs[0] {
				out = append(out, o.Handle)
				continue
			}
		}
		var first []byte
		conflict := false
		for i, h := range f.hs {
			fp, err := object.Fingerprint(ctx, s, h)
			if err != nil && !errors.Is(err, object.ErrNoFingerprint) {
				if slot.ClassOf(err) == slot.ClassHealth {
					return nil, err
				}
				fp = nil
			}
			if i == 0 {
				first = fp
			} else if fp != nil && first != nil && !bytes.Equal(fp, first) {
				g.conflict(o, m, first, fp)
				conflict = true
				break
			}
		}
		if conflict {
			continue
		}
		if want := o.Fingerprint(); want != nil && first != nil && !bytes.Equal(want, first) {
			g.conflict(o, m, want, first)
			continue
		}
		o.SetFingerprint(first)
		o.Set(m.Index(), ep, f.hs[0])
		out = append(out, o.Handle)
	}
	return out, nil
}

// findAll lists every serving member once and joins the listings.
func (g *Group) findAll(ctx context.Context) ([]ObjectHandle, error) {
	if err := g.gate.Enter(); err != nil {
		return nil, err
	}
	defer g.gate.Leave()
	ms := g.serving()
	if len(ms) == 0 {
		g.ensureActive()
		ms = g.serving()
	}
	lists := make([][]object.Object, len(ms))
	epochs := make([]uint64, len(ms))
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	// Each listing reads identities only, one member call per object, and
	// each handle is checked against the fingerprint when first used
	// there (verifyRef): a listing tool reads each object on one member
	// only, and reading every object's key material here cost one more
	// call per object on the first member.
	for i, m := range ms {
		epochs[i] = m.Epoch()
		wg.Go(func() {
			_, errs[i] = g.call(ctx, m, func() (err error) {
				if lists[i], err = object.ListIdentities(ctx, m.Slot()); err != nil {
					return err
				}
				return fingerprintTwins(ctx, m.Slot(), lists[i])
			})
		})
	}
	wg.Wait()
	var listed []vtable.Listing
	var lastErr error
	for i, m := range ms {
		if errs[i] != nil {
			lastErr = errs[i]
			if slot.ClassOf(errs[i]) != slot.ClassHealth {
				return nil, opErr("FindObjects", m.Name(), errs[i])
			}
			continue
		}
		listed = append(listed, vtable.Listing{Member: m, Epoch: epochs[i], Objects: lists[i]})
	}
	if len(listed) == 0 {
		return nil, wrap(ErrNoMember, "FindObjects", "", lastErr)
	}
	out, conflicts := g.objs.Join(listed)
	for _, c := range conflicts {
		g.conflict(c.Object, c.Member, c.A, c.B)
	}
	return out, nil
}

// fingerprintTwins reads the fingerprints of the token objects objs lists
// more than once under one identity, so that Join reports two different
// keys under one identity on one member as a conflict at the find-all, as
// it did when the listing read every object's key material. A token rarely
// holds two objects of one identity: this costs nothing otherwise. An
// object whose fingerprint the member cannot tell keeps none.
func fingerprintTwins(ctx context.Context, s *slot.Slot, objs []object.Object) error {
	n := map[string]int{}
	for _, o := range objs {
		if o.Token {
			n[o.Identity.Key()]++
		}
	}
	for i := range objs {
		o := &objs[i]
		if !o.Token || n[o.Identity.Key()] < 2 {
			continue
		}
		fp, err := object.Fingerprint(ctx, s, o.Handle)
		if err != nil && slot.ClassOf(err) == slot.ClassHealth {
			return err
		}
		if err == nil {
			o.Fingerprint = fp
		}
	}
	return nil
}
