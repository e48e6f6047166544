// Package fleet is how every process that runs a group's engine — an
// application through libhapkcs11.so, a Go program through pkg/ha — tells
// haagent what it sees: its identity, each member's state and counters,
// and the HA events that happened in it. The agent sums the fleet's
// counters beside its own (listgroups, metrics), lists the processes
// (hactl hagroup clients) and writes their events to the HA event log, in
// order and folded.
//
// Reporting is best effort and never blocks the application: events go
// into a bounded queue (dropped, and counted, when it is full), a
// background goroutine sends a snapshot every few seconds and at once
// after an event, each send has a short timeout, and without an agent
// nothing happens per call (the events go to the Fallback, folded).
//
// The package holds the wire types too, so that pkg/ha (which pkg/agent
// imports) can report without importing pkg/agent.
package fleet

import "time"

// Path is the agent's route for reports; Host is the fake Host every
// agent request carries (pkg/agent checks it).
const (
	Path = "/v1/report"
	Host = "haagent.sock"
)

// Bounds on one report, enforced by the agent (a report past them is
// refused) and respected by the Reporter.
const (
	MaxGroups       = 64
	MaxMembers      = 64 // per group
	MaxEvents       = 64 // per report
	MaxNameLen      = 128
	MaxDetailLen    = 512
	MaxProgramLen   = 64
	MaxHostLen      = 255
	DefaultInterval = 5 * time.Second
	MaxInterval     = 3 * DefaultInterval
)

// Report is what one process sends to the agent: a snapshot of every group
// it runs and the events since its last report.
type Report struct {
	// Program is the process's program name (its argv[0] base name).
	Program string `json:"program"`
	// PID is the process id as the process sees it; the agent records the
	// one SO_PEERCRED gives.
	PID  int    `json:"pid"`
	Host string `json:"host"`
	// Started is when this reporter started: a new value under the same
	// pid is a new life of the engine (counters start again at zero).
	Started time.Time     `json:"started"`
	Groups  []GroupReport `json:"groups"`
	Events  []Event       `json:"events,omitempty"`
	// Dropped counts the events this process dropped because its queue
	// was full (since Started).
	Dropped uint64 `json:"dropped,omitempty"`
	// Final says the process is closing the groups: the agent keeps its
	// figures in the totals and forgets the process.
	Final bool `json:"final,omitempty"`
}

// GroupReport is one group as one process runs it.
type GroupReport struct {
	Group   string         `json:"group"`
	Members []MemberReport `json:"members"`
}

// MemberReport is one member's state and counters in one process;
// counters are cumulative since Report.Started.
type MemberReport struct {
	Name       string `json:"name"`
	State      string `json:"state"`
	Operations uint64 `json:"operations"`
	Errors     uint64 `json:"errors"`
	Failovers  uint64 `json:"failovers"`
	InFlight   int64  `json:"inFlight"`
}

// Event is one HA event that happened in a reporting process.
type Event struct {
	Time   time.Time `json:"time"`
	Group  string    `json:"group"`
	Member string    `json:"member,omitempty"`
	Event  string    `json:"event"`
	Detail string    `json:"detail,omitempty"`
}
