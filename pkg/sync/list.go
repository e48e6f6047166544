package sync

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// ReadObject reads the identity, fingerprint and storage flags of h on s.
// An object whose fingerprint the member cannot compute comes back with a
// nil Fingerprint and no error (see ErrNoFingerprint); use Fingerprint to
// learn why.
func ReadObject(ctx context.Context, s *slot.Slot, h pkcs11.ObjectHandle) (Object, error) {
	r, err := readObject(ctx, s, s.Name(), h, nil)
	return r.Object, err
}

// List returns every object on s that the current login can see, except
// domain keys (secret keys labelled with DomainLabel's prefix).
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
func List(ctx context.Context, s *slot.Slot) ([]Object, error) {
	return list(ctx, s, s.Name())
}

func list(ctx context.Context, s store, member string) ([]Object, error) {
	hs, err := s.FindObjects(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("member %s: list objects: %w", member, err)
	}
	type pending struct {
		r   readResult
		idx int
	}
	objs := make([]Object, 0, len(hs))
	var later []pending
	pubs := map[string][][]byte{} // key type + CKA_ID -> public key encodings
	pubKey := func(kt uint, id []byte) string { return fmt.Sprintf("%x/%x", kt, id) }
	for _, h := range hs {
		r, err := readIdentity(ctx, s, member, h)
		if err != nil {
			if isGone(err) {
				continue // destroyed between FindObjects and now
			}
			return nil, err
		}
		id, a := r.Identity, r.a
		if isDomainKey(id) {
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
			enc, err = publicKeyEncoding(ctx, s, h, id.KeyType, a, true)
			if err == nil {
				fp = sum(enc)
				if len(id.ID) > 0 {
					k := pubKey(id.KeyType, id.ID)
					pubs[k] = append(pubs[k], enc)
				}
			}
		} else {
			fp, err = fingerprintOf(ctx, s, h, id, a, nil)
		}
		if err != nil {
			if isGone(err) {
				continue
			}
			if !errors.Is(err, ErrNoFingerprint) {
				return nil, fmt.Errorf("member %s: fingerprint of %s: %w", member, id, err)
			}
		}
		r.Fingerprint = fp
		objs = append(objs, r.Object)
	}
	index := func(_ context.Context, kt uint, id []byte) ([][]byte, error) { return pubs[pubKey(kt, id)], nil }
	for _, p := range later {
		fp, err := fingerprintOf(ctx, s, p.r.Handle, p.r.Identity, p.r.a, index)
		if err != nil && !errors.Is(err, ErrNoFingerprint) {
			return nil, fmt.Errorf("member %s: fingerprint of %s: %w", member, p.r.Identity, err)
		}
		objs[p.idx].Fingerprint = fp
	}
	return objs, nil
}

// isGone reports whether err says the object no longer exists.
func isGone(err error) bool {
	return err != nil && slot.CodeOf(err) == pkcs11.CKR_OBJECT_HANDLE_INVALID
}

func isDomainKey(id Identity) bool {
	return id.Class == pkcs11.CKO_SECRET_KEY && strings.HasPrefix(id.Label, domainLabelPrefix)
}
