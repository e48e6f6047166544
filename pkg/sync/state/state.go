package state

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// ErrNotLoggedIn is wrapped when group state is read from or written to
// a member that is not logged in as the user.
var ErrNotLoggedIn = errors.New("not logged in: group state is private")

// Label is the CKA_LABEL of the group state objects of one kind
// (e.g. "tombstones") of the group with the given serial.
func Label(groupSerial, kind string) string {
	return object.StateLabelPrefix + groupSerial + ":" + kind
}

// Object is one group state object read from a member.
type Object struct {
	Handle pkcs11.ObjectHandle
	Value  []byte
}

// Private is what every group state object of the data form is,
// made or searched for: a private token data object (see stateform.go for
// the key form of a make without data token objects). Private: an object anyone could plant
// without the user PIN (a public one) must never count as group state — a
// forged tombstone would delete a live key on every member.
func Private() []*pkcs11.Attribute {
	return []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_DATA),
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
		pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
	}
}

// Write stores value on s as a new group state object labelled
// label, with CKA_APPLICATION app, and then destroys the objects in
// merged, whose content value must hold. An object of merged whose value
// is no longer the one read (gone, or the handle names another object by
// now) is left alone. It returns the new object.
func Write(ctx context.Context, s *slot.Slot, label, app string, value []byte, merged []Object) (Object, error) {
	if !s.LoggedIn() {
		return Object{}, fmt.Errorf("member %s: write %s: %w", s.Name(), label, ErrNotLoggedIn)
	}
	tmpl, err := Template(s, label, app, value, false)
	if err != nil {
		return Object{}, err
	}
	h, err := s.CreateObject(ctx, tmpl)
	if err != nil {
		return Object{}, fmt.Errorf("member %s: write %s (%d bytes): %w", s.Name(), label, len(value), err)
	}
	for _, o := range merged {
		if err := DestroyIfSame(ctx, s, label, app, o); err != nil {
			return Object{Handle: h, Value: value}, err
		}
	}
	return Object{Handle: h, Value: value}, nil
}

// DestroyIfSame destroys o on s if its handle still names a state
// object of application app labelled label holding o's value: a handle
// kept from an earlier read may name another object by now (handles can
// change with a re-login), whose content the writer does not hold.
func DestroyIfSame(ctx context.Context, s *slot.Slot, label, app string, o Object) error {
	r, ok, err := Read(ctx, s, o.Handle, app, true)
	if err != nil {
		if object.IsGone(err) || slot.ClassOf(err) == slot.ClassRequest {
			return nil
		}
		return fmt.Errorf("member %s: read an older %s (object %d): %w", s.Name(), label, o.Handle, err)
	}
	if !ok || r.Label != label || !bytes.Equal(r.Value, o.Value) {
		return nil
	}
	if err := s.DestroyObject(ctx, o.Handle); err != nil && !object.IsGone(err) {
		return fmt.Errorf("member %s: remove an older %s (object %d): %w", s.Name(), label, o.Handle, err)
	}
	return nil
}
