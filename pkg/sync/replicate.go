package sync

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"github.com/hagroup/hagroup/internal/tokenquirk"
	"math/big"
	"sync"
	"weak"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// Target is where Replicate puts an object.
type Target struct {
	Slot *slot.Slot
	// Session, when non-nil, is a physical session of Slot that receives
	// the object; needed for session objects (CKA_TOKEN=false), which live
	// only as long as the session that made them.
	Session *slot.Session
	// Absent is the caller's promise that Slot holds no object with the
	// source's identity (it listed the member after the identity last
	// changed there, and nothing else writes to the member meanwhile).
	// Replicate then skips its look-up for an existing copy: a
	// FindObjects, which SoftHSM answers by visiting every object on the
	// token (docs/BENCHMARKS.md, "SoftHSM costs the code is shaped by"),
	// so that the cost of a copy no longer grows with the token. A broken promise
	// leaves the member with a second object under the identity: the same
	// material (which MakePlan counts once), or a conflict it reports.
	Absent bool
}

func (t Target) store() object.Store {
	if t.Session != nil {
		return t.Session
	}
	return t.Slot
}

// Replicator copies single objects between members of one group. Its
// methods are safe for concurrent use. It remembers, per member slot and
// login epoch (slot.Slot.Epoch), the handle of the domain key and what the
// member says of the wrapping mechanism, so that a Replicate searches the
// tokens at most once (for an existing copy; not at all with
// Target.Absent). Copies into one member slot of a token that needs it
// (tokenquirk.SerialCreations: SoftHSM) are made one at a time, whatever
// the calls they come from. A Replicator must not be copied after first
// use.
type Replicator struct {
	// GroupSerial selects the domain key: domainkey.Label(GroupSerial).
	GroupSerial string
	// OnWeakDomainKey, when set, is told of a member whose domain key the
	// audit found weak, once per member and set of flaws. Nothing is
	// replicated to or from that member meanwhile (the copies fail with
	// the same *domainkey.WeakError). It is called on the replicating
	// goroutine and must not block.
	OnWeakDomainKey func(*domainkey.WeakError)
	// Facts, when set, keeps beyond this process that a token refused the
	// trial copies of a domain key (see trialKey).
	Facts Facts
	// PairWay, when set, says how keys travel between two members; a
	// key crosses between two makes by the way their pair proved, under
	// a key agreed for the copy (agree.go). Unset, every key travels
	// under the domain key.
	PairWay PairWay

	mu      sync.Mutex
	members map[weak.Pointer[slot.Slot]]*memberState
	refused map[string]bool // trialKey: domain keys whose trial copies the token refused
}

var kwp = pkcs11.NewMechanism(domainkey.Mechanism, nil)

