package opstate

import (
	"sync"

	"github.com/hagroup/hagroup/internal/p11raw"
	"github.com/miekg/pkcs11"
)

// Proofs remembers which Inits the tokens accepted, so that the same Init
// need not be sent when the application makes it, only with its first data
// call: the answer is provably the same, because a token's Init depends
// only on the key (its value and attributes), the mechanism with its
// parameters, and the login, and a proof is valid only while none of them
// changed (the owner's change count is the same, and no Forget since: a
// login or logout). Only a token failure can then show at the data call
// rather than at the Init, and there the operation fails over anyway. This
// keeps a steady signer at one call per signature. K names an Init: its
// kind, key and mechanism. Safe for concurrent use.
type Proofs[K comparable] struct {
	mu    sync.Mutex
	gen   uint64 // bumped by Forget
	byKey map[K]proofAt
}

type proofAt struct{ gen, changes uint64 }

// maxProofs bounds the table; when full it starts again.
const maxProofs = 4096

// Provable reports whether an Init of mech can be proven: not when the
// mechanism has a parameter, which may hold pointers (CK_GCM_PARAMS' IV,
// an OAEP label; miekg's *GCMParams …) that are the caller's only during
// its Init, so such an Init is always sent when the application makes it.
func Provable(mech *pkcs11.Mechanism) bool {
	return mech != nil && len(mech.Parameter) == 0 && p11raw.PlainMechanism(mech)
}

// Proven reports whether Init k was accepted since the last change;
// changes is the owner's change count now.
func (p *Proofs[K]) Proven(k K, changes uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.byKey[k]
	return ok && at == proofAt{gen: p.gen, changes: changes}
}

// Record notes that a token accepted Init k; changes is the owner's
// change count read before the Init was sent.
func (p *Proofs[K]) Record(k K, changes uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byKey == nil || len(p.byKey) >= maxProofs {
		p.byKey = make(map[K]proofAt)
	}
	p.byKey[k] = proofAt{gen: p.gen, changes: changes}
}

// Forget drops every proof (a login or logout changes what a token
// accepts).
func (p *Proofs[K]) Forget() {
	p.mu.Lock()
	p.gen++
	p.byKey = nil
	p.mu.Unlock()
}
