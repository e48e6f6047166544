package sync

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hagroup/hagroup/internal/tokenquirk"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// ErrHalfMade: the object is what an interrupted creation left on the
// member. SoftHSM 2.6.1 writes a new key's file with its defaults first
// (CKA_TOKEN false, no label, no CKA_ID, empty key material, "never
// extractable") and the caller's template and key material in a second
// write; a member killed between the two keeps that first file, and
// lists it after its restart as a "session" key that nothing can use.
// The soak found one on a member (seed 1796182500888228415, m0).
var ErrHalfMade = errors.New("left by an interrupted creation (no label, no CKA_ID, not a token object, no key material)")

// keyMaterial names the attribute that every complete key of the class
// and key type carries, non-empty, and that SoftHSM's defaults leave
// empty; 0 where there is none to go by.
func keyMaterial(class, keyType uint) uint {
	switch class {
	case pkcs11.CKO_PUBLIC_KEY, pkcs11.CKO_PRIVATE_KEY:
		switch keyType {
		case pkcs11.CKK_RSA:
			return pkcs11.CKA_MODULUS
		case pkcs11.CKK_EC, slot.CKKECEdwards, slot.CKKECMontgomery:
			return pkcs11.CKA_EC_PARAMS
		}
	case pkcs11.CKO_SECRET_KEY:
		return pkcs11.CKA_VALUE_LEN
	}
	return 0
}

// halfMade reports whether the object r read on s is one an interrupted
// creation left (ErrHalfMade). Only an object without identity (no
// label, no CKA_ID) that claims not to be a token object costs a further
// GetAttributes call; a complete session key of the application has its
// key material and is not half-made.
func halfMade(ctx context.Context, s object.Store, r object.Result) (bool, error) {
	if !leavesHalfMade(s) || r.Token || r.Label != "" || len(r.ID) > 0 {
		return false, nil
	}
	t := keyMaterial(r.Class, r.KeyType)
	if t == 0 {
		return false, nil
	}
	a, err := object.ReadAttrs(ctx, s, r.Handle, []uint{t})
	if err != nil {
		return false, err
	}
	if t == pkcs11.CKA_VALUE_LEN {
		n, ok := a.Ulong(t)
		return ok && n == 0, nil
	}
	return !a.NonEmpty(t), nil
}

// leavesHalfMade reports whether s's make may keep an interrupted
// creation's object at its defaults (tokenquirk.LeavesHalfMadeObjects):
// on another make an object without identity is the application's own. A
// store that does not tell its token (a test's) is taken to.
func leavesHalfMade(s object.Store) bool {
	ts, ok := s.(interface{ Token() slot.TokenSummary })
	if !ok {
		return true
	}
	t := ts.Token()
	return tokenquirk.LeavesHalfMadeObjects(t.Manufacturer, t.Model)
}

// halfMadeUnreadable reports a half-made object as an Unreadable one, for
// a plan that does not catch its member up (PlanOptions.Returning): the
// operator sees it, and the member's next recovery deletes it.
func halfMadeUnreadable(member string, o object.Object) Unreadable {
	id := o.Identity
	return Unreadable{Member: member, Handle: o.Handle, Identity: &id, Err: ErrHalfMade}
}

// HalfMadeSettle is how long an object must have stayed half-made, seen
// so by one process under one handle, before anything but a catch-up
// deletes it. SoftHSM 2.6.1 shows every creation so between its first
// write and its commit, a few file writes inside one call (milliseconds,
// key generation included: the key is computed before the first write).
// A creation still under way after this long is one whose process is
// stopped inside the call; deleting its object makes that call fail
// (SoftHSM then finds no file to commit to) rather than lose a key
// anybody was told of. The soak's leftovers came from creations that
// failed on a member that stayed in service (DESIGN.md, "Facts").
const HalfMadeSettle = 10 * time.Second

// DestroyHalfMade destroys the object at h on s if it still is a
// half-made one, and reports whether it did. The handle is read again
// first: the creation may have finished since the listing, or the handle
// may now name another object; those are left alone. An object gone
// already is no error.
func DestroyHalfMade(ctx context.Context, s *slot.Slot, h pkcs11.ObjectHandle) (bool, error) {
	r, err := object.ReadIdent(ctx, s, s.Name(), h)
	if object.IsGone(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	still, err := halfMade(ctx, s, r)
	if object.IsGone(err) || (err == nil && !still) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("member %s: object %d: %w", s.Name(), h, err)
	}
	if err := s.DestroyObject(ctx, h); err != nil {
		if object.IsGone(err) {
			return false, nil
		}
		return false, fmt.Errorf("member %s: destroy object %d %v: %w", s.Name(), h, ErrHalfMade, err)
	}
	return true, nil
}

func destroyHalfMade(ctx context.Context, s *slot.Slot, h pkcs11.ObjectHandle) error {
	_, err := DestroyHalfMade(ctx, s, h)
	return err
}

// halfMadeActions plans the deletion of the half-made objects member
// listed when the plan catches member up (returning): the member is out
// of the group's service then and under its recovery lock, so no creation
// through the group or another recovery's copy is under way there, whose
// object, still at its defaults, would look half-made. Elsewhere they are
// reported as unreadable, which makes the member out of sync, until a
// process that has seen one for HalfMadeSettle deletes it
// (recover.Recoverer.RemoveHalfMade).
func halfMadeActions(p *Plan, member string, objs []object.Object, returning string) {
	for _, o := range objs {
		if member != returning {
			p.Unreadable = append(p.Unreadable, halfMadeUnreadable(member, o))
			continue
		}
		p.Actions = append(p.Actions, Action{Kind: Delete, Identity: o.Identity, Member: member,
			Reason: ReasonHalfMade, handle: o.Handle})
	}
}

// GroupObject reports whether the object h on s is one the group's
// comparison counts: a token object, or a half-made one (ErrHalfMade),
// which counts as a difference. A complete session object is the
// application's own, on one member only, and is not. For an independent
// listing (the soak's truth) that must agree with every plan.
func GroupObject(ctx context.Context, s *slot.Slot, h pkcs11.ObjectHandle) (bool, error) {
	r, err := object.ReadIdent(ctx, s, s.Name(), h)
	if err != nil {
		return false, err
	}
	if r.Token {
		return true, nil
	}
	return halfMade(ctx, s, r)
}
