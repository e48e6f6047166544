package domainkey

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"

	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// ErrNotFound is wrapped by errors saying a member holds no domain key
// for the group.
var ErrNotFound = errors.New("no domain key")

// ErrPartial is wrapped when some members of a group hold its domain
// key and others do not: the value cannot be recovered from a token, so
// the missing members cannot be given the same key. Remove the domain key
// from every member (Remove) and install a fresh one.
var ErrPartial = errors.New("domain key on some members only")

// ErrNestedTemplates is wrapped when a member's module cannot create the
// domain key with its nested CKA_UNWRAP_TEMPLATE although the token
// answers other calls: p11-kit 0.24's RPC answers CKR_DEVICE_ERROR to any
// nested attribute. Without the template a user could unwrap a blob into
// a readable key, so no domain key is installed there; install it
// through a module that reaches the token directly.
var ErrNestedTemplates = errors.New("the module cannot carry nested attribute templates")

// Label is the CKA_LABEL of the domain key of the group with the
// given serial.
func Label(groupSerial string) string { return object.DomainLabelPrefix + groupSerial }

// Target is one member in a domain-key installation.
type Target struct {
	// Slot is the member, opened and logged in as the user.
	Slot *slot.Slot
	// SOPIN, when set, makes the install trusted: the key is created by
	// the SO with CKA_TRUSTED, so keys with CKA_WRAP_WITH_TRUSTED can be
	// wrapped under it. Empty: an untrusted key made by the user.
	SOPIN secret.PIN
	// UserPIN logs the user back in after the SO step of a trusted
	// install; required with SOPIN (slot.Slot.Logout forgets the PIN the
	// slot kept from Open).
	UserPIN secret.PIN
}

// Template is the domain key: AES-256 with domainProtection,
// wrapping and unwrapping only and neither changed, copied nor extracted.
// A trusted install's original is made by the SO as a public object and
// copied to a private one by the user; SoftHSM refuses every attribute in
// the copy of an object that is not modifiable (CKR_ATTRIBUTE_READ_ONLY),
// and will not clear CKA_COPYABLE in a copy, so that original stays
// modifiable and copyable until it is copied and destroyed, moments later.
// Its CKA_ALLOWED_MECHANISMS and CKA_UNWRAP_TEMPLATE are read-only, so
// nothing done to it in that moment makes it decrypt or unwrap a readable
// key; a change to its usage shows in the copy, which is read back.
func Template(label string, value []byte, private, trusted bool) []*pkcs11.Attribute {
	t := []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY),
		pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
		pkcs11.NewAttribute(pkcs11.CKA_VALUE, value),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, label),
		object.BoolAttr(pkcs11.CKA_TOKEN, true),
		object.BoolAttr(pkcs11.CKA_PRIVATE, private),
	}
	t = append(t, domainProtection()...)
	if trusted {
		t = object.Override(t, []*pkcs11.Attribute{
			object.BoolAttr(pkcs11.CKA_TRUSTED, true),
			object.BoolAttr(pkcs11.CKA_MODIFIABLE, true),
			object.BoolAttr(pkcs11.CKA_COPYABLE, true),
		})
	}
	return t
}

// privateCopyTemplate turns a trusted install's public original into the
// domain key: private, and no longer modifiable.
func privateCopyTemplate() []*pkcs11.Attribute {
	return []*pkcs11.Attribute{
		object.BoolAttr(pkcs11.CKA_PRIVATE, true),
		object.BoolAttr(pkcs11.CKA_TOKEN, true),
		object.BoolAttr(pkcs11.CKA_MODIFIABLE, false),
	}
}

// UnwrapTemplate is forced on every key unwrapped under the domain key.
// CKA_SENSITIVE=true stops a user from unwrapping a blob as a readable
// key. A trusted install also forces CKA_WRAP_WITH_TRUSTED, so replicas
// stay wrappable by the trusted domain key alone. An untrusted install
// must not: a key with CKA_WRAP_WITH_TRUSTED can be wrapped only by a
// CKA_TRUSTED key, and there is none, so replicas could never be
// replicated again (from a member that outlived the primary).
func UnwrapTemplate(trusted bool) []*pkcs11.Attribute {
	t := []*pkcs11.Attribute{object.BoolAttr(pkcs11.CKA_SENSITIVE, true)}
	if trusted {
		t = append(t, object.BoolAttr(pkcs11.CKA_WRAP_WITH_TRUSTED, true))
	}
	return t
}

