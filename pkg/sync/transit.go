package sync

import (
	"context"
	"fmt"

	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// A key whose source copy lacks CKA_WRAP_WITH_TRUSTED (the application
// made it extractable) must not gain it on the way: a copy that carries
// it can be wrapped under trusted keys alone, so the application could
// wrap the key only on the member it was made on, as if the key were
// unextractable everywhere else. A trusted domain key's unwrap template
// forces the flag, so such a key travels under a transit key instead: a
// fresh AES session key made on the source, carried to the target under
// the domain key, and destroyed on both sides once the copy is made.
//
// This gives nobody more than the source's copy already does. The key is
// extractable on the source (a user there may wrap it under a key of
// their own); the transit key is generated on the token, sensitive, and
// wraps only; its copy on the target unwraps only and is neither
// extractable nor readable. A key that carries CKA_WRAP_WITH_TRUSTED never
// travels this way: the transit key is not CKA_TRUSTED, and the token
// refuses to wrap such a key under it.

// A key the application made readable (CKA_SENSITIVE=false on its source
// copy) travels the same way, whatever the domain key: the domain key's
// unwrap template forces CKA_SENSITIVE, and a copy made sensitive would
// answer CKA_VALUE as the bare token does not. A readable key gives no one
// more in transit than its source copy does to a user reading it there.

// needsTransit reports whether a key with the source attributes a must
// travel under a transit key to a target whose domain key is trusted
// (trusted) or not.
func needsTransit(a object.Attrs, trusted bool) bool {
	return !a.Boolean(pkcs11.CKA_SENSITIVE) || trusted && !a.Boolean(pkcs11.CKA_WRAP_WITH_TRUSTED)
}

// transitLabel marks the transit keys, so that an operator who sees one
// (they are session objects and go with the session) knows what it is.
const transitLabel = "hagroup-transit"

var aesKeyGen = pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil)

// transitKeyTemplate is the transit key on the source: wraps, and may
// itself be wrapped (under the domain key), nothing else.
func transitKeyTemplate() []*pkcs11.Attribute {
	return []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY),
		pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
		pkcs11.NewAttribute(pkcs11.CKA_VALUE_LEN, 32),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, transitLabel),
		object.BoolAttr(pkcs11.CKA_TOKEN, false),
		object.BoolAttr(pkcs11.CKA_PRIVATE, true),
		object.BoolAttr(pkcs11.CKA_SENSITIVE, true),
		object.BoolAttr(pkcs11.CKA_EXTRACTABLE, true),
		object.BoolAttr(pkcs11.CKA_WRAP, true),
		object.BoolAttr(pkcs11.CKA_UNWRAP, false),
		object.BoolAttr(pkcs11.CKA_ENCRYPT, false),
		object.BoolAttr(pkcs11.CKA_DECRYPT, false),
		object.BoolAttr(pkcs11.CKA_SIGN, false),
		object.BoolAttr(pkcs11.CKA_VERIFY, false),
		object.BoolAttr(pkcs11.CKA_DERIVE, false),
	}
}

// transitCopyTemplate is the transit key on the target: unwraps, nothing
// else, and never leaves the token.
func transitCopyTemplate() []*pkcs11.Attribute {
	return []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY),
		pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, transitLabel),
		object.BoolAttr(pkcs11.CKA_TOKEN, false),
		object.BoolAttr(pkcs11.CKA_PRIVATE, true),
		object.BoolAttr(pkcs11.CKA_EXTRACTABLE, false),
		object.BoolAttr(pkcs11.CKA_WRAP, false),
		object.BoolAttr(pkcs11.CKA_UNWRAP, true),
		object.BoolAttr(pkcs11.CKA_ENCRYPT, false),
		object.BoolAttr(pkcs11.CKA_DECRYPT, false),
		object.BoolAttr(pkcs11.CKA_SIGN, false),
		object.BoolAttr(pkcs11.CKA_VERIFY, false),
		object.BoolAttr(pkcs11.CKA_DERIVE, false),
	}
}

// transitBlobs are the source in transit: the transit key under the
// domain key, and the source under the transit key.
type transitBlobs struct {
	key, source []byte
}

func (b *transitBlobs) clear() {
	if b != nil {
		clear(b.key)
		clear(b.source)
	}
}

// transit wraps the source under a fresh transit key, once for every
// target: the domain keys of all members hold one value. A failure is
// kept too.
func (sc *source) transit(ctx context.Context) (*transitBlobs, error) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.inTransit == nil && sc.transitErr == nil {
		sc.inTransit, sc.transitErr = sc.transitLocked(ctx)
	}
	return sc.inTransit, sc.transitErr
}

func (sc *source) transitLocked(ctx context.Context) (*transitBlobs, error) {
	t, err := sc.slot.GenerateKey(ctx, aesKeyGen, transitKeyTemplate())
	if err != nil {
		return nil, fmt.Errorf("make a transit key on %s: %w", sc.name(), err)
	}
	defer object.Discard(ctx, sc.slot, t)
	var b transitBlobs
	err = sc.r.withDomainKey(ctx, sc.slot, func(dk pkcs11.ObjectHandle, _ bool) error {
		var err error
		b.key, err = sc.slot.WrapKey(ctx, kwp, dk, t)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("wrap the transit key under the domain key on %s: %w", sc.name(), err)
	}
	if b.source, err = sc.slot.WrapKey(ctx, kwp, t, sc.h); err != nil {
		b.clear()
		return nil, fmt.Errorf("wrap under the transit key on %s: %w", sc.name(), err)
	}
	return &b, nil
}

// unwrapInTransit makes the copy on the target from the source in
// transit: the transit key unwrapped under the target's domain key dk
// (trusted or not), then the source under it with tmpl, the source's own
// attributes: its CKA_WRAP_WITH_TRUSTED=false and its CKA_SENSITIVE, so
// that the copy is exactly as protected as the source.
func (j *replication) unwrapInTransit(ctx context.Context, dk pkcs11.ObjectHandle, trusted bool, tmpl []*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	b, err := j.src.transit(ctx)
	if err != nil {
		return 0, err
	}
	t, err := j.ds.UnwrapKey(ctx, kwp, dk, b.key, object.Override(transitCopyTemplate(), domainkey.UnwrapTemplate(trusted)))
	if err != nil {
		return 0, err
	}
	defer object.Discard(ctx, j.ds, t)
	h, err := j.ds.UnwrapKey(ctx, kwp, t, b.source, tmpl)
	if err != nil {
		return 0, fmt.Errorf("unwrap under the transit key: %w", err)
	}
	return h, nil
}
