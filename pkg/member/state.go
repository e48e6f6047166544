package member

import "fmt"

// State is where a member stands in its group's life cycle.
type State int32

// Member states. The zero value is not a state, so an uninitialised member
// is never mistaken for an active one.
const (
	// Active members take single-part work and are replication targets.
	Active State = iota + 1
	// Standby members take no work until no active member is left; they
	// are replication targets.
	Standby
	// Failed members take no work and are not replication targets; the
	// recovery loop retries them.
	Failed
	// Recovering members are being re-opened and resynchronised off the hot
	// path; they take no work yet.
	Recovering
	// Removed members have left the group for good.
	Removed
)

// String returns the lower-case name used in status output and events.
func (s State) String() string {
	switch s {
	case Active:
		return "active"
	case Standby:
		return "standby"
	case Failed:
		return "failed"
	case Recovering:
		return "recovering"
	case Removed:
		return "removed"
	}
	return fmt.Sprintf("state(%d)", int32(s))
}

// MarshalText lets states appear by name in JSON.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Serving reports whether a member in this state holds current objects and
// must receive replicated changes (active or standby).
func (s State) Serving() bool { return s == Active || s == Standby }

// CanTransition reports whether from → to is a legal transition. Anything
// else is refused, so a racing recovery and failover cannot, for example,
// revive a removed member or return a failed one to rotation without
// passing through Recovering (where it is resynchronised).
func CanTransition(from, to State) bool {
	switch from {
	case Active: // demoted, failed, removed
		return to == Standby || to == Failed || to == Removed
	case Standby: // promoted, failed, removed
		return to == Active || to == Failed || to == Removed
	case Failed: // recovery starts, removed
		return to == Recovering || to == Removed
	case Recovering: // recovered as active or standby, recovery failed, removed
		return to == Active || to == Standby || to == Failed || to == Removed
	}
	return false // Removed is terminal
}