// Replicate makes the object srcH of src exist on dst and returns its
// handle there.
//
// Private and secret keys travel only wrapped. To a member of another
// make (Replicator.PairWay) by the way the pair proved, under a key agreed
// for the copy (agree.go). Otherwise CKM_AES_KEY_WRAP_PAD under
// the group's domain key on src, unwrapped under the domain key on dst
// (the only SoftHSM mechanism that wraps private keys; its integrity
// check rejects a blob made under a different key, which SoftHSM reports
// as CKR_GENERAL_ERROR). A member that does not offer the mechanism (to
// wrap on src, to unwrap on dst) gets an error wrapping
// domainkey.ErrMechanismUnavailable before anything is read or made.
// SoftHSM 2.6.1 cannot wrap EdDSA private keys (CKR_KEY_NOT_WRAPPABLE), so those cannot
// be replicated there. The unwrap template carries every attribute of the
// source that a token accepts on unwrap: class, key type, CKA_ID,
// CKA_LABEL, CKA_TOKEN, CKA_PRIVATE, CKA_SENSITIVE, CKA_EXTRACTABLE, usage
// flags, CKA_WRAP_WITH_TRUSTED, CKA_ALLOWED_MECHANISMS, dates, subject,
// CKA_PUBLIC_KEY_INFO; then the domain key's unwrap template overrides
// them (SoftHSM insists its attributes be in the call with its values),
// so a copy can be stricter than its source: always CKA_SENSITIVE, and
// after a trusted install (the domain key carries CKA_TRUSTED)
// CKA_WRAP_WITH_TRUSTED. A key that must keep CKA_SENSITIVE=false or
// CKA_WRAP_WITH_TRUSTED=false travels under a transit key instead
// (transit.go). That template is the one domainkey.Install
// writes, known from the flat CKA_TRUSTED; the audit of the domain key
// reads it once per login epoch (see domainkey.WeakError), not every copy. Key material (modulus, EC params, value length) comes
// from the blob: SoftHSM refuses it in an unwrap template. Not copied:
// CKA_TRUSTED (only the SO may set it), CKA_WRAP_TEMPLATE and the other
// nested templates. Public keys, certificates and data objects are
// created from their attributes.
//
// The copy is then checked on dst: its identity, and for keys the copy
// wrapped again under dst's domain key, which must give the very blob
// that arrived (AES key wrap is deterministic, so equal blobs mean equal
// key material); public objects by fingerprint. Where the blobs differ
// for a private key (another token's encoding), fingerprints decide, and
// the copy signs a random challenge that must verify under the source's
// public key. SoftHSM gives an unwrapped secret key no CKA_CHECK_VALUE;
// once the material is proven equal the source's check value is set on
// the copy (SoftHSM checks it against the key and refuses a wrong one;
// it also refuses the right one for generic secret keys, which then stay
// without a stored check value on dst). A source whose stored check value
// the copy's token refuses carries a wrong one (SoftHSM 2.6.1 stores the
// SHA-1 check value of generic secrets on ECDH-derived AES and DES3 keys):
// the copy's computed check value is then set on the copy and on the
// source, so that every member shows the same fingerprint.
//
// Unless dst.Absent, an existing object with the identity on dst is
// looked for first: with the same key material its handle is returned
// and nothing is made; with different material the error is a
// *ConflictError naming both fingerprints. On any failure nothing made by
// this call stays on dst; the error names the member and the object.
// Session objects need dst.Session.
//
// Cost with SoftHSM, every handle and answer remembered (see
// Replicator): a public key 3 reads on src, one create and 2 reads on
// dst; a key 3 reads and a wrap on src, an unwrap, a read and a wrap on
// dst (plus setting the check value of a secret key); and, unless
// dst.Absent, one FindObjects on dst. No search on src.
func (r *Replicator) Replicate(ctx context.Context, src *slot.Slot, srcH pkcs11.ObjectHandle, dst Target) (pkcs11.ObjectHandle, error) {
	hs, errs := r.ReplicateEach(ctx, src, srcH, []Target{dst})
	return hs[0], errs[0]
}

// ReplicateEach does what Replicate does, for every target at once: the
// source is read and (a key) wrapped once for them all, since every
// member's domain key holds the same value. Targets on different slots
// are worked on in parallel, targets on one slot one after the other.
// It returns, in the order of dsts, each target's handle and error (nil
// when the copy is there).
func (r *Replicator) ReplicateEach(ctx context.Context, src *slot.Slot, srcH pkcs11.ObjectHandle, dsts []Target) ([]pkcs11.ObjectHandle, []error) {
	hs := make([]pkcs11.ObjectHandle, len(dsts))
	errs := make([]error, len(dsts))
	sh := r.Share(src, []pkcs11.ObjectHandle{srcH})
	defer sh.Close(ctx)
	bySlot := map[*slot.Slot][]int{}
	var order []*slot.Slot
	for i, dst := range dsts {
		if dst.Slot == nil {
			errs[i] = errors.New("replicate: no target slot")
			continue
		}
		if bySlot[dst.Slot] == nil {
			order = append(order, dst.Slot)
		}
		bySlot[dst.Slot] = append(bySlot[dst.Slot], i)
	}
	one := func(i int) { hs[i], errs[i] = sh.Copy(ctx, 0, dsts[i]) }
	if len(order) == 1 {
		for _, i := range bySlot[order[0]] {
			one(i)
		}
		return hs, errs
	}
	var wg sync.WaitGroup
	for _, s := range order {
		wg.Go(func() {
			for _, i := range bySlot[s] {
				one(i)
			}
		})
	}
	wg.Wait()
	return hs, errs
}

