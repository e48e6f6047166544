package group

import (
	"github.com/hagroup/hagroup/pkg/group/opstate"
	"github.com/hagroup/hagroup/pkg/group/vtable"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
)

// The operation state machine of a Session is pkg/group/opstate's; these
// are its names in the Session API.
type (
	// OpKind names an operation family (opstate.Kind).
	OpKind = opstate.Kind
	// Step is which call of an operation runs (opstate.Step).
	Step = opstate.Step
	// Room is how much output the caller can take (opstate.Room).
	Room = opstate.Room
)

// The operation families, steps and rooms of opstate.
const (
	OpSign     = opstate.Sign
	OpVerify   = opstate.Verify
	OpEncrypt  = opstate.Encrypt
	OpDecrypt  = opstate.Decrypt
	OpDigest   = opstate.Digest
	StepSingle = opstate.Single
	StepUpdate = opstate.Update
	StepFinal  = opstate.Final
	RoomQuery  = opstate.Query
	RoomAny    = opstate.Any
)

// placement is where a virtual session runs an operation: the key its
// Init named, and the member and member session it went to (nil while
// deferred: see opstate.Proofs).
type placement struct {
	key   *vtable.Object // nil for a digest
	m     *member.Member // the member its Init went to
	ps    *slot.Session  // the member session it runs on
	epoch uint64         // m's epoch when placed
}

type operation = opstate.Op[placement]