// Find returns the handle of the group's domain key on s: a
// private AES key labelled Label(groupSerial) that may wrap and
// unwrap. The handle is valid until the member's next logout. The error
// wraps ErrNotFound when there is none.
func Find(ctx context.Context, s *slot.Slot, groupSerial string) (pkcs11.ObjectHandle, error) {
	dk, err := Lookup(ctx, s, s.Name(), groupSerial)
	return dk.Handle, err
}

// Found is a domain key as Lookup sees it.
type Found struct {
	Handle  pkcs11.ObjectHandle
	KCV     []byte // CKA_CHECK_VALUE
	Trusted bool   // CKA_TRUSTED
}

// Lookup searches with the most precise template the key allows
// (class, key type, label, private, token, wrap, unwrap), so the token
// returns it alone; SoftHSM still visits every object to answer, which is
// why Replicator remembers the handle.
func Lookup(ctx context.Context, s object.Store, member, groupSerial string) (Found, error) {
	label := Label(groupSerial)
	hs, err := s.FindObjects(ctx, []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY),
		pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, label),
		object.BoolAttr(pkcs11.CKA_PRIVATE, true),
		object.BoolAttr(pkcs11.CKA_TOKEN, true),
		object.BoolAttr(pkcs11.CKA_WRAP, true),
		object.BoolAttr(pkcs11.CKA_UNWRAP, true),
	})
	if err != nil {
		return Found{}, fmt.Errorf("member %s: find domain key %q: %w", member, label, err)
	}
	var found Found
	for _, h := range hs {
		a, err := object.ReadAttrs(ctx, s, h, []uint{pkcs11.CKA_VALUE_LEN, pkcs11.CKA_CHECK_VALUE, pkcs11.CKA_TRUSTED})
		if err != nil {
			return Found{}, fmt.Errorf("member %s: read domain key %q: %w", member, label, err)
		}
		if n, _ := a.Ulong(pkcs11.CKA_VALUE_LEN); n != 32 {
			continue
		}
		if found.Handle != 0 {
			if !bytes.Equal(found.KCV, a[pkcs11.CKA_CHECK_VALUE]) {
				return Found{}, fmt.Errorf("member %s: %w: two domain keys %q with check values %s and %s",
					member, object.ErrConflict, label, object.FormatFingerprint(found.KCV), object.FormatFingerprint(a[pkcs11.CKA_CHECK_VALUE]))
			}
			continue
		}
		found = Found{Handle: h, KCV: a[pkcs11.CKA_CHECK_VALUE], Trusted: a.Boolean(pkcs11.CKA_TRUSTED)}
	}
	if found.Handle == 0 {
		return Found{}, fmt.Errorf("member %s: %w %q (AES-256, private, wrap+unwrap)", member, ErrNotFound, label)
	}
	return found, nil
}