func (r *Replicator) replicateTo(ctx context.Context, sc *source, dst Target) (pkcs11.ObjectHandle, error) {
	j := &replication{r: r, src: sc, dst: dst, ds: dst.store(), dname: dst.Slot.Name()}
	defer j.close()
	var h pkcs11.ObjectHandle
	done, err := r.takeTurn(ctx, dst.Slot)
	if err == nil {
		h, err = j.run(ctx)
		done()
	}
	if err != nil {
		var ce *object.ConflictError
		if errors.As(err, &ce) {
			return 0, err
		}
		return 0, fmt.Errorf("replicate %s from %s to member %s: %w", sc.id, sc.name(), j.dname, err)
	}
	return h, nil
}

// replication is the copy to one target.
type replication struct {
	r     *Replicator
	src   *source
	dst   Target
	ds    object.Store
	dname string

	dkFailed bool // an unwrap under the domain keys failed: forget them
	// cross: the target is of another make than the source, and a key
	// goes there by way, under an agreed key (agree.go).
	cross bool
	way   Way
}

func (j *replication) close() {
	if j.dkFailed {
		j.r.forgetDomainKey(j.src.slot)
		j.r.forgetDomainKey(j.dst.Slot)
	}
}

func (j *replication) run(ctx context.Context) (pkcs11.ObjectHandle, error) {
	if !j.src.tok && j.dst.Session == nil {
		return 0, errors.New("it is a session object and the target has no session")
	}
	if j.src.wrapped() && j.r.PairWay != nil {
		var err error
		if j.way, j.cross, err = j.r.PairWay(ctx, j.src.slot, j.dst.Slot, KindOf(j.src.id)); err != nil {
			return 0, err
		}
	}
	if j.src.wrapped() && !j.cross {
		if err := j.r.needMechanism(ctx, j.src.slot, pkcs11.CKF_WRAP); err != nil {
			return 0, err
		}
		if err := j.r.needMechanism(ctx, j.dst.Slot, pkcs11.CKF_UNWRAP); err != nil {
			return 0, err
		}
	}
	if !j.dst.Absent {
		// Idempotence: the identity may be there already.
		if h, err := j.existing(ctx); err != nil || h != 0 {
			return h, err
		}
	}
	h, err := j.create(ctx)
	if err != nil {
		if ambiguous(err) {
			// The call may have made the object although it reported a
			// failure (a timeout): remove whatever now carries the identity,
			// which was absent a moment ago.
			err = errors.Join(err, removeIdentity(ctx, j.ds, j.src.id))
		}
		return 0, err
	}
	if err := j.verify(ctx, h); err != nil {
		c := object.CleanupContext(ctx)
		defer c.Cancel()
		if derr := j.ds.DestroyObject(c.Ctx, h); derr != nil && !object.IsGone(derr) {
			err = errors.Join(err, fmt.Errorf("and the copy (handle %d) could not be removed: %w", h, derr))
		}
		return 0, err
	}
	return h, nil
}

// existing returns the handle of a copy of the source already on dst, 0
// when there is none, or an error (a *ConflictError when dst holds other
// material under the identity).
func (j *replication) existing(ctx context.Context) (pkcs11.ObjectHandle, error) {
	hs, err := j.ds.FindObjects(ctx, j.src.id.Template())
	if err != nil {
		return 0, fmt.Errorf("look for an existing copy: %w", err)
	}
	var conflict error
	for _, h := range hs {
		if j.src.wrapped() {
			// Equal wrapped blobs settle it without a fingerprint, which
			// for a private EC key costs a search on each side.
			if v, err := j.compareWrapped(ctx, h); err == nil && v == same {
				return h, nil
			}
		}
		do, err := object.Read(ctx, j.ds, j.dname, h, nil)
		if err != nil {
			if object.IsGone(err) {
				continue
			}
			return 0, fmt.Errorf("read the existing copy: %w", err)
		}
		v, err := j.compare(ctx, do)
		if err != nil {
			return 0, fmt.Errorf("compare with the existing copy (handle %d): %w", h, err)
		}
		sf, sfErr := j.src.knownFingerprint()
		switch v {
		case same:
			return h, nil
		case different:
			conflict = &object.ConflictError{Identity: j.src.id, Member: j.dname, Want: sf, Have: do.Fingerprint}
		default:
			conflict = fmt.Errorf("member %s already holds %s (handle %d) and the two cannot be compared: %w",
				j.dname, j.src.id, h, errors.Join(sfErr, do.FpErr))
		}
	}
	return 0, conflict
}

