package group

import (
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
)

// StateSlots returns the slots of the members whose group state (see
// pkg/replica's StateLabel) can be read and written now: serving (and,
// with recovering, being recovered), open, and logged in. A plan reads a
// recovering member's too: it may hold a destroy no other member saw, and
// its catch-up gives it what the others hold. Writes made outside a plan
// go to the serving members only, as the objects themselves do.
func (g *Group) StateSlots(recovering bool) []*slot.Slot {
	ms := g.view().members
	out := make([]*slot.Slot, 0, len(ms))
	for _, m := range ms {
		st := m.State()
		if !st.Serving() && !(recovering && st == member.Recovering) {
			continue
		}
		if s := m.Slot(); s != nil && s.LoggedIn() {
			out = append(out, s)
		}
	}
	return out
}
