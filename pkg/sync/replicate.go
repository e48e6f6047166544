package sync

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"
	"time"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// ErrConflict is wrapped by errors saying that two members hold different
// objects under one identity (the duplicate-label hazard). It is reported,
// never resolved by guessing. Use errors.As with *ConflictError for the
// details.
var ErrConflict = errors.New("conflict")

// ConflictError says member Member holds Identity with fingerprint Have
// where the source has Want.
type ConflictError struct {
	Identity Identity
	Member   string
	Want     []byte // the source's fingerprint
	Have     []byte // the fingerprint on Member
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("member %s: %s: %v: it holds fingerprint %s, the source has %s",
		e.Member, e.Identity, ErrConflict, FormatFingerprint(e.Have), FormatFingerprint(e.Want))
}

// Unwrap makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Unwrap() error { return ErrConflict }

// Target is where Replicate puts an object.
type Target struct {
	Slot *slot.Slot
	// Session, when non-nil, is a physical session of Slot that receives
	// the object; needed for session objects (CKA_TOKEN=false), which live
	// only as long as the session that made them.
	Session *slot.Session
}

func (t Target) store() store {
	if t.Session != nil {
		return t.Session
	}
	return t.Slot
}

// Replicator copies single objects between members of one group. Its
// methods are safe for concurrent use (it holds no state but the serial).
type Replicator struct {
	// GroupSerial selects the domain key: DomainLabel(GroupSerial).
	GroupSerial string
}

// cleanupTimeout bounds the removal of a half-made object after a
// failure, which must run even when the caller's context has expired.
const cleanupTimeout = 15 * time.Second

type boundedContext struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func cleanupContext(ctx context.Context) boundedContext {
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	return boundedContext{c, cancel}
}

const ckmEDDSA = 0x1057 // PKCS#11 3.0; miekg/pkcs11 1.1.2 does not name it

var kwp = pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP_PAD, nil)

// Replicate makes the object srcH of src exist on dst and returns its
// handle there.
//
// Private and secret keys travel only wrapped: CKM_AES_KEY_WRAP_PAD under
// the group's domain key on src, unwrapped under the domain key on dst
// (the only SoftHSM mechanism that wraps private keys; its integrity
// check rejects a blob made under a different key, which SoftHSM reports
// as CKR_GENERAL_ERROR). SoftHSM 2.6.1 cannot wrap EdDSA private keys
// (CKR_KEY_NOT_WRAPPABLE), so those cannot be replicated there. The
// unwrap template carries every attribute of the source that a token
// accepts on unwrap: class, key type, CKA_ID, CKA_LABEL, CKA_TOKEN,
// CKA_PRIVATE, CKA_SENSITIVE, CKA_EXTRACTABLE, usage flags,
// CKA_WRAP_WITH_TRUSTED, CKA_ALLOWED_MECHANISMS, dates, subject,
// CKA_PUBLIC_KEY_INFO; then the attributes of the domain key's
// CKA_UNWRAP_TEMPLATE override them (SoftHSM insists they be in the
// template with its values), so a copy can be stricter than its source:
// always sensitive, and wrappable only by a trusted key after a trusted
// install (see InstallDomainKey). Key material (modulus, EC params, value length)
// comes from the blob: SoftHSM refuses it in an unwrap template. Not
// copied: CKA_TRUSTED (only the SO may set it), CKA_WRAP_TEMPLATE and the
// other nested templates. Public keys, certificates and data objects are
// created from their attributes.
//
// The copy is then checked on dst: identity, fingerprint where the token
// shows one, and for keys the copy wrapped again under dst's domain key,
// which must give the very blob that arrived (AES key wrap is
// deterministic, so equal blobs mean equal key material). Where that does
// not settle it for a private key, the copy signs a random challenge that
// must verify under the source's public key. SoftHSM gives an unwrapped
// secret key no CKA_CHECK_VALUE; once the material is proven equal the
// source's check value is set on the copy (SoftHSM checks it against the
// key and refuses a wrong one; it also refuses the right one for generic
// secret keys, which then stay without a fingerprint on dst).
//
// If dst already holds the identity with the same key material, that
// object's handle is returned and nothing is made; with different
// material the error is a *ConflictError naming both fingerprints. On any
// failure nothing made by this call stays on dst; the error names the
// member and the object. Session objects need dst.Session.
func (r *Replicator) Replicate(ctx context.Context, src *slot.Slot, srcH pkcs11.ObjectHandle, dst Target) (pkcs11.ObjectHandle, error) {
	if dst.Slot == nil {
		return 0, errors.New("replicate: no target slot")
	}
	so, err := readObject(ctx, src, src.Name(), srcH, nil)
	if err != nil {
		return 0, fmt.Errorf("replicate: %w", err)
	}
	j := &replication{r: r, src: src, so: so, dst: dst, ds: dst.store(), dname: dst.Slot.Name()}
	defer j.close()
	h, err := j.run(ctx)
	if err != nil {
		var ce *ConflictError
		if errors.As(err, &ce) {
			return 0, err
		}
		return 0, fmt.Errorf("replicate %s from %s to member %s: %w", so.Identity, src.Name(), j.dname, err)
	}
	return h, nil
}