// Install gives every member the same new domain key for the
// group: one random AES-256 value, made in memory, installed on each
// member, its key check value verified equal on all of them and against
// the value, and then zeroed. With an SO PIN on a member the key is
// trusted (the SO creates a public CKA_TRUSTED key, the user copies it to
// a private object and the public original is destroyed; the user is
// logged out and in again around the SO step); without, the user creates
// an untrusted private key. Either way the key carries a
// CKA_UNWRAP_TEMPLATE forcing CKA_SENSITIVE, so no blob can be unwrapped
// into a readable key, and the protection of domainRules and
// CKA_ALLOWED_MECHANISMS, read back from every member: a token that does
// not keep one of them fails the install (ErrWeak, naming the
// member and the attributes) and nothing stays installed.
//
// It does nothing if every member already holds a sound domain key with
// one check value; it refuses (naming the member) if they differ
// (ErrConflict), if only some members hold one (ErrPartial), or if
// one is weak (ErrWeak: replace it with Replace). Before
// making anything it refuses members that cannot wrap and unwrap with
// CKM_AES_KEY_WRAP_PAD, the one use of a domain key (a *MechanismError
// per member, wrapping ErrMechanismUnavailable). A member whose module
// cannot carry the nested unwrap template fails with ErrNestedTemplates,
// naming it. If installing fails on a member, the keys already installed
// on the others are removed again, so that a retry starts clean; the
// error names the member.
func Install(ctx context.Context, members []Target, groupSerial string) error {
	members, err := keepingWrapOnly(ctx, members, groupSerial)
	if err != nil {
		return fmt.Errorf("install domain key: %w", err)
	}
	var have, lack []string
	var weak []error
	var firstKCV []byte
	firstMember := ""
	for _, m := range members {
		d, err := Audit(ctx, m.Slot, groupSerial)
		if err != nil {
			return fmt.Errorf("install domain key: %w", err)
		}
		if !d.Found {
			lack = append(lack, m.Slot.Name())
			continue
		}
		have = append(have, m.Slot.Name())
		if err := d.weakError(); err != nil {
			weak = append(weak, err)
		}
		if firstMember == "" {
			firstMember, firstKCV = m.Slot.Name(), d.CheckValue
		} else if !bytes.Equal(d.CheckValue, firstKCV) {
			return fmt.Errorf("install domain key: %w: member %s holds domain key %q with check value %s, member %s one with %s",
				object.ErrConflict, m.Slot.Name(), Label(groupSerial), object.FormatFingerprint(d.CheckValue), firstMember, object.FormatFingerprint(firstKCV))
		}
	}
	if len(weak) > 0 {
		return fmt.Errorf("install domain key: %w", errors.Join(weak...))
	}
	if len(lack) == 0 {
		return nil
	}
	if len(have) > 0 {
		return fmt.Errorf("install domain key: %w: members %s hold %q (check value %s) but %s do not",
			ErrPartial, strings.Join(have, ", "), Label(groupSerial), object.FormatFingerprint(firstKCV), strings.Join(lack, ", "))
	}
	if err := installAll(ctx, members, groupSerial); err != nil {
		return fmt.Errorf("install domain key: %w", err)
	}
	return nil
}

// Replace destroys the group's domain key on every member, sound,
// weak or partial, and installs a new one as Install does. Nothing
// is wrapped again: keys travel wrapped only while they are replicated,
// never at rest. The members are checked (slots, PINs, the wrapping
// mechanism) before anything is destroyed; an install that fails then
// leaves no domain key on any member, and the error says so (replicating
// private and secret keys waits until a domain key is installed).
func Replace(ctx context.Context, members []Target, groupSerial string) error {
	members, err := keepingWrapOnly(ctx, members, groupSerial)
	if err != nil {
		return fmt.Errorf("replace domain key: %w", err)
	}
	for _, m := range members {
		if err := Remove(ctx, m.Slot, groupSerial); err != nil {
			return fmt.Errorf("replace domain key: %w", err)
		}
	}
	if err := installAll(ctx, members, groupSerial); err != nil {
		return fmt.Errorf("replace domain key: the old key is destroyed on every member and the new one is not installed on any: %w", err)
	}
	return nil
}

// keepingWrapOnly refuses an installation that cannot start (checkTargets)
// or members that cannot use a domain key (checkWrapMechanism), and
// returns the members whose token keeps a wrap-only key (WrapOnlyFlaws):
// the others take no domain key, since they could not keep it one (keys
// reach them under keys agreed for each copy). When no member keeps one,
// the error names each member and what its token does not keep.
func keepingWrapOnly(ctx context.Context, members []Target, groupSerial string) ([]Target, error) {
	if err := checkTargets(members, groupSerial); err != nil {
		return nil, err
	}
	if err := checkWrapMechanism(ctx, members); err != nil {
		return nil, err
	}
	var keep []Target
	var not []error
	for _, m := range members {
		flaws, err := WrapOnlyFlaws(ctx, m.Slot)
		if err != nil {
			return nil, err
		}
		if len(flaws) > 0 {
			not = append(not, &NoWrapOnlyKeyError{Member: m.Slot.Name(), Flaws: flaws})
			continue
		}
		keep = append(keep, m)
	}
	if len(keep) == 0 {
		return nil, errors.Join(not...)
	}
	return keep, nil
}

