package group

import (
	"github.com/hagroup/hagroup/pkg/group/leftover"
	"github.com/hagroup/hagroup/pkg/group/vtable"
	"github.com/hagroup/hagroup/pkg/sync/object"
)

// newLeftovers returns the searches for what a creation of ins leaves on
// a member that fails it (pkg/group/leftover). A creation that names no
// identity of its own (a copy) keeps that of its first input.
func newLeftovers(ins []intent, inputs []*vtable.Object) leftover.Searches {
	calls := make([]leftover.Call, len(ins))
	for i, in := range ins {
		calls[i] = leftover.Call{Template: in.tmpl, Token: in.token, Class: in.class, ClassKnown: in.classKnown, ExplicitID: in.explicitID}
	}
	var first *object.Identity
	if len(inputs) > 0 {
		id := inputs[0].Identity()
		first = &id
	}
	return leftover.New(calls, first)
}
