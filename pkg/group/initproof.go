package group

import (
	"sync"

	"github.com/hagroup/hagroup/internal/p11raw"
)

// initProofs remembers which Inits the members accepted, so that the same
// Init need not be sent when the application makes it, only with its
// first data call: the answer is provably the same, because a token's
// Init depends only on the key (its value and attributes), the mechanism
// with its parameters, and the login, and a proof is valid only while
// none of them changed (no object changed in the group, no login or
// logout since). Only a member failure can then show at the data call
// rather than at the Init, and there the operation fails over anyway. This
// keeps a steady signer at one call per signature, from the members'
// pools. Safe for concurrent use.
type initProofs struct {
	mu    sync.Mutex
	gen   uint64 // bumped by forget
	byKey map[proofKey]proofAt
}

type proofKey struct {
	k    OpKind
	key  *vobject // nil for a digest
	mech uint
}

type proofAt struct{ gen, changes uint64 }

// maxProofs bounds the table; when full it starts again.
const maxProofs = 4096

// proofKeyOf returns op's proof key, or false when its mechanism has a
// parameter: a parameter may hold pointers (CK_GCM_PARAMS' IV, an OAEP
// label; miekg's *GCMParams …) that are the caller's only during its
// Init, so such an Init is always sent when the application makes it.
func proofKeyOf(k OpKind, op *operation) (proofKey, bool) {
	if op.mech == nil || len(op.mech.Parameter) != 0 || !p11raw.PlainMechanism(op.mech) {
		return proofKey{}, false
	}
	return proofKey{k: k, key: op.key, mech: op.mech.Mechanism}, true
}

// proven reports whether op's Init was accepted since the last change.
func (g *Group) proven(k OpKind, op *operation) bool {
	pk, ok := proofKeyOf(k, op)
	if !ok {
		return false
	}
	p := &g.proofs
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.byKey[pk]
	return ok && at == proofAt{gen: p.gen, changes: g.changes.Load()}
}

// record notes that a member accepted op's Init. changes is the group's
// change count read before the Init was sent.
func (g *Group) record(k OpKind, op *operation, changes uint64) {
	pk, ok := proofKeyOf(k, op)
	if !ok {
		return
	}
	p := &g.proofs
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byKey == nil || len(p.byKey) >= maxProofs {
		p.byKey = make(map[proofKey]proofAt)
	}
	p.byKey[pk] = proofAt{gen: p.gen, changes: changes}
}

// forgetProofs drops every proof (a login or logout changes what a
// member accepts).
func (g *Group) forgetProofs() {
	p := &g.proofs
	p.mu.Lock()
	p.gen++
	p.byKey = nil
	p.mu.Unlock()
}
