// Package dispatch names how a member's calls reach its module and how
// long they may take by default: the one definition pkg/slot runs by and
// pkg/config validates against (pkg/slot does not import pkg/config, and
// a configuration is read without loading any module).
package dispatch

import (
	"fmt"
	"slices"
	"time"
)

// Default deadlines, used where neither the configuration nor a slot.Spec
// sets them.
const (
	DefaultCommandTimeout = 20 * time.Second
	DefaultKeygenTimeout  = 120 * time.Second
)

// CommandTimeout returns d, or DefaultCommandTimeout when d is not set
// (zero or negative).
func CommandTimeout(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultCommandTimeout
	}
	return d
}

// KeygenTimeout returns d, or DefaultKeygenTimeout when d is not set.
func KeygenTimeout(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultKeygenTimeout
	}
	return d
}

// Dispatch is how a member's calls reach its module.
type Dispatch string

// The dispatches.
const (
	// Handoff (the default) runs each call on the session's worker while
	// the caller waits for the answer, for the deadline or for its ctx,
	// whichever comes first. A module call cannot be cancelled: a call
	// given up is abandoned, its session quarantined and closed if the
	// call ever returns. The price is a hand-off per call.
	Handoff Dispatch = "handoff"
	// Inline runs each call on the caller's goroutine (the application's
	// thread, in libhapkcs11.so): no hand-off, for in-process software
	// tokens that cannot hang (SoftHSM). Neither the deadline nor ctx can
	// interrupt a call: a hung call hangs its caller. A watchdog marks the
	// member stalled once a call outlives its deadline; from then on every
	// other call fails at once with slot.ErrTimeout (class health), so the
	// group fails the member over, until the hung call returns.
	Inline Dispatch = "inline"
)

// All lists the dispatches, default first.
var All = []Dispatch{Handoff, Inline}

// Parse returns the dispatch named s ("" is the default).
func Parse(s string) (Dispatch, error) {
	if s == "" {
		return All[0], nil
	}
	if d := Dispatch(s); slices.Contains(All, d) {
		return d, nil
	}
	return "", fmt.Errorf("%q is not a dispatch: use %q (the default) or %q", s, Handoff, Inline)
}
