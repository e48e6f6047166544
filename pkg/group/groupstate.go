package group

import (
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
)

// StateSlots returns the slots of the members whose group state (see
// pkg/replica's StateLabel) can be read and written now: serving or
// being recovered, open, and logged in. A recovering member is included:
// it may hold a destroy no other member saw, and a catch-up must give it
// what the others hold.
func (g *Group) StateSlots() []*slot.Slot {
	ms := g.view().members
	out := make([]*slot.Slot, 0, len(ms))
	for _, m := range ms {
		st := m.State()
		if st != member.Active && st != member.Standby && st != member.Recovering {
			continue
		}
		if s := m.Slot(); s != nil && s.LoggedIn() {
			out = append(out, s)
		}
	}
	return out
}
