// Package leftover finds and removes what a failed creation left on a
// member. A token may keep an object of a call it refuses: SoftHSM keeps
// the session key of a C_UnwrapKey it refuses with
// CKR_ATTRIBUTE_READ_ONLY, without the CKA_ID and CKA_LABEL the call asked
// for. The application cannot see or remove such an object through the
// group, so the group does: it searches for objects of the call's
// identity (the CKA_ID or label the call set, the group's random one where
// the application set neither, or the source's of a copy), and for
// session objects also for nameless ones of the call's class and key
// type; objects that a search found before the call are left alone. Token
// objects are never taken by class alone: another process may be making
// one of the class right now.
package leftover

import (
	"context"
	"slices"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// Call is one object a creation makes, as the group will ask for it.
type Call struct {
	Template   []*pkcs11.Attribute
	Token      bool
	Class      uint
	ClassKnown bool // Class was given or read from the template (CKO_DATA is 0)
	// ExplicitID: the application named the object (CKA_ID or
	// CKA_LABEL); otherwise the identity is the group's random one, which
	// nothing had before the call.
	ExplicitID bool
}

// Searches are the searches of one creation's leftovers.
type Searches []search

type search struct {
	call     int // the index of the Call searched for
	tmpl     []*pkcs11.Attribute
	nameless bool                  // only objects with neither CKA_ID nor CKA_LABEL
	fresh    bool                  // the identity is the group's random one: nothing had it before
	before   []pkcs11.ObjectHandle // found before the call
}

// New returns the searches for what calls leave. A call that names no
// identity of its own takes source's (a copy keeps its source's); source
// may be nil.
func New(calls []Call, source *object.Identity) Searches {
	var out Searches
	for i, c := range calls {
		base := []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, c.Token)}
		if c.ClassKnown {
			base = append(base, pkcs11.NewAttribute(pkcs11.CKA_CLASS, c.Class))
		}
		if a := find(c.Template, pkcs11.CKA_KEY_TYPE); a != nil {
			base = append(base, a)
		}
		named := slices.Clip(base)
		for _, t := range []uint{pkcs11.CKA_ID, pkcs11.CKA_LABEL} {
			if a := find(c.Template, t); a != nil {
				named = append(named, a)
			}
		}
		if len(named) == len(base) && source != nil {
			// A copy that keeps its source's identity.
			named = append(named, pkcs11.NewAttribute(pkcs11.CKA_LABEL, []byte(source.Label)))
			if source.Class != pkcs11.CKO_DATA {
				named = append(named, pkcs11.NewAttribute(pkcs11.CKA_ID, append([]byte{}, source.ID...)))
			}
		}
		out = append(out, search{call: i, tmpl: named, fresh: !c.ExplicitID})
		if !c.Token {
			out = append(out, search{call: i, tmpl: base, nameless: true})
		}
	}
	return out
}

func find(tmpl []*pkcs11.Attribute, t uint) *pkcs11.Attribute {
	if i := slices.IndexFunc(tmpl, func(a *pkcs11.Attribute) bool { return a != nil && a.Type == t }); i >= 0 {
		return tmpl[i]
	}
	return nil
}

// Snapshot records what the searches find on sl before the call.
func (l Searches) Snapshot(ctx context.Context, sl *slot.Slot) error {
	for i := range l {
		if l[i].fresh {
			continue
		}
		hs, err := sl.FindObjects(ctx, l[i].tmpl)
		if err != nil {
			return err
		}
		l[i].before = hs
	}
	return nil
}

// Held reports whether, at the last Snapshot, the member held an object
// that call i's search matches: one with the identity the call names (or
// more, its template leaving the key type or a name open). A call whose
// identity nothing matched needs no search for a duplicate afterwards: an
// object found with it then was made by this call or at the same moment.
func (l Searches) Held(i int) bool {
	return slices.ContainsFunc(l, func(s search) bool { return s.call == i && !s.nameless && len(s.before) > 0 })
}

// Destroyer destroys an object: the pooled slot or the session the
// creation ran on.
type Destroyer interface {
	DestroyObject(ctx context.Context, h pkcs11.ObjectHandle) error
}

// Remove destroys, through target, what the searches find on sl now and
// did not before, and reports whether sl is known to hold none of it.
func (l Searches) Remove(ctx context.Context, sl *slot.Slot, target Destroyer) bool {
	clean := true
	for _, s := range l {
		hs, err := sl.FindObjects(ctx, s.tmpl)
		if err != nil {
			return false
		}
		for _, h := range hs {
			if slices.Contains(s.before, h) || (s.nameless && named(ctx, sl, h)) {
				continue
			}
			clean = target.DestroyObject(ctx, h) == nil && clean
		}
	}
	return clean
}

// named reports whether h on sl has a CKA_ID or a CKA_LABEL (or cannot be
// read: then it is not taken for a leftover).
func named(ctx context.Context, sl *slot.Slot, h pkcs11.ObjectHandle) bool {
	attrs, err := sl.GetAttributes(ctx, h, []uint{pkcs11.CKA_ID, pkcs11.CKA_LABEL})
	if err != nil {
		return true
	}
	return slices.ContainsFunc(attrs, func(a slot.Attribute) bool { return a.Status == pkcs11.CKR_OK && len(a.Value) > 0 })
}
