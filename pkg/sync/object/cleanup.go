package object

import (
	"context"
	"time"

	"github.com/miekg/pkcs11"
)

// cleanupTimeout bounds the removal of a half-made object after a
// failure, which must run even when the caller's context has expired.
const cleanupTimeout = 15 * time.Second

// BoundedContext is a context for such a removal, and its cancel.
type BoundedContext struct {
	Ctx    context.Context
	Cancel context.CancelFunc
}

// CleanupContext bounds a removal by cleanupTimeout, whether ctx has
// expired or not.
func CleanupContext(ctx context.Context) BoundedContext {
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	return BoundedContext{c, cancel}
}

// Discard destroys a throwaway object (a transit or trial key), even
// when ctx has expired. A failure leaves a session object that goes with
// its session.
func Discard(ctx context.Context, s Store, t pkcs11.ObjectHandle) {
	c := CleanupContext(ctx)
	defer c.Cancel()
	_ = s.DestroyObject(c.Ctx, t)
}
