package sync

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// Shared is a set of objects on one member, each copied by Copy to any
// number of targets and read and (a key) wrapped once for them all, when
// its first copy needs it: every member's domain key holds the same
// value, so one blob serves every target. Its methods are safe for
// concurrent use; Close it once every copy is done.
type Shared struct {
	r    *Replicator
	slot *slot.Slot
	objs []sharedObject
}

type sharedObject struct {
	h pkcs11.ObjectHandle

	mu  sync.Mutex // held across the identity read, so that it is made once
	sc  *source
	err error // the identity read's failure, kept: every copy gets it
}

// Share returns the objects hs of src, to be copied to targets.
func (r *Replicator) Share(src *slot.Slot, hs []pkcs11.ObjectHandle) *Shared {
	s := &Shared{r: r, slot: src, objs: make([]sharedObject, len(hs))}
	for j, h := range hs {
		s.objs[j].h = h
	}
	return s
}

// Copy does what Replicate does for the j-th object and dst, with the
// reads and the wrap the object's other copies made. The failure of its
// identity read or its wrap (transit key, agreement) is shared too: every
// target gets it, so that a source that did not answer is not asked
// again for each target in turn.
func (s *Shared) Copy(ctx context.Context, j int, dst Target) (pkcs11.ObjectHandle, error) {
	if dst.Slot == nil {
		return 0, errors.New("replicate: no target slot")
	}
	sc, err := s.source(ctx, j)
	if err != nil {
		return 0, err
	}
	return s.r.replicateTo(ctx, sc, dst)
}

// CopyAgain copies the j-th object to dst once more after a failed Copy.
// It reuses the shared reads and wrap only when they succeeded: one that
// failed would give back its failure, so the object is then read and
// wrapped afresh, for dst alone.
func (s *Shared) CopyAgain(ctx context.Context, j int, dst Target) (pkcs11.ObjectHandle, error) {
	if sc, err := s.source(ctx, j); err != nil || sc.failed() {
		return s.r.Replicate(ctx, s.slot, s.objs[j].h, dst)
	}
	return s.Copy(ctx, j, dst)
}

// Close forgets the wrapped objects and destroys what the copies made on
// the source for themselves (an agreement's key pair).
func (s *Shared) Close(ctx context.Context) {
	for j := range s.objs {
		o := &s.objs[j]
		o.mu.Lock()
		if o.sc != nil {
			o.sc.close(ctx)
		}
		o.mu.Unlock()
	}
}

// source returns the j-th object's source, its identity read on the
// first call.
func (s *Shared) source(ctx context.Context, j int) (*source, error) {
	o := &s.objs[j]
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.sc == nil && o.err == nil {
		if s.slot == nil {
			o.err = errors.New("replicate: no source slot")
			return nil, o.err
		}
		so, err := object.ReadIdent(ctx, s.slot, s.slot.Name(), o.h)
		if err != nil {
			o.err = fmt.Errorf("replicate: %w", err)
			return nil, o.err
		}
		o.sc = newSource(s.r, s.slot, so)
	}
	return o.sc, o.err
}