// ambiguous reports whether a failed call may nonetheless have taken
// effect: anything but a request or login error.
func ambiguous(err error) bool {
	c := slot.ClassOf(err)
	return c != slot.ClassRequest && c != slot.ClassLogin
}

func removeIdentity(ctx context.Context, s object.Store, id object.Identity) error {
	c := object.CleanupContext(ctx)
	defer c.Cancel()
	hs, err := s.FindObjects(c.Ctx, id.Template())
	if err != nil {
		return fmt.Errorf("and looking for a half-made copy failed: %w", err)
	}
	var errs []error
	for _, h := range hs {
		if err := s.DestroyObject(c.Ctx, h); err != nil && !object.IsGone(err) {
			errs = append(errs, fmt.Errorf("and a half-made copy (handle %d) could not be removed: %w", h, err))
		}
	}
	return errors.Join(errs...)
}

func (j *replication) create(ctx context.Context) (pkcs11.ObjectHandle, error) {
	if j.src.wrapped() {
		return j.createWrapped(ctx)
	}
	types, a, err := j.src.copyAttrs(ctx)
	if err != nil {
		return 0, err
	}
	tmpl := make([]*pkcs11.Attribute, 0, len(types))
	for _, t := range types {
		if !a.Has(t) || (len(a[t]) == 0 && !object.KeepEmpty[t]) {
			continue
		}
		tmpl = append(tmpl, a.Attribute(t))
	}
	h, err := j.ds.CreateObject(ctx, withoutDefaults(tmpl))
	if err != nil {
		return 0, fmt.Errorf("create: %w", err)
	}
	return h, nil
}

func (j *replication) createWrapped(ctx context.Context) (pkcs11.ObjectHandle, error) {
	a, err := j.src.unwrapAttrs(ctx)
	if err != nil {
		return 0, err
	}
	tmpl := []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, j.src.id.Class),
		pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, j.src.id.KeyType),
	}
	for _, t := range object.UnwrapTypes[j.src.id.Class] {
		if len(a[t]) == 0 {
			continue
		}
		tmpl = append(tmpl, a.Attribute(t))
	}
	if j.cross {
		return j.createCrossed(ctx, tmpl)
	}
	blob, err := j.src.wrap(ctx)
	if err != nil {
		return 0, err
	}
	var h pkcs11.ObjectHandle
	err = j.r.withDomainKey(ctx, j.dst.Slot, func(dk pkcs11.ObjectHandle, trusted bool) error {
		var err error
		if needsTransit(a, trusted) {
			h, err = j.unwrapInTransit(ctx, dk, trusted, tmpl)
			return err
		}
		// SoftHSM wants every attribute of the domain key's unwrap
		// template in the call's template, with the same value (else
		// CKR_TEMPLATE_INCONSISTENT); the copy follows it where the
		// source differs.
		h, err = j.ds.UnwrapKey(ctx, kwp, dk, blob, object.Override(tmpl, domainkey.UnwrapTemplate(trusted)))
		return err
	})
	if err != nil {
		switch t := j.dst.Slot.Token(); slot.CodeOf(err) {
		case pkcs11.CKR_GENERAL_ERROR:
			if !tokenquirk.GeneralErrorMeansOtherKey(t.Manufacturer, t.Model) {
				break
			}
			j.dkFailed = true
			return 0, fmt.Errorf("unwrap under the domain key: %w (SoftHSM's answer when the domain keys of %s and %s differ)", err, j.src.name(), j.dname)
		case pkcs11.CKR_WRAPPED_KEY_INVALID:
			j.dkFailed = true
			return 0, fmt.Errorf("unwrap under the domain key: %w (the domain keys of %s and %s differ, or the two wrap differently)", err, j.src.name(), j.dname)
		case pkcs11.CKR_MECHANISM_INVALID:
			return 0, &domainkey.MechanismError{Member: j.dname, Mechanism: domainkey.Mechanism, Use: "unwrap", Err: err}
		}
		return 0, fmt.Errorf("unwrap under the domain key: %w", err)
	}
	return h, nil
}

