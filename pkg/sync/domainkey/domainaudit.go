package domainkey

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/hagroup/hagroup/internal/tokenquirk"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// ErrWeak is wrapped by errors saying a member's domain key could
// be turned into more than a key that wraps and unwraps: a user with the
// user PIN could make it decrypt the blobs it wraps, and so read every key
// the group replicates. Nothing is replicated to or from such a member
// until an operator replaces the key (Replace). Use errors.As
// with *WeakError for the member and the attributes at fault.
var ErrWeak = errors.New("weak domain key")

// WeakError says which attributes of Member's domain key Label
// are not what the ceremony makes.
type WeakError struct {
	Member string
	Label  string
	// Flaws name each attribute at fault, e.g. "CKA_MODIFIABLE=true".
	Flaws []string
}

func (e *WeakError) Error() string {
	return fmt.Sprintf("member %s: %v %q (%s): a user with the user PIN could make it decrypt what it wraps; nothing is replicated to or from this member until the key is replaced (hactl hagroup domain --replace)",
		e.Member, ErrWeak, e.Label, strings.Join(e.Flaws, ", "))
}

// Unwrap makes errors.Is(err, ErrWeak) true and gives the error
// a CKR code (CKR_KEY_FUNCTION_NOT_PERMITTED: the key may not serve), so
// that slot.ClassOf takes it for a request error, never a health failure.
func (e *WeakError) Unwrap() []error {
	return []error{ErrWeak, pkcs11.Error(pkcs11.CKR_KEY_FUNCTION_NOT_PERMITTED)}
}

// domainRule is one boolean attribute of the domain key and the value the
// ceremony gives it.
type domainRule struct {
	typ  uint
	name string
	want bool
}

// domainRules is the domain key's protection: it wraps and unwraps and
// does nothing else, and can be neither changed, copied nor extracted.
// The ceremony writes these values and reads them back; the audit
// refuses a key that differs from any of them.
var domainRules = []domainRule{
	{pkcs11.CKA_WRAP, "CKA_WRAP", true},
	{pkcs11.CKA_UNWRAP, "CKA_UNWRAP", true},
	{pkcs11.CKA_ENCRYPT, "CKA_ENCRYPT", false},
	{pkcs11.CKA_DECRYPT, "CKA_DECRYPT", false},
	{pkcs11.CKA_SIGN, "CKA_SIGN", false},
	{pkcs11.CKA_VERIFY, "CKA_VERIFY", false},
	{pkcs11.CKA_DERIVE, "CKA_DERIVE", false},
	{pkcs11.CKA_SENSITIVE, "CKA_SENSITIVE", true},
	{pkcs11.CKA_EXTRACTABLE, "CKA_EXTRACTABLE", false},
	{pkcs11.CKA_MODIFIABLE, "CKA_MODIFIABLE", false},
	{pkcs11.CKA_COPYABLE, "CKA_COPYABLE", false},
}

// domainMechanisms is the domain key's CKA_ALLOWED_MECHANISMS: the one
// mechanism replication uses. It is read-only on SoftHSM, so even a copy
// given CKA_DECRYPT could not decrypt (CKR_MECHANISM_INVALID); that closes
// the moment of a trusted ceremony when the key is still a public,
// modifiable object.
var domainMechanisms = []uint{Mechanism}

// allowedMechanismsValue encodes ms as a CK_MECHANISM_TYPE array.
func allowedMechanismsValue(ms []uint) []byte {
	out := make([]byte, 0, 8*len(ms))
	for _, m := range ms {
		out = binary.NativeEndian.AppendUint64(out, uint64(m))
	}
	return out
}

// domainProtection is the attributes the ceremony gives the domain key,
// from domainRules and domainMechanisms.
func domainProtection() []*pkcs11.Attribute {
	t := make([]*pkcs11.Attribute, 0, len(domainRules)+1)
	for _, r := range domainRules {
		t = append(t, object.BoolAttr(r.typ, r.want))
	}
	return append(t, pkcs11.NewAttribute(pkcs11.CKA_ALLOWED_MECHANISMS, allowedMechanismsValue(domainMechanisms)))
}

// Copier is what the audit needs of a member: reading a key and trying to
// copy it.
type Copier interface {
	object.Store
	CopyObject(ctx context.Context, h pkcs11.ObjectHandle, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error)
	GetNestedAttribute(ctx context.Context, h pkcs11.ObjectHandle, typ uint) ([]*pkcs11.Attribute, error)
}

var _ Copier = (*slot.Slot)(nil)

