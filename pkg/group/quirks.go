package group

import (
	"github.com/hagroup/hagroup/internal/tokenquirk"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
)

// The engine's rules written for one make apply to that make only
// (internal/tokenquirk, keyed by the manufacturer and model of the
// member's token; DESIGN.md, "Quirks, per make").

// retriesAmbiguous reports whether a creation or copy sl answered with
// CKR_GENERAL_ERROR is asked once more, and a stateless single-part call
// that no other member can serve (tokenquirk.RetriesGeneralError).
func retriesAmbiguous(sl *slot.Slot) bool {
	if sl == nil {
		return false
	}
	t := sl.Token()
	return tokenquirk.RetriesGeneralError(t.Manufacturer, t.Model)
}

// doubtsProbe reports whether an ambiguous probe answer from m is doubted
// until its next probe (tokenquirk.DoubtsProbe); otherwise it fails m at
// once.
func doubtsProbe(m *member.Member) bool {
	s := m.Slot()
	if s == nil {
		return true
	}
	t := s.Token()
	return tokenquirk.DoubtsProbe(t.Manufacturer, t.Model)
}