// checkTargets refuses an installation that cannot start.
func checkTargets(members []Target, groupSerial string) error {
	if len(members) == 0 {
		return errors.New("no members")
	}
	if groupSerial == "" {
		return errors.New("empty group serial")
	}
	for _, m := range members {
		if m.Slot == nil {
			return errors.New("a member without a slot")
		}
		if !m.SOPIN.Empty() && m.UserPIN.Empty() {
			return fmt.Errorf("member %s: a trusted install needs the user PIN to log the user in again after the SO step", m.Slot.Name())
		}
	}
	return nil
}

// checkWrapMechanism refuses, before anything is made, members that
// cannot use a domain key: it serves CKM_AES_KEY_WRAP_PAD alone. A make
// that carries keys by pair only takes none (keepingWrapOnly says so).
func checkWrapMechanism(ctx context.Context, members []Target) error {
	var unable []error
	for _, m := range members {
		if PairOnly(m.Slot) != nil {
			continue
		}
		info, err := m.Slot.MechanismInfo(ctx, Mechanism)
		if err != nil && slot.ClassOf(err) != slot.ClassRequest {
			return fmt.Errorf("member %s: ask for %s: %w", m.Slot.Name(), MechanismName(Mechanism), err)
		}
		if merr := CheckMechanism(m.Slot.Name(), info, err, pkcs11.CKF_WRAP|pkcs11.CKF_UNWRAP); merr != nil {
			unable = append(unable, merr)
		}
	}
	return errors.Join(unable...)
}

// installAll makes one new value and installs it on every member, none
// of which holds a domain key; on a failure the members done so far, and
// the one that failed, are cleared again.
func installAll(ctx context.Context, members []Target, groupSerial string) error {
	value := make([]byte, 32)
	defer clear(value)
	if _, err := rand.Read(value); err != nil {
		return fmt.Errorf("random value: %w", err)
	}
	want, err := aesKCV(value)
	if err != nil {
		return err
	}
	for i, m := range members {
		err := installOne(ctx, m, groupSerial, value)
		if err == nil {
			err = verifyInstalled(ctx, m.Slot, groupSerial, want)
		}
		if err != nil {
			// Undo on this member too: it may hold part of the install.
			undo := object.CleanupContext(ctx)
			for _, done := range members[:i+1] {
				if rerr := Remove(undo.Ctx, done.Slot, groupSerial); rerr != nil {
					err = errors.Join(err, fmt.Errorf("and removing it again failed: %w", rerr))
				}
			}
			undo.Cancel()
			return err
		}
	}
	return nil
}

// verifyInstalled reads the new domain key back from s: its check value
// must be want and its protection whole.
func verifyInstalled(ctx context.Context, s *slot.Slot, groupSerial string, want []byte) error {
	d, err := Audit(ctx, s, groupSerial)
	switch {
	case err != nil:
		return err
	case !d.Found:
		return fmt.Errorf("member %s: %w %q after installing it", s.Name(), ErrNotFound, d.Label)
	case !bytes.Equal(d.CheckValue, want):
		return fmt.Errorf("member %s: domain key check value %s, want %s", s.Name(), object.FormatFingerprint(d.CheckValue), object.FormatFingerprint(want))
	case d.Weak():
		return fmt.Errorf("member %s: %w: the token did not keep the protection asked for the new key %q (%s), so it is not installed",
			s.Name(), ErrWeak, d.Label, strings.Join(d.Flaws, ", "))
	}
	return nil
}

// aesKCV is the check value of an AES key: the first 3 bytes of the ECB
// encryption of a zero block.
func aesKCV(value []byte) ([]byte, error) {
	b, err := aes.NewCipher(value)
	if err != nil {
		return nil, err
	}
	out := make([]byte, aes.BlockSize)
	b.Encrypt(out, out)
	return out[:3], nil
}