// replication is one Replicate call's state.
type replication struct {
	r     *Replicator
	src   *slot.Slot
	so    readResult
	dst   Target
	ds    store
	dname string

	srcBlob []byte              // the source wrapped under the domain key
	dstDK   pkcs11.ObjectHandle // the domain key on dst, once found
}

func (j *replication) close() { clear(j.srcBlob) }

func (j *replication) wrapped() bool {
	return j.so.Class == pkcs11.CKO_PRIVATE_KEY || j.so.Class == pkcs11.CKO_SECRET_KEY
}

func (j *replication) run(ctx context.Context) (pkcs11.ObjectHandle, error) {
	if !j.so.Token && j.dst.Session == nil {
		return 0, errors.New("it is a session object and the target has no session")
	}
	// Idempotence: the identity may be there already.
	existing, err := j.ds.FindObjects(ctx, j.so.Identity.template())
	if err != nil {
		return 0, fmt.Errorf("look for an existing copy: %w", err)
	}
	var conflict error
	for _, h := range existing {
		do, err := readObject(ctx, j.ds, j.dname, h, nil)
		if err != nil {
			if isGone(err) {
				continue
			}
			return 0, fmt.Errorf("read the existing copy: %w", err)
		}
		v, err := j.compare(ctx, do)
		if err != nil {
			return 0, fmt.Errorf("compare with the existing copy (handle %d): %w", h, err)
		}
		switch v {
		case same:
			return h, nil
		case different:
			conflict = &ConflictError{Identity: j.so.Identity, Member: j.dname, Want: j.so.Fingerprint, Have: do.Fingerprint}
		default:
			conflict = fmt.Errorf("member %s already holds %s (handle %d) and the two cannot be compared: %w",
				j.dname, j.so.Identity, h, errors.Join(j.so.fpErr, do.fpErr))
		}
	}
	if conflict != nil {
		return 0, conflict
	}

	h, err := j.create(ctx)
	if err != nil {
		if ambiguous(err) {
			// The call may have made the object although it reported a
			// failure (a timeout): remove whatever now carries the identity,
			// which was absent a moment ago.
			err = errors.Join(err, removeIdentity(ctx, j.ds, j.so.Identity))
		}
		return 0, err
	}
	if err := j.verify(ctx, h); err != nil {
		c := cleanupContext(ctx)
		defer c.cancel()
		if derr := j.ds.DestroyObject(c.ctx, h); derr != nil && !isGone(derr) {
			err = errors.Join(err, fmt.Errorf("and the copy (handle %d) could not be removed: %w", h, derr))
		}
		return 0, err
	}
	return h, nil
}