// verify checks that the new copy h is the source. A key is proven by its
// wrapped blob, which needs neither fingerprint; the rest, and keys whose
// blobs differ, by fingerprint (see compare).
func (j *replication) verify(ctx context.Context, h pkcs11.ObjectHandle) error {
	if j.src.wrapped() {
		a, err := object.ReadAttrs(ctx, j.ds, h, object.IdentTypes)
		if err != nil {
			return fmt.Errorf("read the copy: %w", err)
		}
		id, err := object.IdentityOf(a)
		if err != nil {
			return fmt.Errorf("read the copy: %w", err)
		}
		if !id.Equal(j.src.id) {
			return fmt.Errorf("the copy came out as %s", id)
		}
		v, err := j.compareWrapped(ctx, h)
		if err != nil {
			return fmt.Errorf("check the copy: %w", err)
		}
		if v == same {
			j.settleCheckValue(ctx, h)
			return nil
		}
	}
	do, err := object.Read(ctx, j.ds, j.dname, h, nil)
	if err != nil {
		return fmt.Errorf("read the copy: %w", err)
	}
	if !do.Identity.Equal(j.src.id) {
		return fmt.Errorf("the copy came out as %s", do.Identity)
	}
	v, err := j.compare(ctx, do)
	if err != nil {
		return fmt.Errorf("check the copy: %w", err)
	}
	sf, sfErr := j.src.knownFingerprint()
	switch v {
	case different:
		return fmt.Errorf("the copy differs from the source: fingerprint %s, the source %s",
			object.FormatFingerprint(do.Fingerprint), object.FormatFingerprint(sf))
	case unknown:
		return fmt.Errorf("the copy cannot be checked against the source: %w", errors.Join(sfErr, do.FpErr))
	}
	j.settleCheckValue(ctx, h)
	return nil
}

// settleCheckValue gives a secret key's copy h, proven to hold the
// source's material, the source's CKA_CHECK_VALUE, which C_UnwrapKey
// leaves out (SoftHSM), so that it has a fingerprint on dst without
// encrypting. SoftHSM checks a check value set on an AES or DES3 key
// against the key and refuses a wrong one with
// CKR_ATTRIBUTE_VALUE_INVALID: the source's stored value is then wrong,
// and the right one, computed by the copy, is set on the copy and on the
// source. Nothing here is an error: the copy is proven, and a key without
// a stored check value has its fingerprint computed when listed.
func (j *replication) settleCheckValue(ctx context.Context, h pkcs11.ObjectHandle) {
	if j.src.id.Class != pkcs11.CKO_SECRET_KEY {
		return
	}
	kcv := j.src.checkValue()
	if len(kcv) == 0 {
		return
	}
	err := j.ds.SetAttributes(ctx, h, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_CHECK_VALUE, kcv)})
	if err == nil || slot.CodeOf(err) != pkcs11.CKR_ATTRIBUTE_VALUE_INVALID {
		return
	}
	right, err := object.ComputeKCV(ctx, j.ds, h, j.src.id.KeyType)
	if err != nil || bytes.Equal(right, kcv) {
		return
	}
	if j.ds.SetAttributes(ctx, h, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_CHECK_VALUE, right)}) != nil {
		return
	}
	j.src.correctCheckValue(ctx, right)
}

type verdict int

const (
	unknown   verdict = iota // cannot tell
	same                     // same key material / content
	different                // different
)

