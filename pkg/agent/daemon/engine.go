// Package daemon is haagent's body: it loads the configuration, runs an
// engine for every group, probes members, checks synchronisation, writes
// the HA event log, exports Prometheus metrics and serves the agent socket
// (pkg/agent's Server) with itself as the Backend. cmd/haagent is a thin
// main around Daemon.
package daemon

import (
	"context"
	"errors"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/slot"
)

// Engine is one running group as the daemon drives it. The real one wraps
// pkg/group (and pkg/recover for recovery and pkg/sync for plans); the
// seam keeps the daemon independent of the engine's internals. Methods
// are called concurrently.
type Engine interface {
	// Status is the group's state for listgroups. Settings, Label and
	// Serial are filled by the daemon when left empty.
	Status(ctx context.Context) agent.GroupStatus
	// Probe makes one cheap call on every member that is not failed (so a
	// member failing while no application calls is noticed) and attempts
	// the recoveries that are due under the group's retries/interval
	// settings. It returns one result per member probed.
	Probe(ctx context.Context) []ProbeResult
	// Recover recovers failed members now: every failed member when
	// member is empty. A member already being recovered is reported, not
	// recovered twice.
	Recover(ctx context.Context, member string) ([]agent.MemberResult, error)
	// Synchronize plans (req.Check) or applies a synchronisation.
	Synchronize(ctx context.Context, req agent.SyncRequest) (agent.SyncReport, error)
	// OutOfSync compares the members now and returns, per member, how
	// many differences concern it (recover.SyncReport.OutOfSync, the
	// one rule for "in sync"); a member in sync has no entry. It fails
	// when the members cannot be compared. Members out of service count,
	// without their tokens being opened.
	OutOfSync(ctx context.Context) (map[string]int, error)
	// Serving reports whether the engine holds member in service (false
	// for a member it does not have). It does not block.
	Serving(member string) bool
	// Update applies a changed configuration of the same group (members
	// added, removed, changed to or from standby) without disturbing
	// unchanged members, returning one line per change. ErrReopen asks
	// the daemon to close and reopen the group instead.
	Update(ctx context.Context, g config.Group, s config.Settings) ([]string, error)
	// Close stops the group, letting operations in flight end.
	Close() error
}

// ProbeResult is one member's health probe.
type ProbeResult struct {
	Member   string
	Err      error
	Duration time.Duration
}

// ErrReopen is returned by Engine.Update when a change cannot be applied
// in place (a new serial, say): the daemon reopens the group.
var ErrReopen = errors.New("change needs the group reopened")

// Opener opens a group's engine. emit receives the group's events (it is
// safe for concurrent use and does not block for long).
type Opener func(ctx context.Context, g config.Group, s config.Settings, env Env, emit func(agent.Event)) (Engine, error)

// Env is what an engine gets from the daemon besides its group's config.
type Env struct {
	// StateDir is the agent's state directory (tombstones, checkpoints).
	StateDir string
	// Interceptor is passed to every member's slot: fault injection at the
	// pkg/slot boundary in tests; nil in production.
	Interceptor slot.Interceptor
}