// ambiguous reports whether a failed call may nonetheless have taken
// effect: anything but a request or login error.
func ambiguous(err error) bool {
	c := slot.ClassOf(err)
	return c != slot.ClassRequest && c != slot.ClassLogin
}

func removeIdentity(ctx context.Context, s store, id Identity) error {
	c := cleanupContext(ctx)
	defer c.cancel()
	hs, err := s.FindObjects(c.ctx, id.template())
	if err != nil {
		return fmt.Errorf("and looking for a half-made copy failed: %w", err)
	}
	var errs []error
	for _, h := range hs {
		if err := s.DestroyObject(c.ctx, h); err != nil && !isGone(err) {
			errs = append(errs, fmt.Errorf("and a half-made copy (handle %d) could not be removed: %w", h, err))
		}
	}
	return errors.Join(errs...)
}

func (j *replication) create(ctx context.Context) (pkcs11.ObjectHandle, error) {
	if j.wrapped() {
		return j.createWrapped(ctx)
	}
	types, err := copyTypes(j.so.Class)
	if err != nil {
		return 0, err
	}
	a, err := readAttrs(ctx, j.src, j.so.Handle, types)
	if err != nil {
		return 0, fmt.Errorf("read the source's attributes on %s: %w", j.src.Name(), err)
	}
	tmpl := make([]*pkcs11.Attribute, 0, len(types))
	for _, t := range types {
		if !a.has(t) || (len(a[t]) == 0 && !keepEmpty[t]) {
			continue
		}
		tmpl = append(tmpl, a.attribute(t))
	}
	h, err := j.ds.CreateObject(ctx, tmpl)
	if err != nil {
		return 0, fmt.Errorf("create: %w", err)
	}
	return h, nil
}

// blob wraps the source under the domain key on src, once.
func (j *replication) blob(ctx context.Context) ([]byte, error) {
	if j.srcBlob != nil {
		return j.srcBlob, nil
	}
	srcDK, _, err := findDomainKey(ctx, j.src, j.src.Name(), j.r.GroupSerial)
	if err != nil {
		return nil, err
	}
	a, err := readAttrs(ctx, j.src, j.so.Handle, []uint{pkcs11.CKA_EXTRACTABLE})
	if err != nil {
		return nil, fmt.Errorf("read the source's attributes on %s: %w", j.src.Name(), err)
	}
	if !a.boolean(pkcs11.CKA_EXTRACTABLE) {
		return nil, fmt.Errorf("the key is not extractable (CKA_EXTRACTABLE=false on %s), so it cannot be wrapped", j.src.Name())
	}
	b, err := j.src.WrapKey(ctx, kwp, srcDK, j.so.Handle)
	if err != nil {
		if slot.CodeOf(err) == pkcs11.CKR_KEY_NOT_WRAPPABLE {
			return nil, fmt.Errorf("wrap under the domain key on %s: %w (the token will not wrap this key: it may carry CKA_WRAP_WITH_TRUSTED while the domain key is not trusted, or be of a type the token cannot wrap, as EdDSA private keys on SoftHSM 2.6)", j.src.Name(), err)
		}
		return nil, fmt.Errorf("wrap under the domain key on %s: %w", j.src.Name(), err)
	}
	j.srcBlob = b
	return b, nil
}

func (j *replication) dstDomainKey(ctx context.Context) (pkcs11.ObjectHandle, error) {
	if j.dstDK == 0 {
		h, _, err := findDomainKey(ctx, j.dst.Slot, j.dname, j.r.GroupSerial)
		if err != nil {
			return 0, err
		}
		j.dstDK = h
	}
	return j.dstDK, nil
}