// AuditHandle returns what is wrong with the domain key h on s (nil
// when nothing is): every attribute of domainRules read back,
// CKA_ALLOWED_MECHANISMS, and the unwrap template (see unwrapFlaws). A key
// the token leaves CKA_COPYABLE=true (SoftHSM 2.6.1 cannot clear it on the
// private copy of a trusted ceremony) passes only if it is not modifiable
// and the token refuses the copies of CopyTrials, each tried as an
// attacker would — unless refused says this process saw the token refuse
// them for this very key already (see Replicator.domainKey). tried
// reports that the copies were tried, or skipped so, and refused.
func AuditHandle(ctx context.Context, s Copier, h pkcs11.ObjectHandle, refused bool) (flaws []string, tried bool, err error) {
	types := make([]uint, 0, len(domainRules)+1)
	for _, r := range domainRules {
		types = append(types, r.typ)
	}
	a, err := object.ReadAttrs(ctx, s, h, append(types, pkcs11.CKA_ALLOWED_MECHANISMS, pkcs11.CKA_TRUSTED))
	if err != nil {
		return nil, false, fmt.Errorf("read the domain key's attributes: %w", err)
	}
	copyable := false
	for _, r := range domainRules {
		switch {
		case !a.NonEmpty(r.typ) && r.typ == pkcs11.CKA_COPYABLE:
			// A token silent on it may copy the key: the copies tell.
			flaws = append(flaws, r.name+" not answered by the token")
			copyable = !a.Boolean(pkcs11.CKA_MODIFIABLE)
		case !a.NonEmpty(r.typ):
			flaws = append(flaws, r.name+" not answered by the token")
		case a.Boolean(r.typ) == r.want:
		case r.typ == pkcs11.CKA_COPYABLE:
			copyable = true
		default:
			flaws = append(flaws, fmt.Sprintf("%s=%v", r.name, !r.want))
		}
	}
	if !sameMechanisms(a[pkcs11.CKA_ALLOWED_MECHANISMS], domainMechanisms) {
		flaws = append(flaws, "CKA_ALLOWED_MECHANISMS not only "+MechanismName(Mechanism))
	}
	uf, err := unwrapFlaws(ctx, s, h, a.Boolean(pkcs11.CKA_TRUSTED))
	if err != nil {
		return nil, false, err
	}
	flaws = append(flaws, uf...)
	if !copyable || a.Boolean(pkcs11.CKA_MODIFIABLE) {
		if copyable {
			flaws = append(flaws, "CKA_COPYABLE=true")
		}
		return flaws, false, nil
	}
	if refused {
		return flaws, true, nil
	}
	f, err := copyFlaw(ctx, s, h)
	if err != nil {
		return nil, false, err
	}
	if f != "" {
		return append(flaws, f), false, nil
	}
	return flaws, true, nil
}

// unwrapFlaws checks the domain key's CKA_UNWRAP_TEMPLATE: without
// CKA_SENSITIVE=true in it a user unwraps a blob (wrapped under the same
// value on any member) into a key whose value it reads; under a trusted
// key, without CKA_WRAP_WITH_TRUSTED=true an unwrapped key could be
// wrapped again under a key of the user's own.
func unwrapFlaws(ctx context.Context, s Copier, h pkcs11.ObjectHandle, trusted bool) ([]string, error) {
	tmpl, err := s.GetNestedAttribute(ctx, h, pkcs11.CKA_UNWRAP_TEMPLATE)
	if err != nil {
		if slot.ClassOf(err) == slot.ClassRequest {
			return []string{"CKA_UNWRAP_TEMPLATE not answered by the token"}, nil
		}
		return nil, fmt.Errorf("read the domain key's CKA_UNWRAP_TEMPLATE: %w", err)
	}
	forced := map[uint]bool{}
	for _, a := range tmpl {
		forced[a.Type] = len(a.Value) == 1 && a.Value[0] != 0
	}
	var flaws []string
	if !forced[pkcs11.CKA_SENSITIVE] {
		flaws = append(flaws, "CKA_UNWRAP_TEMPLATE does not force CKA_SENSITIVE=true")
	}
	if trusted && !forced[pkcs11.CKA_WRAP_WITH_TRUSTED] {
		flaws = append(flaws, "CKA_UNWRAP_TEMPLATE does not force CKA_WRAP_WITH_TRUSTED=true")
	}
	return flaws, nil
}

// CopyTrials are the copies a copyable domain key is tried with: each one
// that a token made would give up the key's secret (a copy that decrypts,
// one that can be extracted or read, one that can be changed at will, one
// allowed CKM_AES_ECB). Other usages (encrypt, sign, derive) would not
// reveal what the key wraps, and each trial is a call on the member.
var CopyTrials = []struct {
	name string
	a    *pkcs11.Attribute
}{
	{"CKA_DECRYPT=true", object.BoolAttr(pkcs11.CKA_DECRYPT, true)},
	{"CKA_EXTRACTABLE=true", object.BoolAttr(pkcs11.CKA_EXTRACTABLE, true)},
	{"CKA_SENSITIVE=false", object.BoolAttr(pkcs11.CKA_SENSITIVE, false)},
	{"CKA_MODIFIABLE=true", object.BoolAttr(pkcs11.CKA_MODIFIABLE, true)},
	{"CKA_ALLOWED_MECHANISMS=CKM_AES_ECB", pkcs11.NewAttribute(pkcs11.CKA_ALLOWED_MECHANISMS, allowedMechanismsValue([]uint{pkcs11.CKM_AES_ECB}))},
}

