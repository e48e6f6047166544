package state

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/hagroup/hagroup/internal/tokenquirk"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// State forms (DESIGN.md, "Group state on every make"): what a group state
// object is on a member's token. Every form is a private token object,
// seen and made only by a logged-in user, whose CKA_LABEL holds the state
// label (and a register's records) and can be rewritten in place:
//
//   - the data form, on every make that takes it: a CKO_DATA object whose
//     CKA_APPLICATION names the kind of state and whose CKA_VALUE holds
//     the object's value;
//   - the key form, on a make that refuses CKO_DATA token objects (NSS
//     softokn, tokenquirk.NoTokenDataObjects): a generic secret key that
//     may do nothing (every usage false, a random value it never shows),
//     whose CKA_ID holds the application, a random tag (NSS keeps one key
//     per CKA_ID) and the object's value.
//
// A token's make decides its form, so every process on every host reads
// and writes one member the same way. A make that cannot keep objects
// apart by handle (tokenquirk.ReusesLiveHandles) carries no group state
// at all (Carries).

// ErrNotCarried is wrapped when group state is read from or written to a
// member whose make carries none (Carries).
var ErrNotCarried = errors.New("the token's make carries no group state: a new object there may get the handle of a live one (tpm2-pkcs11)")

// Carries reports whether the group keeps its state on s's token.
func Carries(s *slot.Slot) bool {
	t := s.Token()
	return !tokenquirk.ReusesLiveHandles(t.Manufacturer, t.Model)
}

// keyForm reports whether s carries group state in the key form.
func keyForm(s *slot.Slot) bool {
	t := s.Token()
	return tokenquirk.NoTokenDataObjects(t.Manufacturer, t.Model)
}

// FormName names the form s carries group state in, for reports.
func FormName(s *slot.Slot) string {
	if keyForm(s) {
		return "private generic secret keys (the make takes no data token objects)"
	}
	return "private data objects"
}

// keyTagLen is the random tag that keeps two key-form objects' CKA_IDs
// apart.
const keyTagLen = 8

// privateState is the part of the template that makes or finds a group
// state object of s's form.
func privateState(s *slot.Slot) []*pkcs11.Attribute {
	if keyForm(s) {
		return []*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY),
			pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_GENERIC_SECRET),
			pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
			pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
		}
	}
	return Private()
}

// Template returns the template of a new group state object on s:
// label, application app, value, and whether its label may be rewritten.
func Template(s *slot.Slot, label, app string, value []byte, modifiable bool) ([]*pkcs11.Attribute, error) {
	if !Carries(s) {
		return nil, fmt.Errorf("member %s: %w", s.Name(), ErrNotCarried)
	}
	tmpl := append(privateState(s),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, []byte(label)),
		pkcs11.NewAttribute(pkcs11.CKA_MODIFIABLE, modifiable))
	if !keyForm(s) {
		tmpl = append(tmpl, pkcs11.NewAttribute(pkcs11.CKA_APPLICATION, []byte(app)))
		if value != nil {
			// A register has none: some makes refuse an empty CKA_VALUE
			// (tpm2-pkcs11 does).
			tmpl = append(tmpl, pkcs11.NewAttribute(pkcs11.CKA_VALUE, value))
		}
		return tmpl, nil
	}
	tag := make([]byte, keyTagLen)
	key := make([]byte, 32)
	if _, err := rand.Read(tag); err != nil {
		return nil, err
	}
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	id := append(append(keyIDPrefix(app), tag...), value...)
	tmpl = append(tmpl,
		pkcs11.NewAttribute(pkcs11.CKA_ID, id),
		pkcs11.NewAttribute(pkcs11.CKA_VALUE, key),
		pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true),
		pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, false))
	for _, use := range []uint{pkcs11.CKA_ENCRYPT, pkcs11.CKA_DECRYPT, pkcs11.CKA_SIGN, pkcs11.CKA_VERIFY,
		pkcs11.CKA_WRAP, pkcs11.CKA_UNWRAP, pkcs11.CKA_DERIVE} {
		tmpl = append(tmpl, pkcs11.NewAttribute(use, false))
	}
	return tmpl, nil
}

// keyIDPrefix starts the CKA_ID of a key-form object of application app.
func keyIDPrefix(app string) []byte { return append([]byte(app), 0) }