func installOne(ctx context.Context, m Target, groupSerial string, value []byte) error {
	s := m.Slot
	name := s.Name()
	label := Label(groupSerial)
	if !s.LoggedIn() {
		return fmt.Errorf("member %s: install domain key: the user is not logged in", name)
	}
	// A public original left by an interrupted trusted install.
	if err := removePublicOriginals(ctx, s, label); err != nil {
		return fmt.Errorf("member %s: %w", name, err)
	}
	if m.SOPIN.Empty() {
		if err := createNested(ctx, s, Template(label, value, true, false), UnwrapTemplate(false)); err != nil {
			return fmt.Errorf("member %s: create domain key: %w", name, err)
		}
		return nil
	}
	if err := trustedCreate(ctx, m, label, value); err != nil {
		return fmt.Errorf("member %s: %w", name, err)
	}
	// Handles of public objects survive the logins; look it up anyway.
	pubs, err := publicOriginals(ctx, s, label)
	if err != nil {
		return fmt.Errorf("member %s: %w", name, err)
	}
	if len(pubs) != 1 {
		return fmt.Errorf("member %s: after the SO step %d public domain keys %q, want 1", name, len(pubs), label)
	}
	_, cerr := s.CopyObject(ctx, pubs[0], privateCopyTemplate())
	if err := removePublicOriginals(ctx, s, label); err != nil {
		cerr = errors.Join(cerr, err)
	}
	if cerr != nil {
		return fmt.Errorf("member %s: copy trusted domain key to a private object: %w", name, cerr)
	}
	dk, err := Lookup(ctx, s, name, groupSerial)
	if err != nil {
		return err
	}
	if !dk.Trusted {
		return fmt.Errorf("member %s: the private copy of the domain key lost CKA_TRUSTED", name)
	}
	return nil
}

// trustedCreate logs the user out and the SO in, creates the public
// trusted key, and logs the user in again whatever happened.
func trustedCreate(ctx context.Context, m Target, label string, value []byte) (err error) {
	s := m.Slot
	if err := s.Logout(ctx); err != nil {
		return fmt.Errorf("log the user out for the SO step: %w", err)
	}
	defer func() {
		// After C_Logout SoftHSM has dropped every private handle; callers
		// look them up again.
		rctx := object.CleanupContext(ctx)
		defer rctx.Cancel()
		_ = s.Logout(rctx.Ctx) // the SO, if logged in; an error here is not ours to report
		if lerr := s.Login(rctx.Ctx, pkcs11.CKU_USER, m.UserPIN); lerr != nil {
			err = errors.Join(err, fmt.Errorf("log the user in again after the SO step: %w", lerr))
		}
	}()
	if err := s.Login(ctx, pkcs11.CKU_SO, m.SOPIN); err != nil {
		return fmt.Errorf("SO login: %w", err)
	}
	if err := createNested(ctx, s, Template(label, value, false, true), UnwrapTemplate(true)); err != nil {
		return fmt.Errorf("create trusted domain key as SO: %w", err)
	}
	return nil
}

// createNested creates the domain key with its CKA_UNWRAP_TEMPLATE. A
// health-class failure while the token still answers is the module's
// transport refusing the nested template (ErrNestedTemplates).
func createNested(ctx context.Context, s *slot.Slot, tmpl, unwrap []*pkcs11.Attribute) error {
	_, err := s.CreateObjectNested(ctx, tmpl, map[uint][]*pkcs11.Attribute{pkcs11.CKA_UNWRAP_TEMPLATE: unwrap})
	switch {
	case err == nil:
		return nil
	case slot.ClassOf(err) == slot.ClassRequest:
		return fmt.Errorf("the token refused the domain key's template with its nested CKA_UNWRAP_TEMPLATE: %w", err)
	case slot.ClassOf(err) != slot.ClassHealth:
		return err
	}
	if _, perr := s.TokenInfo(ctx); perr != nil {
		return err // the member itself is failing
	}
	return fmt.Errorf("%w: it refused the domain key with its nested CKA_UNWRAP_TEMPLATE (%w) but answers other calls, as p11-kit 0.24's RPC does: install the domain key through a module that reaches the token directly",
		ErrNestedTemplates, err)
}

func publicOriginals(ctx context.Context, s *slot.Slot, label string) ([]pkcs11.ObjectHandle, error) {
	hs, err := s.FindObjects(ctx, []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, label),
		object.BoolAttr(pkcs11.CKA_PRIVATE, false),
	})
	if err != nil {
		return nil, fmt.Errorf("find public domain keys %q: %w", label, err)
	}
	return hs, nil
}