// compare tells whether do on dst holds what the source holds.
func (j *replication) compare(ctx context.Context, do object.Result) (verdict, error) {
	sf, _, err := j.src.fingerprint(ctx)
	if err != nil {
		return unknown, err
	}
	class := j.src.id.Class
	df := do.Fingerprint
	if sf != nil && df != nil && !bytes.Equal(sf, df) {
		if class != pkcs11.CKO_SECRET_KEY {
			return different, nil
		}
		// A secret key's fingerprint may be a stored CKA_CHECK_VALUE, and
		// a token may store a wrong one (SoftHSM on ECDH-derived keys):
		// the material decides where it can be compared.
		v, err := j.compareWrapped(ctx, do.Handle)
		if err != nil {
			return unknown, err
		}
		if v == same {
			return same, nil
		}
		return different, nil
	}
	bothKnown := sf != nil && df != nil
	if bothKnown && (class != pkcs11.CKO_PRIVATE_KEY || publicOnObject(ctx, j.ds, do)) {
		return same, nil // the fingerprints cover the material itself
	}
	if !j.src.wrapped() {
		return unknown, nil
	}
	v, err := j.compareWrapped(ctx, do.Handle)
	if err != nil || v == same {
		return v, err
	}
	if v == different && class == pkcs11.CKO_SECRET_KEY {
		return different, nil
	}
	if class == pkcs11.CKO_PRIVATE_KEY {
		// Wrapped encodings of one private key may differ between tokens;
		// a signature settles it.
		switch p, err := proveCopy(ctx, j.src, j.ds, do); {
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
	if j.cross {
		return unknown, nil // no domain key between two makes: fingerprints decide
	}
	blob, err := j.src.wrap(ctx)
	if err != nil {
		return unknown, err
	}
	var got []byte
	err = j.r.withDomainKey(ctx, j.dst.Slot, func(dk pkcs11.ObjectHandle, _ bool) error {
		var err error
		got, err = j.ds.WrapKey(ctx, kwp, dk, h)
		return err
	})
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
func publicOnObject(ctx context.Context, s object.Store, o object.Result) bool {
	_, err := object.PublicKeyEncoding(ctx, s, o.Handle, o.KeyType, o.Attrs, false)
	return err == nil
}

type proof int

const (
	proofNone   proof = iota // not possible
	proofPassed              // the copy signed for the source's public key
	proofFailed              // it signed, for another key
)

// proveCopy checks a private key copy do against the source by a
// signature that must verify under the source's public key.
func proveCopy(ctx context.Context, src *source, ds object.Store, do object.Result) (proof, error) {
	srcEnc, err := src.publicKey(ctx)
	if err != nil {
		return proofNone, nil // nothing to prove against
	}
	return proveSigning(ctx, ds, do.Handle, srcEnc)
}

// proveSigning signs a random challenge with h and verifies it against
// the public key spki, when h may sign with a mechanism Go can check.
func proveSigning(ctx context.Context, s object.Store, h pkcs11.ObjectHandle, spki []byte) (proof, error) {
	a, err := object.ReadAttrs(ctx, s, h, []uint{pkcs11.CKA_SIGN, pkcs11.CKA_ALWAYS_AUTHENTICATE, pkcs11.CKA_ALLOWED_MECHANISMS})
	if err != nil {
		return proofNone, fmt.Errorf("read the copy's usage: %w", err)
	}
	if !a.Boolean(pkcs11.CKA_SIGN) || a.Boolean(pkcs11.CKA_ALWAYS_AUTHENTICATE) {
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
		mech = slot.CKMEdDSA
		check = func(sig []byte) bool { return ed25519.Verify(k, challenge, sig) }
	default:
		return proofNone, nil
	}
	if !object.MechanismAllowed(a, mech) {
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

// Destroy destroys the object with identity id on s; with fp non-nil only
// objects with that fingerprint: another object under the same identity
// is left alone, and one whose fingerprint the member cannot compute is
// left too, with an error wrapping ErrNoFingerprint. Finding none is
// success, so it may be repeated.
func (r *Replicator) Destroy(ctx context.Context, s *slot.Slot, id object.Identity, fp []byte) error {
	hs, err := s.FindObjects(ctx, id.Template())
	if err != nil {
		return fmt.Errorf("member %s: destroy %s: find: %w", s.Name(), id, err)
	}
	var undecided []error
	for _, h := range hs {
		if fp != nil {
			o, err := object.Read(ctx, s, s.Name(), h, nil)
			if object.IsGone(err) {
				continue
			}
			if err != nil {
				return fmt.Errorf("destroy %s: %w", id, err)
			}
			if o.Fingerprint == nil {
				undecided = append(undecided, fmt.Errorf("destroy %s (handle %d): not destroyed, cannot tell it is the object with fingerprint %s: %w",
					id, h, object.FormatFingerprint(fp), o.FpErr))
				continue
			}
			if !bytes.Equal(o.Fingerprint, fp) {
				continue
			}
		}
		if err := s.DestroyObject(ctx, h); err != nil && !object.IsGone(err) {
			return fmt.Errorf("member %s: destroy %s (handle %d): %w", s.Name(), id, h, err)
		}
	}
	return errors.Join(undecided...)
}