// Find returns the handles of s's group state objects of application
// app (in the key form, of every generic secret key: Read tells
// them apart). s must be logged in.
func Find(ctx context.Context, s *slot.Slot, app string) ([]pkcs11.ObjectHandle, error) {
	if !Carries(s) {
		return nil, fmt.Errorf("member %s: %w", s.Name(), ErrNotCarried)
	}
	tmpl := privateState(s)
	if !keyForm(s) {
		tmpl = append(tmpl, pkcs11.NewAttribute(pkcs11.CKA_APPLICATION, []byte(app)))
	}
	return s.FindObjects(ctx, tmpl)
}

// Content is what Read read of one object.
type Content struct {
	Label string
	Value []byte // nil unless asked for
}

// Read reads object h of s as a group state object of application
// app: its label, and its value when withValue. ok is false when h is
// not one (another key, in the key form) or cannot be read whole yet
// (being written). A handle that names nothing is a plain error: the
// caller's checks (slot.CodeOf) apply.
func Read(ctx context.Context, s *slot.Slot, h pkcs11.ObjectHandle, app string, withValue bool) (Content, bool, error) {
	types := []uint{pkcs11.CKA_LABEL, pkcs11.CKA_APPLICATION, pkcs11.CKA_VALUE}
	if keyForm(s) {
		types = []uint{pkcs11.CKA_LABEL, pkcs11.CKA_ID}
	} else if !withValue {
		types = types[:2]
	}
	attrs, err := s.GetAttributes(ctx, h, types)
	if err != nil {
		return Content{}, false, err
	}
	if len(attrs) != len(types) {
		return Content{}, false, nil
	}
	for _, a := range attrs {
		if a.Status != pkcs11.CKR_OK {
			return Content{}, false, nil
		}
	}
	r := Content{Label: string(attrs[0].Value)}
	if keyForm(s) {
		p := keyIDPrefix(app)
		id := attrs[1].Value
		if len(id) < len(p)+keyTagLen || !bytes.Equal(id[:len(p)], p) {
			return Content{}, false, nil
		}
		if withValue {
			r.Value = bytes.Clone(id[len(p)+keyTagLen:])
		}
		return r, true, nil
	}
	if string(attrs[1].Value) != app {
		return Content{}, false, nil
	}
	if withValue {
		r.Value = attrs[2].Value
	}
	return r, true, nil
}

// Probe tries on s what the group's state needs there, in s's form,
// and leaves nothing: a state object holding a chunk's worth of value
// made, read back and destroyed (err nil: s can hold the group's state),
// and its label rewritten in place to one as long as a full tombstone
// register (inPlace: registers are kept in place there; otherwise the
// member is written with created objects, which cost more).
func Probe(ctx context.Context, s *slot.Slot) (inPlace bool, err error) {
	if !Carries(s) {
		return false, ErrNotCarried
	}
	const app = "hagroup/probe"
	label := object.StateLabelPrefix + "probe"
	value := bytes.Repeat([]byte{0xa5}, probeLen)
	tmpl, err := Template(s, label, app, value, true)
	if err != nil {
		return false, err
	}
	h, err := s.CreateObject(ctx, tmpl)
	if err != nil {
		return false, fmt.Errorf("it refuses a group state object (%s): %w", FormName(s), err)
	}
	destroyed := false
	defer func() {
		if !destroyed {
			s.DestroyObject(context.WithoutCancel(ctx), h)
		}
	}()
	r, ok, err := Read(ctx, s, h, app, true)
	if err != nil || !ok || r.Label != label || !bytes.Equal(r.Value, value) {
		return false, fmt.Errorf("it does not give back the group state object it took (%s): %v", FormName(s), err)
	}
	long := label + "/" + string(bytes.Repeat([]byte("r"), probeLen))
	inPlace = s.SetAttributes(ctx, h, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_LABEL, long)}) == nil
	if inPlace {
		r, ok, err := Read(ctx, s, h, app, false)
		inPlace = err == nil && ok && r.Label == long
	}
	destroyed = true
	if err := s.DestroyObject(ctx, h); err != nil {
		return false, fmt.Errorf("it will not destroy a group state object: %w", err)
	}
	return inPlace, nil
}

// probeLen is about the records of a full register or chunk (tombstone's
// DefaultChunkRecords), in bytes.
const probeLen = 24 << 10
