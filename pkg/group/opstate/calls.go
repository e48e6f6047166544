package opstate

import (
	"context"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// InitOn sends the Init of k to ps.
func InitOn(ctx context.Context, k Kind, ps *slot.Session, mech *pkcs11.Mechanism, key pkcs11.ObjectHandle) error {
	return ps.Init(ctx, k, mech, key)
}

// StepOn runs step st of k on ps, whose operation was initialised: the
// one place a step becomes its pkg/slot call. wh is the object a
// C_DigestKey names (st is Update then).
func StepOn(ctx context.Context, k Kind, st Step, ps *slot.Session, in, sig []byte, wh *pkcs11.ObjectHandle) ([]byte, error) {
	switch {
	case wh != nil:
		return nil, ps.DigestKey(ctx, *wh)
	case st == Single:
		return ps.Initialized(ctx, k, in, sig)
	case st == Update:
		return ps.Update(ctx, k, in)
	}
	return ps.Final(ctx, k, sig)
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
