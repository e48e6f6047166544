package recover

import (
	"fmt"
	"strings"
	"time"

	"github.com/hagroup/hagroup/pkg/sync"
)

// EventKind names what happened.
type EventKind string

// Event kinds. Every attempt emits AttemptStarted and then exactly one of
// Recovered or AttemptFailed (plus ConflictFound before a failure caused by
// a conflict, and GaveUp after the last automatic attempt failed). A
// scheduled attempt that found the member's lock held by another process
// emits AttemptSkipped instead and costs no attempt. PINBlocked follows an
// attempt whose login the token refused (CKR_PIN_INCORRECT, _LOCKED,
// _EXPIRED), and comes when an automatic attempt is first held back by a
// PIN mark (made by any process): no automatic attempt is made until a
// manual one. A synchronisation that finds a member's lock held by a
// recovery emits LockWaiting (Err names the holder) before it waits for it.
// HalfMadeRemoved (halfmade.go) says what Recoverer.RemoveHalfMade deleted.
const (
	AttemptStarted EventKind = "recovery_attempt"
	Recovered      EventKind = "recovery_succeeded"
	AttemptFailed  EventKind = "recovery_failed"
	GaveUp         EventKind = "recovery_gave_up"
	AttemptSkipped EventKind = "recovery_skipped"
	ConflictFound  EventKind = "recovery_conflict"
	PINBlocked     EventKind = "recovery_pin_blocked"
	LockWaiting    EventKind = "recovery_lock_waiting"
)

// Event is one step of a member's recovery. Fields that do not apply to
// the kind are zero.
type Event struct {
	Kind   EventKind
	Time   time.Time
	Member string
	// Attempt is the number of an automatic attempt in its episode (0 for
	// a manual one); for GaveUp, the number of attempts made.
	Attempt int
	// AttemptsLeft after this attempt; -1 without limit.
	AttemptsLeft int
	Manual       bool
	Err          error
	// Conflicts of a ConflictFound, each with every fingerprint.
	Conflicts []sync.Conflict
	// Copied and Deleted count the catch-up actions of a Recovered.
	Copied, Deleted int
	// Unreadable are the objects a Recovered's catch-up listed but could
	// not read (by member and handle): left alone, reported.
	Unreadable []sync.Unreadable
	// Duration of the attempt (Recovered, AttemptFailed).
	Duration time.Duration
}

// Detail describes the event for an event log line: manual or the attempt
// number, what a Recovered's catch-up copied and deleted, the conflicts
// and unreadable objects, and the error.
func (e Event) Detail() string {
	var parts []string
	if e.Manual {
		parts = append(parts, "manual")
	} else if e.Attempt > 0 {
		parts = append(parts, fmt.Sprintf("attempt %d", e.Attempt))
	}
	switch e.Kind {
	case Recovered:
		parts = append(parts, fmt.Sprintf("copied %d, deleted %d", e.Copied, e.Deleted))
	case HalfMadeRemoved:
		parts = append(parts, fmt.Sprintf("deleted %d object(s) %v", e.Deleted, sync.ErrHalfMade))
	}
	for _, c := range e.Conflicts {
		parts = append(parts, c.String())
	}
	for _, u := range e.Unreadable {
		parts = append(parts, u.String())
	}
	if e.Err != nil {
		parts = append(parts, e.Err.Error())
	}
	return strings.Join(parts, ": ")
}