func (j *replication) createWrapped(ctx context.Context) (pkcs11.ObjectHandle, error) {
	blob, err := j.blob(ctx)
	if err != nil {
		return 0, err
	}
	dk, err := j.dstDomainKey(ctx)
	if err != nil {
		return 0, err
	}
	a, err := readAttrs(ctx, j.src, j.so.Handle, unwrapTypes[j.so.Class])
	if err != nil {
		return 0, fmt.Errorf("read the source's attributes on %s: %w", j.src.Name(), err)
	}
	tmpl := []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, j.so.Class),
		pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, j.so.KeyType),
	}
	for _, t := range unwrapTypes[j.so.Class] {
		if len(a[t]) == 0 {
			continue
		}
		tmpl = append(tmpl, a.attribute(t))
	}
	// SoftHSM wants every attribute of the domain key's unwrap template
	// in the call's template, with the same value (else
	// CKR_TEMPLATE_INCONSISTENT); the copy follows it where the source
	// differs: sensitive, and wrappable only by a trusted key.
	forced, err := j.dst.Slot.GetNestedAttribute(ctx, dk, pkcs11.CKA_UNWRAP_TEMPLATE)
	if err != nil && slot.ClassOf(err) != slot.ClassRequest {
		return 0, fmt.Errorf("read the domain key's unwrap template: %w", err)
	}
	tmpl = override(tmpl, forced)
	h, err := j.ds.UnwrapKey(ctx, kwp, dk, blob, tmpl)
	if err != nil {
		if slot.CodeOf(err) == pkcs11.CKR_GENERAL_ERROR {
			return 0, fmt.Errorf("unwrap under the domain key: %w (SoftHSM's answer when the domain keys of %s and %s differ)", err, j.src.Name(), j.dname)
		}
		return 0, fmt.Errorf("unwrap under the domain key: %w", err)
	}
	return h, nil
}

// override returns tmpl with every attribute of forced replacing or
// joining those of the same type.
func override(tmpl, forced []*pkcs11.Attribute) []*pkcs11.Attribute {
	out := make([]*pkcs11.Attribute, 0, len(tmpl)+len(forced))
	isForced := map[uint]bool{}
	for _, f := range forced {
		isForced[f.Type] = true
	}
	for _, a := range tmpl {
		if !isForced[a.Type] {
			out = append(out, a)
		}
	}
	return append(out, forced...)
}

// verify checks that the new copy h is the source.
func (j *replication) verify(ctx context.Context, h pkcs11.ObjectHandle) error {
	do, err := readObject(ctx, j.ds, j.dname, h, nil)
	if err != nil {
		return fmt.Errorf("read the copy: %w", err)
	}
	if !do.Identity.Equal(j.so.Identity) {
		return fmt.Errorf("the copy came out as %s", do.Identity)
	}
	v, err := j.compare(ctx, do)
	if err != nil {
		return fmt.Errorf("check the copy: %w", err)
	}
	switch v {
	case different:
		return fmt.Errorf("the copy differs from the source: fingerprint %s, the source %s",
			FormatFingerprint(do.Fingerprint), FormatFingerprint(j.so.Fingerprint))
	case unknown:
		return fmt.Errorf("the copy cannot be checked against the source: %w", errors.Join(j.so.fpErr, do.fpErr))
	}
	if j.so.Class == pkcs11.CKO_SECRET_KEY && j.so.a.nonEmpty(pkcs11.CKA_CHECK_VALUE) && !do.a.nonEmpty(pkcs11.CKA_CHECK_VALUE) {
		// Proven equal above; give the copy the check value the unwrap
		// left out, so that it has a fingerprint on dst without
		// encrypting. The token may refuse: not an error.
		_ = j.ds.SetAttributes(ctx, h, []*pkcs11.Attribute{j.so.a.attribute(pkcs11.CKA_CHECK_VALUE)})
	}
	return nil
}

type verdict int

const (
	unknown   verdict = iota // cannot tell
	same                     // same key material / content
	different                // different
)

