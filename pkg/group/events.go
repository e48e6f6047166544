package group

import (
	"context"
	"time"

	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/hagroup/hagroup/pkg/sync/tombstone"
)

// EventKind names what happened.
type EventKind string

// Event kinds.
const (
	// MemberFailed: a member was dropped from rotation (Err says why).
	MemberFailed EventKind = "member_failed"
	// MemberRecovering: recovery of a failed member started.
	MemberRecovering EventKind = "member_recovering"
	// MemberRecovered: a member returned to rotation (To: active or standby).
	MemberRecovered EventKind = "member_recovered"
	// MemberPromoted: a standby took work because no active member was left.
	MemberPromoted EventKind = "member_promoted"
	// MemberDemoted: a promoted standby went back to standby because an
	// active member returned.
	MemberDemoted EventKind = "member_demoted"
	// MemberRemoved: a member left the group.
	MemberRemoved EventKind = "member_removed"
	// ObjectReplicated: an object made or changed through the group reached
	// a member.
	ObjectReplicated EventKind = "object_replicated"
	// ReplicationFailed: an object could not be replicated to a member (the
	// member is failed and catches up on recovery).
	ReplicationFailed EventKind = "replication_failed"
	// ObjectDestroyed: an object destroyed through the group was removed
	// from a member.
	ObjectDestroyed EventKind = "object_destroyed"
	// TombstoneFailed: a destroy could not be recorded; a member that was
	// away may bring the object back. Also: a tombstone recorded ahead of
	// a destroy that did not happen could not be revoked (Err says so).
	TombstoneFailed EventKind = "tombstone_failed"
	// TombstoneStalled: a writer of the members' tombstone registers
	// stalled in mid-write past the fold protocol's margin
	// (tombstone.ErrStalled): its records were written again, and the
	// group stays flagged until a synchronisation re-applies every
	// tombstone (docs/DESIGN.md, "Group state on the members").
	TombstoneStalled EventKind = "tombstone_stalled"
	// ConflictFound: two different keys share one identity; the group
	// refuses to use either until an operator resolves it.
	ConflictFound EventKind = "conflict_found"
	// MemberLeaving: RemoveMember took a member out of rotation; it is
	// removed (MemberRemoved) once its work in flight has ended.
	MemberLeaving EventKind = "member_leaving"
	// MemberAdded: a member joined the open group (To: recovering until
	// it is caught up, or failed when its token could not be opened).
	MemberAdded EventKind = "member_added"
	// GroupDown: the last serving member failed. Err says what happens to
	// sessions and login under the recovery mode.
	GroupDown EventKind = "group_down"
	// MechanismMissing: a member's token lacks a mechanism the group
	// needs (Err names both, and what follows); reported once per change.
	MechanismMissing EventKind = "mechanism_missing"
	// CreationRefused: a creation was refused, before anything was
	// written, because a serving member cannot hold a key of that kind
	// (Err names the member, the kind and why; see capability.go).
	CreationRefused EventKind = "creation_refused"
	// KeysUnholdable: a member's token offers the wrap mechanism but
	// refused to wrap or unwrap trial keys of some kinds (Err names them
	// and the token's answer): while it serves with another member the
	// group makes no key of those kinds. Reported once per change.
	KeysUnholdable EventKind = "keys_unholdable"
	// DomainKeyWeak: a member's domain key could be made to decrypt what it
	// wraps (Err, a *domainkey.WeakError, names the key and each
	// attribute at fault); nothing is replicated to or from the member
	// until an operator replaces the key (hactl hagroup domain --replace).
	// Reported once per member and set of flaws.
	DomainKeyWeak EventKind = "domain_key_weak"
	// GroupStateFailed: group state on a member (a tombstone or a behind
	// mark; see pkg/sync/state's Label) could not be read or written
	// (Err says which and why), or every serving member is marked behind
	// by another (run hactl hagroup synchronize).
	GroupStateFailed EventKind = "group_state_failed"
)

// Event is one thing that happened in a group. Fields that do not apply to
// the kind are zero.
type Event struct {
	Kind   EventKind
	Time   time.Time
	Group  string // group label
	Member string
	// From and To are the member states of a member event.
	From, To member.State
	// Object is the identity of an object event.
	Object object.Identity
	// Fingerprint of the object (or, for ConflictFound, one of the two).
	Fingerprint []byte
	// Other is the second fingerprint of a ConflictFound, or the other
	// member involved.
	Other []byte
	Err   error
}

// EventSink receives a group's events. Event is called synchronously on
// the goroutine where the event happened, possibly on the hot path and
// concurrently: it must be safe for concurrent use and must not block.
type EventSink interface {
	Event(Event)
}

// EventFunc adapts a function to an EventSink.
type EventFunc func(Event)

// Event calls f(e).
func (f EventFunc) Event(e Event) { f(e) }

// Tombstones records destroys so that a member that was away cannot bring
// a destroyed object back. The group records a tombstone ahead of the
// destroy and revokes it (a record with Revoked set and the tombstone's
// Time) when the destroy does not happen. *tombstone.Journal implements
// it.
type Tombstones interface {
	Record(ctx context.Context, t tombstone.Tombstone) error
}

// Reviver is implemented by Tombstones that can revoke the tombstones of
// a version (identity and fingerprint) made again through the group, so
// that a plan does not delete the new object on the old destroy's
// account (a plan deletes a tombstoned version wherever it remains).
// *tombstone.Journal and *tombstone.Memory implement it.
type Reviver interface {
	Revive(ctx context.Context, id object.Identity, fingerprint []byte) (int, error)
}

func (g *Group) emit(e Event) {
	if g.events == nil {
		return
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	e.Group = g.label
	g.events.Event(e)
}

// onTransition turns a member state change into a group event.
func (g *Group) onTransition(t member.Transition) {
	if t.To.Serving() {
		g.down.Store(false)
	}
	var k EventKind
	switch {
	case t.To == member.Failed:
		k = MemberFailed
	case t.To == member.Recovering:
		k = MemberRecovering
	case t.To == member.Removed:
		k = MemberRemoved
	case t.From == member.Recovering:
		k = MemberRecovered
	case t.From == member.Standby && t.To == member.Active:
		k = MemberPromoted
	case t.From == member.Active && t.To == member.Standby:
		k = MemberDemoted
	default:
		return
	}
	g.emit(Event{Kind: k, Time: t.Time, Member: t.Member, From: t.From, To: t.To, Err: t.Err})
}
