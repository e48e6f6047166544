package vtable

import (
	"bytes"
	"slices"

	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// Listing is one member's answer to a find-all, read in the member's epoch
// Epoch. An object listed with its fingerprint (its key material was
// read) is entered verified there; the others unverified, to be checked
// against the fingerprint when first used there.
type Listing struct {
	Member  *member.Member
	Epoch   uint64
	Objects []object.Object
}

// Conflict is an object whose identity different key material shares: on
// Member, fingerprints A and B.
type Conflict struct {
	Object *Object
	Member *member.Member
	A, B   []byte
}

// Join joins the listings of a find-all on identity, each object once, and
// records for every token object where each listed member holds it (or
// that it does not). It returns the handles of the usable objects, in
// handle order, and the token objects whose identity different key
// material shares, left out; marking and reporting them is the caller's.
func (t *Table) Join(ls []Listing) (hs []Handle, conflicts []Conflict) {
	type entry struct {
		id       object.Identity
		fp       []byte
		fpFrom   *member.Member // whose listing read fp
		conflict *Conflict
		hs       []pkcs11.ObjectHandle // per listing; 0 = not there
		verified []bool                // per listing: hs was listed with its fingerprint
	}
	var order []string
	entries := map[string]*entry{}
	var sessionObjs []Handle
	seenSession := map[Handle]bool{}
	for i, l := range ls {
		for _, obj := range l.Objects {
			if !obj.Token {
				if o := t.SessionObjectAt(l.Member, obj.Handle); o != nil && !seenSession[o.Handle] {
					seenSession[o.Handle] = true
					sessionObjs = append(sessionObjs, o.Handle)
				}
				continue
			}
			k := obj.Identity.Key()
			e := entries[k]
			if e == nil {
				e = &entry{id: obj.Identity, hs: make([]pkcs11.ObjectHandle, len(ls)), verified: make([]bool, len(ls))}
				entries[k] = e
				order = append(order, k)
			}
			differs := obj.Fingerprint != nil && e.fp != nil && !bytes.Equal(obj.Fingerprint, e.fp)
			switch {
			case e.hs[i] != 0:
				// A second object with this identity on the same member.
			case e.fp == nil && obj.Fingerprint != nil:
				e.hs[i], e.verified[i], e.fp, e.fpFrom = obj.Handle, true, obj.Fingerprint, l.Member
			default:
				e.hs[i], e.verified[i] = obj.Handle, obj.Fingerprint != nil
			}
			if differs && e.conflict == nil {
				e.conflict = &Conflict{Member: l.Member, A: e.fp, B: obj.Fingerprint}
			}
		}
	}
	hs = make([]Handle, 0, len(order)+len(sessionObjs))
	for _, k := range order {
		e := entries[k]
		o, _ := t.Intern(e.id)
		if o.Gone.Load() || o.Conflict.Load() {
			continue
		}
		if c := e.conflict; c != nil {
			c.Object = o
			conflicts = append(conflicts, *c)
			continue
		}
		if want := o.Fingerprint(); want != nil && e.fp != nil && !bytes.Equal(want, e.fp) {
			conflicts = append(conflicts, Conflict{Object: o, Member: e.fpFrom, A: want, B: e.fp})
			continue
		}
		o.SetFingerprint(e.fp)
		for i, l := range ls {
			m := l.Member
			switch {
			case e.hs[i] != 0 && e.verified[i]:
				o.Set(m.Index(), l.Epoch, e.hs[i])
			case e.hs[i] != 0:
				if ph, ok := o.Cached(m); ok && ph == e.hs[i] {
					continue // already known (and verified) for this epoch
				}
				o.SetUnverified(m.Index(), l.Epoch, e.hs[i])
			default:
				o.SetAbsent(m.Index(), l.Epoch)
			}
		}
		hs = append(hs, o.Handle)
	}
	hs = append(hs, sessionObjs...)
	slices.Sort(hs)
	return hs, conflicts
}