// compare tells whether do on dst holds what the source holds.
func (j *replication) compare(ctx context.Context, do readResult) (verdict, error) {
	sf, df := j.so.Fingerprint, do.Fingerprint
	if sf != nil && df != nil && !bytes.Equal(sf, df) {
		return different, nil
	}
	bothKnown := sf != nil && df != nil
	if bothKnown && (j.so.Class != pkcs11.CKO_PRIVATE_KEY || publicOnObject(ctx, j.ds, do)) {
		return same, nil // the fingerprints cover the material itself
	}
	if !j.wrapped() {
		return unknown, nil
	}
	v, err := j.compareWrapped(ctx, do.Handle)
	if err != nil || v == same {
		return v, err
	}
	if v == different && j.so.Class == pkcs11.CKO_SECRET_KEY {
		return different, nil
	}
	if j.so.Class == pkcs11.CKO_PRIVATE_KEY {
		// Wrapped encodings of one private key may differ between tokens;
		// a signature settles it.
		switch p, err := proveCopy(ctx, j.src, j.so, j.ds, do); {
		case err != nil:
			return unknown, err
		case p == proofPassed:
			return same, nil
		case p == proofFailed:
			return different, nil
		}
	}
	if bothKnown {
		return same, nil
	}
	return unknown, nil
}

// compareWrapped wraps h on dst under dst's domain key and compares the
// blob with the source's: AES key wrap is deterministic.
func (j *replication) compareWrapped(ctx context.Context, h pkcs11.ObjectHandle) (verdict, error) {
	blob, err := j.blob(ctx)
	if err != nil {
		return unknown, err
	}
	dk, err := j.dstDomainKey(ctx)
	if err != nil {
		return unknown, err
	}
	got, err := j.ds.WrapKey(ctx, kwp, dk, h)
	if err != nil {
		if slot.ClassOf(err) == slot.ClassRequest {
			return unknown, nil // this copy may not be wrapped here
		}
		return unknown, fmt.Errorf("wrap the copy under the domain key: %w", err)
	}
	defer clear(got)
	if bytes.Equal(got, blob) {
		return same, nil
	}
	return different, nil
}

// publicOnObject reports whether the private key o shows its own public
// key (RSA), so that its fingerprint covers the key itself.
func publicOnObject(ctx context.Context, s store, o readResult) bool {
	_, err := publicKeyEncoding(ctx, s, o.Handle, o.KeyType, o.a, false)
	return err == nil
}

type proof int

const (
	proofNone   proof = iota // not possible
	proofPassed              // the copy signed for the source's public key
	proofFailed              // it signed, for another key
)

// proveCopy checks a private key copy do against the source so by a
// signature that must verify under the source's public key.
func proveCopy(ctx context.Context, src *slot.Slot, so readResult, ds store, do readResult) (proof, error) {
	srcEnc, err := sourcePublicKey(ctx, src, so)
	if err != nil {
		return proofNone, nil // nothing to prove against
	}
	return proveSigning(ctx, ds, do.Handle, srcEnc)
}

// sourcePublicKey returns the public-key encoding the source's
// fingerprint was computed from.
func sourcePublicKey(ctx context.Context, src *slot.Slot, so readResult) ([]byte, error) {
	if enc, err := publicKeyEncoding(ctx, src, so.Handle, so.KeyType, so.a, false); err == nil {
		return enc, nil
	}
	if len(so.ID) == 0 {
		return nil, fmt.Errorf("%w: no public key for %s on %s", ErrNoFingerprint, so.Identity, src.Name())
	}
	encs, err := findPublicHalves(src)(ctx, so.KeyType, so.ID)
	if err != nil {
		return nil, err
	}
	if encs = distinct(encs); len(encs) != 1 {
		return nil, fmt.Errorf("%w: %d public keys for %s on %s", ErrNoFingerprint, len(encs), so.Identity, src.Name())
	}
	return encs[0], nil
}