// copyFlaw says what is wrong with a copyable, non-modifiable domain key:
// nothing when the token refuses every trial copy (SoftHSM answers
// CKR_ATTRIBUTE_READ_ONLY to any attribute in the copy of a non-modifiable
// object), so that a copy can only be the same key. A trial copy the token
// makes is destroyed at once. Each trial writes on the token even when it
// is refused: SoftHSM commits the whole copy before it applies the
// template, and destroys it then; a member killed in between keeps a
// second, identical domain key.
func copyFlaw(ctx context.Context, s Copier, h pkcs11.ObjectHandle) (string, error) {
	for _, tr := range CopyTrials {
		c, err := s.CopyObject(ctx, h, []*pkcs11.Attribute{tr.a})
		if err == nil {
			clean := object.CleanupContext(ctx)
			derr := s.DestroyObject(clean.Ctx, c)
			clean.Cancel()
			if derr != nil {
				return "", fmt.Errorf("a trial copy of the domain key with %s was made and could not be destroyed (handle %d): %w", tr.name, c, derr)
			}
			return fmt.Sprintf("CKA_COPYABLE=true (a copy may set %s)", tr.name), nil
		}
		if slot.ClassOf(err) != slot.ClassRequest {
			return "", fmt.Errorf("try to copy the domain key with %s: %w", tr.name, err)
		}
	}
	return "", nil
}

// sameMechanisms reports whether v, a CK_MECHANISM_TYPE array, lists
// exactly want.
func sameMechanisms(v []byte, want []uint) bool {
	return len(v) > 0 && string(v) == string(allowedMechanismsValue(want))
}

// AuditResult is what Audit found on one member.
type AuditResult struct {
	Member string
	Label  string
	// Found: the member holds the domain key (AES-256, private, wrap and
	// unwrap).
	Found bool
	// CheckValue is the key's CKA_CHECK_VALUE (when Found).
	CheckValue []byte
	// Trusted: the key carries CKA_TRUSTED.
	Trusted bool
	// Flaws name the attributes at fault; empty when the key is sound.
	Flaws []string
}

// Weak reports whether a domain key was found and has flaws.
func (d AuditResult) Weak() bool { return d.Found && len(d.Flaws) > 0 }

// Audit finds the group's domain key on s and audits it (see
// WeakError for what makes it weak). A member without one gives
// Found=false and no error; an error is the member failing to answer, or
// two domain keys that differ (ErrConflict).
func Audit(ctx context.Context, s *slot.Slot, groupSerial string) (AuditResult, error) {
	d := AuditResult{Member: s.Name(), Label: Label(groupSerial)}
	dk, err := Lookup(ctx, s, s.Name(), groupSerial)
	switch {
	case errors.Is(err, ErrNotFound):
		return d, nil
	case err != nil:
		return d, err
	}
	d.Found, d.CheckValue, d.Trusted = true, dk.KCV, dk.Trusted
	flaws, _, err := AuditHandle(ctx, s, dk.Handle, false)
	if err != nil {
		return d, fmt.Errorf("member %s: audit domain key %q: %w", s.Name(), d.Label, err)
	}
	d.Flaws = flaws
	return d, nil
}

// weakError is the error of a weak audit, nil for a sound one.
func (d AuditResult) weakError() error {
	if !d.Weak() {
		return nil
	}
	return &WeakError{Member: d.Member, Label: d.Label, Flaws: d.Flaws}
}

// ErrNoWrapOnlyKey is wrapped by errors saying a member's make cannot keep
// a key that wraps and unwraps and nothing else (NSS softokn 3.87: it
// keeps no CKA_UNWRAP_TEMPLATE and copies a non-modifiable key into one
// that decrypts or is extractable). Such a member holds no domain key:
// keys reach it, and leave it, under keys agreed for each copy
// (agree.go), and only keys a user could wrap under a key of their own.
var ErrNoWrapOnlyKey = errors.New("the token cannot keep a wrap-only key")

