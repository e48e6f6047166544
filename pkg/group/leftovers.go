package group

import (
	"context"
	"slices"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// leftovers finds and removes what a failed creation left on a member. A
// token may keep an object of a call it refuses: SoftHSM keeps the
// session key of a C_UnwrapKey it refuses with CKR_ATTRIBUTE_READ_ONLY,
// without the CKA_ID and CKA_LABEL the call asked for. The application
// cannot see or remove such an object through the group, so the group
// does: it searches for objects of the call's identity (the CKA_ID or
// label the call set, the group's random one where the application set
// neither, or the source's of a copy), and for session objects also for
// nameless ones of the call's class and key type; objects that a search
// found before the call are left alone. Token objects are never taken by
// class alone: another process may be making one of the class right now.
type leftovers []search

type search struct {
	tmpl     []*pkcs11.Attribute
	nameless bool                  // only objects with neither CKA_ID nor CKA_LABEL
	fresh    bool                  // the identity is the group's random one: nothing had it before
	before   []pkcs11.ObjectHandle // found before the call
}

func newLeftovers(ins []intent, inputs []*vobject) leftovers {
	var out leftovers
	for _, in := range ins {
		base := []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, in.token)}
		if in.classKnown {
			base = append(base, pkcs11.NewAttribute(pkcs11.CKA_CLASS, in.class))
		}
		if i := attrIndex(in.tmpl, pkcs11.CKA_KEY_TYPE); i >= 0 {
			base = append(base, in.tmpl[i])
		}
		named := slices.Clip(base)
		for _, t := range []uint{pkcs11.CKA_ID, pkcs11.CKA_LABEL} {
			if i := attrIndex(in.tmpl, t); i >= 0 {
				named = append(named, in.tmpl[i])
			}
		}
		if len(named) == len(base) && len(inputs) > 0 {
			// A copy that keeps its source's identity.
			id := inputs[0].identity()
			named = append(named, pkcs11.NewAttribute(pkcs11.CKA_LABEL, []byte(id.Label)))
			if id.Class != pkcs11.CKO_DATA {
				named = append(named, pkcs11.NewAttribute(pkcs11.CKA_ID, nonNil(id.ID)))
			}
		}
		out = append(out, search{tmpl: named, fresh: !in.explicitID})
		if !in.token {
			out = append(out, search{tmpl: base, nameless: true})
		}
	}
	return out
}

// snapshot records what the searches find on sl before the call.
func (l leftovers) snapshot(ctx context.Context, sl *slot.Slot) error {
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

// remove destroys, through target, what the searches find on sl now and
// did not before, and reports whether sl is known to hold none of it.
func (l leftovers) remove(ctx context.Context, sl *slot.Slot, target slotOps) bool {
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
	for _, a := range attrs {
		if a.Status == pkcs11.CKR_OK && len(a.Value) > 0 {
			return true
		}
	}
	return false
}
