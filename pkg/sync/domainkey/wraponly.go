package domainkey

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"

	"github.com/hagroup/hagroup/internal/tokenquirk"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

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