func removePublicOriginals(ctx context.Context, s *slot.Slot, label string) error {
	hs, err := publicOriginals(ctx, s, label)
	if err != nil {
		return err
	}
	for _, h := range hs {
		if err := s.DestroyObject(ctx, h); err != nil && !object.IsGone(err) {
			return fmt.Errorf("destroy public domain key %q: %w", label, err)
		}
	}
	return nil
}

// Remove destroys the group's domain key (and any public original
// left by an interrupted trusted install) on s. Not finding one is
// success. Keys already replicated stay; only further replication needs a
// domain key again.
func Remove(ctx context.Context, s *slot.Slot, groupSerial string) error {
	label := Label(groupSerial)
	hs, err := s.FindObjects(ctx, []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, label),
	})
	if err != nil {
		return fmt.Errorf("member %s: find domain key %q: %w", s.Name(), label, err)
	}
	for _, h := range hs {
		if err := s.DestroyObject(ctx, h); err != nil && !object.IsGone(err) {
			return fmt.Errorf("member %s: destroy domain key %q: %w", s.Name(), label, err)
		}
	}
	return nil
}

// Mechanism is the mechanism private and secret keys travel under.
const Mechanism = pkcs11.CKM_AES_KEY_WRAP_PAD

// ErrMechanismUnavailable is wrapped by errors saying that a member cannot
// do what replication asks of it: wrap or unwrap with
// CKM_AES_KEY_WRAP_PAD. It says what the member is, not how it is: such a
// member can hold no replica of a private or secret key, and nothing is
// wrong with its health (p11-kit 0.24's client, for one, does not carry
// the mechanism). slot.ClassOf puts these errors in ClassRequest. Use
// errors.As with *MechanismError for the member and the mechanism.
var ErrMechanismUnavailable = errors.New("mechanism unavailable")

// MechanismError says that Member cannot Use Mechanism.
type MechanismError struct {
	Member    string
	Mechanism uint   // CKM_ value
	Use       string // "wrap", "unwrap" or "wrap and unwrap"
	// Err is the module's answer (CKR_MECHANISM_INVALID…); nil when the
	// module offers the mechanism but not for this use.
	Err error
}

func (e *MechanismError) Error() string {
	why := "the module does not offer it"
	if e.Err == nil {
		why = "the module offers it, but not to " + e.Use
	} else if slot.CodeOf(e.Err) != pkcs11.CKR_MECHANISM_INVALID {
		why = e.Err.Error()
	}
	return fmt.Sprintf("member %s: %v: it cannot %s with %s (%s), so it can neither give nor take replicas of private and secret keys",
		e.Member, ErrMechanismUnavailable, e.Use, MechanismName(e.Mechanism), why)
}

// Unwrap makes errors.Is(err, ErrMechanismUnavailable) true and keeps the
// module's answer (or CKR_MECHANISM_INVALID) in the chain for slot.ClassOf
// and slot.CodeOf.
func (e *MechanismError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrMechanismUnavailable, e.Err}
	}
	return []error{ErrMechanismUnavailable, pkcs11.Error(pkcs11.CKR_MECHANISM_INVALID)}
}

// MechanismName names m for messages.
func MechanismName(m uint) string {
	switch m {
	case pkcs11.CKM_AES_KEY_WRAP_PAD:
		return "CKM_AES_KEY_WRAP_PAD"
	case pkcs11.CKM_AES_KEY_WRAP:
		return "CKM_AES_KEY_WRAP"
	}
	return fmt.Sprintf("mechanism 0x%x", m)
}

// CheckMechanism returns nil when info (asked of member, with err) has
// every flag for Mechanism, and a *MechanismError when it does not.
func CheckMechanism(member string, info pkcs11.MechanismInfo, err error, flag uint) error {
	if err == nil && info.Flags&flag == flag {
		return nil
	}
	use := map[uint]string{pkcs11.CKF_WRAP: "wrap", pkcs11.CKF_UNWRAP: "unwrap"}[flag]
	if use == "" {
		use = "wrap and unwrap"
	}
	return &MechanismError{Member: member, Mechanism: Mechanism, Use: use, Err: err}
}
