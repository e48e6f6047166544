package sync

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// source is the object a Replicate, ReplicateEach or Shared copies,
// shared by the copies to every target: read, fingerprinted and wrapped once,
// when first needed. The identity and storage flags (id) never change;
// everything else is behind mu, which is held across the module calls
// that fill it, so concurrent copies wait for one call instead of making
// their own.
type source struct {
	r    *Replicator
	slot *slot.Slot
	h    pkcs11.ObjectHandle
	id   object.Identity
	tok  bool // CKA_TOKEN

	mu      sync.Mutex
	so      object.Result // identity read; a and Fingerprint grow under mu
	fpDone  bool
	copyA   object.Attrs // public objects: the attributes a copy is created from
	unwrapA object.Attrs // keys: the attributes of the unwrap template
	blob    []byte
	blobErr error
	// inTransit: the source under a transit key (transit.go).
	inTransit  *transitBlobs
	transitErr error
	// agreed: the source's half of the agreements with targets of
	// another make (agree.go).
	agreed   *agreement
	agreeErr error
}

func newSource(r *Replicator, s *slot.Slot, so object.Result) *source {
	return &source{r: r, slot: s, h: so.Handle, id: so.Identity, tok: so.Token, so: so}
}

// close forgets the wrapped key and destroys the agreement key pair.
func (sc *source) close(ctx context.Context) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.dropAgreement(ctx)
	clear(sc.blob)
	sc.blob = nil
	sc.inTransit.clear()
	sc.inTransit = nil
}

func (sc *source) name() string { return sc.slot.Name() }

func (sc *source) wrapped() bool {
	return sc.id.Class == pkcs11.CKO_PRIVATE_KEY || sc.id.Class == pkcs11.CKO_SECRET_KEY
}

// fingerprint returns the source's fingerprint, computed when first
// needed (for a private EC key on SoftHSM it costs a search of the token
// for its public half, which a copy proven by its wrapped blob does not
// need), and the reason when the member cannot compute it (fpErr). err is
// a failure to ask.
func (sc *source) fingerprint(ctx context.Context) (fp []byte, fpErr, err error) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if !sc.fpDone {
		fp, err := object.FingerprintOf(ctx, sc.slot, sc.h, sc.id, sc.so.Attrs, nil)
		if err != nil {
			if !errors.Is(err, object.ErrNoFingerprint) {
				return nil, nil, fmt.Errorf("member %s: fingerprint of %s: %w", sc.name(), sc.id, err)
			}
			sc.so.FpErr = fmt.Errorf("member %s: fingerprint of %s: %w", sc.name(), sc.id, err)
		}
		sc.so.Fingerprint, sc.fpDone = fp, true
	}
	return sc.so.Fingerprint, sc.so.FpErr, nil
}

// knownFingerprint returns the fingerprint if it has been computed.
func (sc *source) knownFingerprint() ([]byte, error) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.so.Fingerprint, sc.so.FpErr
}

// checkValue returns the source's stored CKA_CHECK_VALUE (secret keys).
func (sc *source) checkValue() []byte {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.so.Attrs[pkcs11.CKA_CHECK_VALUE]
}

// correctCheckValue sets kcv as the source's CKA_CHECK_VALUE, if the
// token takes it.
func (sc *source) correctCheckValue(ctx context.Context, kcv []byte) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if err := sc.slot.SetAttributes(ctx, sc.h, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_CHECK_VALUE, kcv)}); err != nil {
		return
	}
	sc.so.Attrs[pkcs11.CKA_CHECK_VALUE] = kcv
	if sc.fpDone {
		sc.so.Fingerprint, sc.so.FpErr = kcv, nil
	}
}