// WrapOnlyFlaws tries whether the token of s keeps the domain key's
// protection (domainRules, CKA_ALLOWED_MECHANISMS, the unwrap template,
// and the refusal of weaker copies) on a throwaway key of its template,
// made as a private token object (NSS keeps on a session object what it
// does not keep on a token object), audited as a domain key is, and
// destroyed; s must be logged in as the user. A token that refuses the
// template is tried again without CKA_COPYABLE and CKA_ALLOWED_MECHANISMS,
// so that every flaw is named. It returns the attributes at fault, none
// when the token keeps them all. A make that carries keys by pair only
// (no AES key wrap: internal/tokenquirk) could not use such a key, and is
// not tried.
func WrapOnlyFlaws(ctx context.Context, s *slot.Slot) ([]string, error) {
	if flaw := PairOnly(s); flaw != nil {
		return flaw, nil
	}
	v := make([]byte, 32)
	if _, err := rand.Read(v); err != nil {
		return nil, err
	}
	defer clear(v)
	// Labelled as the group's own keys are, so that no listing (another
	// host's catch-up among them) takes it for an object of the group.
	label := Label(fmt.Sprintf("trial-%x", v[:4]))
	tmpl := Template(label, v, true, false)
	nested := map[uint][]*pkcs11.Attribute{pkcs11.CKA_UNWRAP_TEMPLATE: UnwrapTemplate(false)}
	var flaws []string
	h, err := s.CreateObjectNested(ctx, tmpl, nested)
	if err != nil {
		if refused, ferr := refusedHere(ctx, s, err); !refused {
			return nil, fmt.Errorf("member %s: try a wrap-only key: %w", s.Name(), ferr)
		}
		flaws = append(flaws, "the token refuses CKA_COPYABLE or CKA_ALLOWED_MECHANISMS on a token key ("+pkcs11.Error(slot.CodeOf(err)).Error()+")")
		var kept []*pkcs11.Attribute
		for _, a := range tmpl {
			if a.Type != pkcs11.CKA_COPYABLE && a.Type != pkcs11.CKA_ALLOWED_MECHANISMS {
				kept = append(kept, a)
			}
		}
		// Without its nested template too: NSS 3.87's C_CopyObject of a
		// token key that carries one corrupts its heap, and the copies are
		// what tells a key that stays wrap-only.
		flaws = append(flaws, "CKA_UNWRAP_TEMPLATE not tried")
		if h, err = s.CreateObject(ctx, kept); err != nil {
			if refused, ferr := refusedHere(ctx, s, err); !refused {
				return nil, fmt.Errorf("member %s: try a wrap-only key: %w", s.Name(), ferr)
			}
			return append(flaws, "the token refuses an AES key that wraps only ("+pkcs11.Error(slot.CodeOf(err)).Error()+")"), nil
		}
	}
	defer object.Discard(ctx, s, h)
	more, _, err := AuditHandle(ctx, s, h, false)
	if err != nil {
		return nil, fmt.Errorf("member %s: try a wrap-only key: %w", s.Name(), err)
	}
	return append(flaws, more...), nil
}

// refusedHere reports whether err is the token refusing a template: a
// request error, or CKR_GENERAL_ERROR from a token that answers the next
// call (NSS's answer to an attribute it cannot store). Another failure of
// a token that answers is a module that cannot carry the nested unwrap
// template (ErrNestedTemplates, as createNested says).
func refusedHere(ctx context.Context, s *slot.Slot, err error) (bool, error) {
	if slot.ClassOf(err) == slot.ClassRequest {
		return true, nil
	}
	if _, perr := s.TokenInfo(ctx); perr != nil {
		return false, err
	}
	if slot.CodeOf(err) == pkcs11.CKR_GENERAL_ERROR {
		return true, nil
	}
	return false, fmt.Errorf("%w: it refused a key with a nested CKA_UNWRAP_TEMPLATE (%w) but answers other calls, as p11-kit 0.24's RPC does: install the domain key through a module that reaches the token directly",
		ErrNestedTemplates, err)
}

// NoWrapOnlyKeyError says which of the domain key's rules Member's token
// does not keep.
type NoWrapOnlyKeyError struct {
	Member string
	Flaws  []string
}

func (e *NoWrapOnlyKeyError) Error() string {
	return fmt.Sprintf("member %s: %v (%s): it holds no domain key; keys reach it under keys agreed for each copy, and a key made unextractable under a trusted domain key does not",
		e.Member, ErrNoWrapOnlyKey, strings.Join(e.Flaws, ", "))
}

func (e *NoWrapOnlyKeyError) Unwrap() error { return ErrNoWrapOnlyKey }

// PairOnly is the flaw of a make that carries keys by pair only (no AES
// key wrap: internal/tokenquirk), which could not use a domain key; nil
// for another make.
func PairOnly(s *slot.Slot) []string {
	if t := s.Token(); tokenquirk.CarriesKeysByPairOnly(t.Manufacturer, t.Model) {
		return []string{"the token offers no AES key wrap, the domain key's one use"}
	}
	return nil
}
