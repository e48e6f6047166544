// Package vtable is the group's virtual object table: one entry per
// object the application can name, with its identity, the key material's
// fingerprint and, per member, the physical handle it has there (looked
// up lazily, valid for one member epoch). Reads on the hot path (handle →
// object → physical handle) take no lock. The table knows nothing of
// groups: pkg/group decides what to look up and when.
package vtable

import (
	"sync"
	"sync/atomic"

	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// Handle is a virtual object handle: stable for the life of the process,
// never reused, never 0 (CK_INVALID_HANDLE).
type Handle uint

// Ref is what the group knows about one object on one member, valid while
// the member's epoch is unchanged.
type Ref struct {
	Epoch  uint64
	Handle pkcs11.ObjectHandle
	Absent bool // the member was looked at and does not hold the object
	// Unverified: found by identity in a listing that read no key
	// material; the fingerprint is checked on first use.
	Unverified bool
}

// Object is one entry of the table: an identity, the key material's
// fingerprint, and a lazily filled physical handle per member.
type Object struct {
	Handle Handle
	Token  bool

	id atomic.Pointer[object.Identity]
	fp atomic.Pointer[[]byte]

	// Unextractable: the application made or set the key with
	// CKA_EXTRACTABLE=false, or the members say so.
	Unextractable atomic.Bool
	// ValueLen: a secret key's CKA_VALUE_LEN once a member told it; 0
	// until then.
	ValueLen atomic.Uint64
	// WWTOrigin: what the members' copies say of CKA_WRAP_WITH_TRUSTED
	// (WWTSomewhereFalse, WWTEverywhere); 0 until asked.
	WWTOrigin atomic.Int32
	Conflict  atomic.Bool // two different keys share the identity
	Gone      atomic.Bool // removed; the handle is invalid for good

	// phys holds one reference per member index. It grows when a member
	// with a higher index joins; a cache entry stored into the old array
	// while it is copied may be lost, which costs one look-up.
	phys atomic.Pointer[[]atomic.Pointer[Ref]]
}

// WWTOrigin values.
const (
	WWTSomewhereFalse = 1 // some member's copy lacks CKA_WRAP_WITH_TRUSTED
	WWTEverywhere     = 2 // every member that answered has it
)

// Ref returns what is known of o on member index i.
func (o *Object) Ref(i int) *Ref {
	if p := *o.phys.Load(); i < len(p) {
		return p[i].Load()
	}
	return nil
}

// cell returns the reference cell of member index i, growing the array.
func (o *Object) cell(i int) *atomic.Pointer[Ref] {
	for {
		p := o.phys.Load()
		if i < len(*p) {
			return &(*p)[i]
		}
		n := make([]atomic.Pointer[Ref], max(i+1, len(*p)))
		for j := range *p {
			n[j].Store((*p)[j].Load())
		}
		if o.phys.CompareAndSwap(p, &n) {
			return &n[i]
		}
	}
}

// Identity returns what o is known by on the members.
func (o *Object) Identity() object.Identity { return *o.id.Load() }

// Fingerprint returns the fingerprint of o's key material, nil while no
// member gave one.
func (o *Object) Fingerprint() []byte {
	if p := o.fp.Load(); p != nil {
		return *p
	}
	return nil
}

// SetFingerprint gives o its fingerprint; the first one set stays.
func (o *Object) SetFingerprint(fp []byte) {
	if fp != nil {
		o.fp.CompareAndSwap(nil, &fp)
	}
}

// IsKey reports whether o is a public, private or secret key.
func (o *Object) IsKey() bool {
	switch o.Identity().Class {
	case pkcs11.CKO_PUBLIC_KEY, pkcs11.CKO_PRIVATE_KEY, pkcs11.CKO_SECRET_KEY:
		return true
	}
	return false
}

// Set records that o is h on member index i in epoch.
func (o *Object) Set(i int, epoch uint64, h pkcs11.ObjectHandle) {
	o.cell(i).Store(&Ref{Epoch: epoch, Handle: h})
}

// SetUnverified records that o is h on member index i in epoch, found by
// identity only: its key material is to be checked before use.
func (o *Object) SetUnverified(i int, epoch uint64, h pkcs11.ObjectHandle) {
	o.cell(i).Store(&Ref{Epoch: epoch, Handle: h, Unverified: true})
}

// Verified marks r, o's unverified reference on member index i, as
// checked, unless it was replaced meanwhile.
func (o *Object) Verified(i int, r *Ref) {
	o.cell(i).CompareAndSwap(r, &Ref{Epoch: r.Epoch, Handle: r.Handle})
}

// SetAbsent records that member index i does not hold o in epoch.
func (o *Object) SetAbsent(i int, epoch uint64) {
	o.cell(i).Store(&Ref{Epoch: epoch, Absent: true})
}

// Forget drops what is known of o on member index i.
func (o *Object) Forget(i int) {
	if p := *o.phys.Load(); i < len(p) {
		p[i].Store(nil)
	}
}

// ForgetAbsent drops every "not there" record of o, so that each member
// is looked at again.
func (o *Object) ForgetAbsent() {
	p := *o.phys.Load()
	for i := range p {
		if r := p[i].Load(); r != nil && r.Absent {
			p[i].CompareAndSwap(r, nil)
		}
	}
}

// Cached returns the physical handle of o on m if it is known for the
// member's current epoch.
func (o *Object) Cached(m *member.Member) (pkcs11.ObjectHandle, bool) {
	if r := o.Ref(m.Index()); r != nil && r.Epoch == m.Epoch() && !r.Absent {
		return r.Handle, true
	}
	return 0, false
}

// Table is the virtual object table.
type Table struct {
	width    func() int // 1 + the highest member index in use
	byHandle sync.Map   // Handle → *Object
	next     atomic.Uint64

	mu       sync.Mutex
	byKey    map[string]*Object                      // token objects by identity
	sessPhys map[int]map[pkcs11.ObjectHandle]*Object // per member index: session objects by physical handle
}

// New returns an empty table; width tells 1 + the highest member index in
// use, the size a new object's reference array starts with.
func New(width func() int) *Table {
	return &Table{
		width:    width,
		byKey:    make(map[string]*Object),
		sessPhys: make(map[int]map[pkcs11.ObjectHandle]*Object),
	}
}

func (t *Table) newObject(id object.Identity, token bool) *Object {
	o := &Object{Handle: Handle(t.next.Add(1)), Token: token}
	refs := make([]atomic.Pointer[Ref], t.width())
	o.phys.Store(&refs)
	o.id.Store(&id)
	return o
}

// Purge forgets everything known about member index i (the member left,
// or a new one takes its index).
func (t *Table) Purge(i int) {
	t.byHandle.Range(func(_, v any) bool {
		v.(*Object).Forget(i)
		return true
	})
	t.mu.Lock()
	delete(t.sessPhys, i)
	t.mu.Unlock()
}

// Intern returns the token object with identity id, creating its entry on
// first sight. created reports whether it is new.
func (t *Table) Intern(id object.Identity) (o *Object, created bool) {
	k := id.Key()
	t.mu.Lock()
	defer t.mu.Unlock()
	if o := t.byKey[k]; o != nil {
		return o, false
	}
	o = t.newObject(id, true)
	t.byKey[k] = o
	t.byHandle.Store(o.Handle, o)
	return o, true
}

// AddSessionObject enters a new session object.
func (t *Table) AddSessionObject(id object.Identity) *Object {
	o := t.newObject(id, false)
	t.byHandle.Store(o.Handle, o)
	return o
}

// SetSessionPhys records where a session object lives on member m.
func (t *Table) SetSessionPhys(o *Object, m *member.Member, h pkcs11.ObjectHandle) {
	o.Set(m.Index(), m.Epoch(), h)
	t.mu.Lock()
	if t.sessPhys[m.Index()] == nil {
		t.sessPhys[m.Index()] = make(map[pkcs11.ObjectHandle]*Object)
	}
	t.sessPhys[m.Index()][h] = o
	t.mu.Unlock()
}

// SessionObjectAt returns the session object at physical handle h on m.
func (t *Table) SessionObjectAt(m *member.Member, h pkcs11.ObjectHandle) *Object {
	t.mu.Lock()
	o := t.sessPhys[m.Index()][h]
	t.mu.Unlock()
	if o == nil || o.Gone.Load() {
		return nil
	}
	if ph, ok := o.Cached(m); !ok || ph != h {
		return nil
	}
	return o
}

// Remove drops o from the table; its handle becomes invalid for good.
func (t *Table) Remove(o *Object) {
	o.Gone.Store(true)
	t.mu.Lock()
	defer t.mu.Unlock()
	if o.Token {
		k := o.Identity().Key()
		if t.byKey[k] == o {
			delete(t.byKey, k)
		}
	} else {
		for i, phys := range t.sessPhys {
			if r := o.Ref(i); r != nil && !r.Absent && phys[r.Handle] == o {
				delete(phys, r.Handle)
			}
		}
	}
	t.byHandle.Delete(o.Handle)
}

// Rekey moves a token object to a new identity (after CKA_ID or CKA_LABEL
// changed).
func (t *Table) Rekey(o *Object, id object.Identity) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if o.Token {
		old := o.Identity().Key()
		if t.byKey[old] == o {
			delete(t.byKey, old)
		}
		t.byKey[id.Key()] = o
	}
	o.id.Store(&id)
}

// Get returns the object behind h and whether it is live.
func (t *Table) Get(h Handle) (*Object, bool) {
	v, ok := t.byHandle.Load(h)
	if !ok {
		return nil, false
	}
	o := v.(*Object)
	return o, !o.Gone.Load()
}