// copyAttrs reads, once, the attributes a copy of a public object is
// created from.
func (sc *source) copyAttrs(ctx context.Context) ([]uint, object.Attrs, error) {
	types, err := object.CopyTypes(sc.id.Class, sc.id.KeyType)
	if err != nil {
		return nil, nil, err
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.copyA == nil {
		a, err := object.ReadAttrs(ctx, sc.slot, sc.h, types)
		if err != nil {
			return nil, nil, fmt.Errorf("read the source's attributes on %s: %w", sc.name(), err)
		}
		sc.copyA = a
	}
	return types, sc.copyA, nil
}

// unwrapAttrs reads, once, the source's attributes that go into the
// unwrap template (CKA_EXTRACTABLE among them).
func (sc *source) unwrapAttrs(ctx context.Context) (object.Attrs, error) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.unwrapAttrsLocked(ctx)
}

func (sc *source) unwrapAttrsLocked(ctx context.Context) (object.Attrs, error) {
	if sc.unwrapA == nil {
		a, err := object.ReadAttrs(ctx, sc.slot, sc.h, object.UnwrapTypes[sc.id.Class])
		if err != nil {
			return nil, fmt.Errorf("read the source's attributes on %s: %w", sc.name(), err)
		}
		sc.unwrapA = a
	}
	return sc.unwrapA, nil
}

// failed reports whether the source kept a failure of its wrap, its
// transit key or its half of an agreement, which every later copy would
// get again.
func (sc *source) failed() bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.blobErr != nil || sc.transitErr != nil || sc.agreeErr != nil
}

// wrap wraps the source under the domain key on its member, once: the
// domain keys of all members hold one value, so one blob serves every
// target. A failure is kept too: every target gets it.
func (sc *source) wrap(ctx context.Context) ([]byte, error) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.blob == nil && sc.blobErr == nil {
		sc.blob, sc.blobErr = sc.wrapLocked(ctx)
	}
	return sc.blob, sc.blobErr
}

func (sc *source) wrapLocked(ctx context.Context) ([]byte, error) {
	a, err := sc.unwrapAttrsLocked(ctx)
	if err != nil {
		return nil, err
	}
	if !a.Boolean(pkcs11.CKA_EXTRACTABLE) {
		return nil, fmt.Errorf("the key is not extractable (CKA_EXTRACTABLE=false on %s), so it cannot be wrapped", sc.name())
	}
	var b []byte
	err = sc.r.withDomainKey(ctx, sc.slot, func(dk pkcs11.ObjectHandle, _ bool) error {
		var err error
		b, err = sc.slot.WrapKey(ctx, kwp, dk, sc.h)
		return err
	})
	if err != nil {
		switch slot.CodeOf(err) {
		case pkcs11.CKR_KEY_NOT_WRAPPABLE:
			return nil, fmt.Errorf("wrap under the domain key on %s: %w (the token will not wrap this key: it may carry CKA_WRAP_WITH_TRUSTED while the domain key is not trusted, or be of a type the token cannot wrap, as EdDSA private keys on SoftHSM 2.6)", sc.name(), err)
		case pkcs11.CKR_MECHANISM_INVALID:
			return nil, &domainkey.MechanismError{Member: sc.name(), Mechanism: domainkey.Mechanism, Use: "wrap", Err: err}
		}
		return nil, fmt.Errorf("wrap under the domain key on %s: %w", sc.name(), err)
	}
	return b, nil
}

// publicKey returns the public-key encoding the source's fingerprint is
// computed from.
func (sc *source) publicKey(ctx context.Context) ([]byte, error) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	so := sc.so
	if enc, err := object.PublicKeyEncoding(ctx, sc.slot, so.Handle, so.KeyType, so.Attrs, false); err == nil {
		return enc, nil
	}
	if len(so.ID) == 0 {
		return nil, fmt.Errorf("%w: no public key for %s on %s", object.ErrNoFingerprint, so.Identity, sc.name())
	}
	encs, err := object.FindPublicHalves(sc.slot)(ctx, so.KeyType, so.ID)
	if err != nil {
		return nil, err
	}
	if encs = object.Distinct(encs); len(encs) != 1 {
		return nil, fmt.Errorf("%w: %d public keys for %s on %s", object.ErrNoFingerprint, len(encs), so.Identity, sc.name())
	}
	return encs[0], nil
}
