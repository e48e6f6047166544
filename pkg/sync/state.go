package sync

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// Group state on the members (DESIGN.md, "Group state on the members"):
// what every process on every host must agree on — the tombstones, the
// markers saying how far each member has caught up — is kept on the
// members themselves, as private token objects labelled StateLabel, of
// the form the member's make takes (stateform.go). They are the group's, not the application's: List, the
// virtual slot's searches and the plan leave them out (Hidden), and they
// are merged by their own rule instead of being copied as objects.
//
// Tokens have no transactions, so an object written here is never
// changed (the tombstone registers of pkg/sync/tombstone, written in
// place by their one owner, are the exception, with their own rule): a writer
// creates a new object holding what it read merged with what it adds, and
// only then destroys the objects it read. A reader takes the union of
// every object under the label. A concurrent writer's object, created
// after this writer's read, is never destroyed by it, so no record is lost
// when two processes or hosts write at once; at worst an extra object
// stays until the next write folds it in.

// ErrNotLoggedIn is wrapped when group state is read from or written to
// a member that is not logged in as the user.
var ErrNotLoggedIn = errors.New("not logged in: group state is private")

// StateLabel is the CKA_LABEL of the group state objects of one kind
// (e.g. "tombstones") of the group with the given serial.
func StateLabel(groupSerial, kind string) string {
	return object.StateLabelPrefix + groupSerial + ":" + kind
}

// StateObject is one group state object read from a member.
type StateObject struct {
	Handle pkcs11.ObjectHandle
	Value  []byte
}

// PrivateState is what every group state object of the data form is,
// made or searched for: a private token data object (see stateform.go for
// the key form of a make without data token objects). Private: an object anyone could plant
// without the user PIN (a public one) must never count as group state — a
// forged tombstone would delete a live key on every member.
func PrivateState() []*pkcs11.Attribute {
	return []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_DATA),
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
		pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
	}
}

// WriteState stores value on s as a new group state object labelled
// label, with CKA_APPLICATION app, and then destroys the objects in
// merged, whose content value must hold. An object of merged whose value
// is no longer the one read (gone, or the handle names another object by
// now) is left alone. It returns the new object.
func WriteState(ctx context.Context, s *slot.Slot, label, app string, value []byte, merged []StateObject) (StateObject, error) {
	if !s.LoggedIn() {
		return StateObject{}, fmt.Errorf("member %s: write %s: %w", s.Name(), label, ErrNotLoggedIn)
	}
	tmpl, err := StateTemplate(s, label, app, value, false)
	if err != nil {
		return StateObject{}, err
	}
	h, err := s.CreateObject(ctx, tmpl)
	if err != nil {
		return StateObject{}, fmt.Errorf("member %s: write %s (%d bytes): %w", s.Name(), label, len(value), err)
	}
	for _, o := range merged {
		if err := destroyIfSame(ctx, s, label, app, o); err != nil {
			return StateObject{Handle: h, Value: value}, err
		}
	}
	return StateObject{Handle: h, Value: value}, nil
}

// DestroyStateIfSame destroys o on s unless its handle no longer names
// the state object of application app labelled label holding o's value.
func DestroyStateIfSame(ctx context.Context, s *slot.Slot, label, app string, o StateObject) error {
	return destroyIfSame(ctx, s, label, app, o)
}

// destroyIfSame destroys o on s if its handle still names a state object
// labelled label holding o's value: a handle kept from an earlier read
// may name another object by now (handles can change with a re-login),
// whose content the writer does not hold.
func destroyIfSame(ctx context.Context, s *slot.Slot, label, app string, o StateObject) error {
	r, ok, err := ReadState(ctx, s, o.Handle, app, true)
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
