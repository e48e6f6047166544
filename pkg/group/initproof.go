package group

import (
	"github.com/hagroup/hagroup/pkg/group/opstate"
	"github.com/hagroup/hagroup/pkg/group/vtable"
)

// proofKey names an Init for the group's opstate.Proofs: a member's answer
// to it depends on nothing else while no object changed in the group.
type proofKey struct {
	k    OpKind
	key  *vtable.Object // nil for a digest
	mech uint
}

// proofKeyOf returns op's proof key, or false when its Init cannot be
// proven (opstate.Provable).
func proofKeyOf(k OpKind, op *operation) (proofKey, bool) {
	if !opstate.Provable(op.Mech) {
		return proofKey{}, false
	}
	return proofKey{k: k, key: op.At.key, mech: op.Mech.Mechanism}, true
}
