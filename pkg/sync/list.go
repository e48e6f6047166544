package sync

import (
	"context"
	"errors"
	"fmt"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// List returns every object on s that the current login can see, except
// the group's own (Hidden: domain keys, group state) and
// objects the member will not describe (see Scan, which reports those).
//
// Cost: one FindObjects with an empty template, then two GetAttributes
// per object: identity and storage flags, then the public material the
// fingerprint needs, chosen by class and key type so that no request
// names an attribute the object lacks (pkg/slot answers such a request
// with one module call per attribute). Certificates and data objects
// lack CKA_KEY_TYPE (and data objects CKA_ID), so their first read costs
// one module call per attribute, and their second reads CKA_VALUE.
// Private EC and EdDSA keys whose token hides the public point (SoftHSM)
// take their fingerprint from the public key with the same CKA_ID in the
// same listing, with no further call. Secret keys without
// CKA_CHECK_VALUE (SoftHSM copies made by C_UnwrapKey, before Replicate
// sets it) cost one Encrypt where the key may encrypt in ECB mode.
func List(ctx context.Context, s *slot.Slot) ([]object.Object, error) {
	l, err := list(ctx, s, s.Name())
	return l.Objects, err
}

// Listing is what Scan found on one member.
type Listing struct {
	// Objects the member described, as List returns them.
	Objects []object.Object
	// Unreadable are the objects the member listed but would not
	// describe: left out of Objects.
	Unreadable []Unreadable
	// HalfMade are the objects an interrupted creation left on the
	// member (ErrHalfMade): left out of Objects.
	HalfMade []object.Object
}

// Unreadable is an object a member lists but answers a request error for
// when its identity or key material is read: SoftHSM 2.6.1, for one,
// answers CKR_ATTRIBUTE_VALUE_INVALID for an object file without
// CKA_CLASS, which it leaves behind when one thread reads an object while
// another is still writing it (the reader's refresh drops the attributes
// written so far, and the writer then stores what is left), for an
// object whose creation is still under way, and for one whose creation a
// kill stopped before CKA_CLASS was written (the key type comes first). Nothing can be known of its
// identity (Identity is nil) or only of its identity, so it is never
// copied, deleted or counted as a conflict; it is reported for an
// operator to inspect.
type Unreadable struct {
	Member   string
	Handle   pkcs11.ObjectHandle
	Identity *object.Identity // nil when not even the identity could be read
	Err      error
}

// String describes the object for messages: member, handle, identity when
// known, and the member's answer.
func (u Unreadable) String() string {
	what := fmt.Sprintf("object %d", u.Handle)
	if u.Identity != nil {
		what += " (" + u.Identity.String() + ")"
	}
	return fmt.Sprintf("member %s: %s cannot be read: %v", u.Member, what, u.Err)
}

// Scan lists s as List does and also returns the objects the member
// listed but would not describe (a request error such as
// CKR_ATTRIBUTE_VALUE_INVALID while reading them). A health error (the
// member is down, hung, or answers CKR_DEVICE_ERROR), a login error, or
// the end of ctx fails the scan; one unreadable object does not.
func Scan(ctx context.Context, s *slot.Slot) (Listing, error) {
	return list(ctx, s, s.Name())
}

// unreadable reports whether err, from reading one object, says that the
// member will not describe that object (a request error), as opposed to
// a failing member, a missing login or the caller giving up.
func unreadable(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	if errors.Is(err, object.ErrNoClass) {
		return true
	}
	var pe pkcs11.Error
	return errors.As(err, &pe) && slot.ClassOf(err) == slot.ClassRequest
}

func list(ctx context.Context, s object.Store, member string) (Listing, error) {
	var out Listing
	hs, err := s.FindObjects(ctx, nil)
	if err != nil {
		return out, fmt.Errorf("member %s: list objects: %w", member, err)
	}
	type pending struct {
		r   object.Result
		idx int
	}
	objs := make([]object.Object, 0, len(hs))
	var later []pending
	pubs := map[string][][]byte{} // key type + CKA_ID -> public key encodings
	pubKey := func(kt uint, id []byte) string { return fmt.Sprintf("%x/%x", kt, id) }
	skip := func(h pkcs11.ObjectHandle, id *object.Identity, err error) {
		out.Unreadable = append(out.Unreadable, Unreadable{Member: member, Handle: h, Identity: id, Err: err})
	}
	for _, h := range hs {
		r, err := object.ReadIdent(ctx, s, member, h)
		if err != nil {
			if object.IsGone(err) {
				continue // destroyed between FindObjects and now
			}
			if unreadable(ctx, err) {
				skip(h, r.Known(), err)
				continue
			}
			return out, err
		}
		id, a := r.Identity, r.Attrs
		if object.Hidden(id.Class, id.Label) {
			continue
		}
		if half, err := halfMade(ctx, s, r); err != nil {
			if object.IsGone(err) {
				continue
			}
			return out, fmt.Errorf("member %s: read attributes of %s: %w", member, id, err)
		} else if half {
			out.HalfMade = append(out.HalfMade, r.Object)
			continue
		}
		if id.Class == pkcs11.CKO_PRIVATE_KEY {
			// Needs the public halves, which may come later in the listing.
			later = append(later, pending{r, len(objs)})
			objs = append(objs, r.Object)
			continue
		}
		var fp []byte
		if id.Class == pkcs11.CKO_PUBLIC_KEY {
			var enc []byte
			enc, err = object.PublicKeyEncoding(ctx, s, h, id.KeyType, a, true)
			if err == nil {
				fp = object.Sum(enc)
				if len(id.ID) > 0 {
					k := pubKey(id.KeyType, id.ID)
					pubs[k] = append(pubs[k], enc)
				}
			}
		} else {
			fp, err = object.FingerprintOf(ctx, s, h, id, a, nil)
		}
		if err != nil {
			if object.IsGone(err) {
				continue
			}
			if !errors.Is(err, object.ErrNoFingerprint) {
				err = fmt.Errorf("member %s: fingerprint of %s: %w", member, id, err)
				if unreadable(ctx, err) {
					skip(h, &id, err)
					continue
				}
				return out, err
			}
		}
		r.Fingerprint = fp
		objs = append(objs, r.Object)
	}
	index := func(_ context.Context, kt uint, id []byte) ([][]byte, error) { return pubs[pubKey(kt, id)], nil }
	gone := map[int]bool{}
	for _, p := range later {
		fp, err := object.FingerprintOf(ctx, s, p.r.Handle, p.r.Identity, p.r.Attrs, index)
		if err != nil && !errors.Is(err, object.ErrNoFingerprint) {
			if object.IsGone(err) {
				gone[p.idx] = true
				continue
			}
			err = fmt.Errorf("member %s: fingerprint of %s: %w", member, p.r.Identity, err)
			if unreadable(ctx, err) {
				id := p.r.Identity
				skip(p.r.Handle, &id, err)
				gone[p.idx] = true
				continue
			}
			return out, err
		}
		objs[p.idx].Fingerprint = fp
	}
	if len(gone) > 0 {
		kept := objs[:0]
		for i, o := range objs {
			if !gone[i] {
				kept = append(kept, o)
			}
		}
		objs = kept
	}
	out.Objects = objs
	return out, nil
}
