package agent

import "time"

// The fleet's wire types: what every process that runs a group's engine
// (pkg/fleet's Reporter) sends to haagent.

// ReportPath is the agent's route for the fleet's reports.
const ReportPath = "/v1/report"

// Bounds on one fleet report, enforced by the agent (a report past them is
// refused) and respected by pkg/fleet's Reporter, which sends one every
// DefaultReportInterval (at most MaxReportInterval).
const (
	MaxGroups             = 64
	MaxMembers            = 64 // per group
	MaxEvents             = 64 // per report
	MaxNameLen            = 128
	MaxDetailLen          = 512
	MaxProgramLen         = 64
	MaxHostLen            = 255
	DefaultReportInterval = 5 * time.Second
	MaxReportInterval     = 3 * DefaultReportInterval
)

// FleetReport is what one process sends to the agent: a snapshot of every group
// it runs and the events since its last report.
type FleetReport struct {
	// Program is the process's program name (its argv[0] base name).
	Program string `json:"program"`
	// PID is the process id as the process sees it; the agent records the
	// one SO_PEERCRED gives.
	PID  int    `json:"pid"`
	Host string `json:"host"`
	// Started is when this reporter started: a new value under the same
	// pid is a new life of the engine (counters start again at zero).
	Started time.Time    `json:"started"`
	Groups  []FleetGroup `json:"groups"`
	Events  []FleetEvent `json:"events,omitempty"`
	// Dropped counts the events this process dropped because its queue
	// was full (since Started).
	Dropped uint64 `json:"dropped,omitempty"`
	// Final says the process is closing the groups: the agent keeps its
	// figures in the totals and forgets the process.
	Final bool `json:"final,omitempty"`
}

// FleetGroup is one group as one process runs it.
type FleetGroup struct {
	Group   string        `json:"group"`
	Members []FleetMember `json:"members"`
}

// FleetMember is one member's state and counters in one process;
// counters are cumulative since FleetReport.Started.
type FleetMember struct {
	Name       string `json:"name"`
	State      string `json:"state"`
	Operations uint64 `json:"operations"`
	Errors     uint64 `json:"errors"`
	Failovers  uint64 `json:"failovers"`
	InFlight   int64  `json:"inFlight"`
	Hedges     uint64 `json:"hedges,omitempty"`
}

// FleetEvent is one HA event that happened in a reporting process.
type FleetEvent struct {
	Time   time.Time `json:"time"`
	Group  string    `json:"group"`
	Member string    `json:"member,omitempty"`
	Event  string    `json:"event"`
	Detail string    `json:"detail,omitempty"`
}
