package opstate

import (
	"context"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// InitOn sends the Init of k to ps.
func InitOn(ctx context.Context, k Kind, ps *slot.Session, mech *pkcs11.Mechanism, key pkcs11.ObjectHandle) error {
	switch k {
	case Sign:
		return ps.SignInit(ctx, mech, key)
	case Verify:
		return ps.VerifyInit(ctx, mech, key)
	case Encrypt:
		return ps.EncryptInit(ctx, mech, key)
	case Decrypt:
		return ps.DecryptInit(ctx, mech, key)
	default:
		return ps.DigestInit(ctx, mech)
	}
}

// StepOn runs step st of k on ps, whose operation was initialised: the
// one place the PKCS#11 calls of each step are named. wh is the object a
// C_DigestKey names (st is Update then).
func StepOn(ctx context.Context, k Kind, st Step, ps *slot.Session, in, sig []byte, wh *pkcs11.ObjectHandle) ([]byte, error) {
	if wh != nil {
		return nil, ps.DigestKey(ctx, *wh)
	}
	switch st {
	case Single:
		switch k {
		case Sign:
			return ps.SignInitialized(ctx, in)
		case Verify:
			return nil, ps.VerifyInitialized(ctx, in, sig)
		case Encrypt:
			return ps.EncryptInitialized(ctx, in)
		case Decrypt:
			return ps.DecryptInitialized(ctx, in)
		default:
			return ps.DigestInitialized(ctx, in)
		}
	case Update:
		switch k {
		case Sign:
			return nil, ps.SignUpdate(ctx, in)
		case Verify:
			return nil, ps.VerifyUpdate(ctx, in)
		case Encrypt:
			return ps.EncryptUpdate(ctx, in)
		case Decrypt:
			return ps.DecryptUpdate(ctx, in)
		default:
			return nil, ps.DigestUpdate(ctx, in)
		}
	default:
		switch k {
		case Sign:
			return ps.SignFinal(ctx)
		case Verify:
			return nil, ps.VerifyFinal(ctx, sig)
		case Encrypt:
			return ps.EncryptFinal(ctx)
		case Decrypt:
			return ps.DecryptFinal(ctx)
		default:
			return ps.DigestFinal(ctx)
		}
	}
}

// AbandonOn ends k on ps, where it is active, by finishing it and
// dropping the result (PKCS#11 before 3.0 has no cancel): with the Final
// once an Update was accepted, with the single-part call before (a
// mechanism without multi-part may refuse the Final).
func AbandonOn(ctx context.Context, k Kind, ps *slot.Session, started bool) {
	st := Single
	if started {
		st = Final
	}
	_, _ = StepOn(ctx, k, st, ps, nil, nil, nil) // the outcome of a dropped operation is moot
}