// proveSigning signs a random challenge with h and verifies it against
// the public key spki, when h may sign with a mechanism Go can check.
func proveSigning(ctx context.Context, s store, h pkcs11.ObjectHandle, spki []byte) (proof, error) {
	a, err := readAttrs(ctx, s, h, []uint{pkcs11.CKA_SIGN, pkcs11.CKA_ALWAYS_AUTHENTICATE, pkcs11.CKA_ALLOWED_MECHANISMS})
	if err != nil {
		return proofNone, fmt.Errorf("read the copy's usage: %w", err)
	}
	if !a.boolean(pkcs11.CKA_SIGN) || a.boolean(pkcs11.CKA_ALWAYS_AUTHENTICATE) {
		return proofNone, nil
	}
	pub, err := x509.ParsePKIXPublicKey(spki)
	if err != nil {
		return proofNone, nil // a key type Go cannot verify (Ed448)
	}
	challenge := make([]byte, 32)
	if _, err := rand.Read(challenge); err != nil {
		return proofNone, err
	}
	var mech uint
	var check func(sig []byte) bool
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		digest := sha256.Sum256(challenge)
		challenge = digest[:]
		mech = pkcs11.CKM_ECDSA
		check = func(sig []byte) bool {
			if len(sig) == 0 || len(sig)%2 != 0 {
				return false
			}
			n := len(sig) / 2
			return ecdsa.Verify(k, challenge, new(big.Int).SetBytes(sig[:n]), new(big.Int).SetBytes(sig[n:]))
		}
	case ed25519.PublicKey:
		mech = ckmEDDSA
		check = func(sig []byte) bool { return ed25519.Verify(k, challenge, sig) }
	default:
		return proofNone, nil
	}
	if !mechanismAllowed(a, mech) {
		return proofNone, nil
	}
	sig, err := s.Sign(ctx, pkcs11.NewMechanism(mech, nil), h, challenge)
	if err != nil {
		if slot.ClassOf(err) == slot.ClassRequest {
			return proofNone, nil // the token will not sign this way
		}
		return proofNone, fmt.Errorf("sign a challenge with the copy: %w", err)
	}
	if !check(sig) {
		return proofFailed, nil
	}
	return proofPassed, nil
}

func mechanismAllowed(a attrs, mech uint) bool {
	v := a[pkcs11.CKA_ALLOWED_MECHANISMS]
	if len(v) == 0 {
		return true
	}
	for i := 0; i+8 <= len(v); i += 8 {
		if uint(binary.NativeEndian.Uint64(v[i:])) == mech {
			return true
		}
	}
	return false
}

// Destroy destroys the object with identity id on s; with fp non-nil only
// objects with that fingerprint: another object under the same identity
// is left alone, and one whose fingerprint the member cannot compute is
// left too, with an error wrapping ErrNoFingerprint. Finding none is
// success, so it may be repeated.
func (r *Replicator) Destroy(ctx context.Context, s *slot.Slot, id Identity, fp []byte) error {
	hs, err := s.FindObjects(ctx, id.template())
	if err != nil {
		return fmt.Errorf("member %s: destroy %s: find: %w", s.Name(), id, err)
	}
	var undecided []error
	for _, h := range hs {
		if fp != nil {
			o, err := readObject(ctx, s, s.Name(), h, nil)
			if isGone(err) {
				continue
			}
			if err != nil {
				return fmt.Errorf("destroy %s: %w", id, err)
			}
			if o.Fingerprint == nil {
				undecided = append(undecided, fmt.Errorf("destroy %s (handle %d): not destroyed, cannot tell it is the object with fingerprint %s: %w",
					id, h, FormatFingerprint(fp), o.fpErr))
				continue
			}
			if !bytes.Equal(o.Fingerprint, fp) {
				continue
			}
		}
		if err := s.DestroyObject(ctx, h); err != nil && !isGone(err) {
			return fmt.Errorf("member %s: destroy %s (handle %d): %w", s.Name(), id, h, err)
		}
	}
	return errors.Join(undecided...)
}
