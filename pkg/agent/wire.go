// Package agent is haagent's socket API: the wire types that cross the Unix
// socket, the HTTP/1.1 server haagent runs on it, and the typed Client that
// hactl uses. Command code never speaks raw JSON or HTTP; it calls Client
// methods and gets these types back.
//
// The protocol is HTTP/1.1 over a Unix socket. Every route lives under /v1/,
// carries the fixed fake Host "haagent.sock", and is declared in one route
// table together with the access it needs (read or write). Who may read or
// write is decided once per connection from the peer's SO_PEERCRED.
package agent

import (
	"encoding/json"
	"slices"
	"time"
)

// SchemaVersion is the version of every JSON document this package emits,
// on the wire and in hactl's --json output. It grows only when a field
// changes meaning or disappears; added fields keep it.
const SchemaVersion = 1

// APIVersion is the protocol version, sent by the server in the
// Hagroup-Api header and compared by the client.
const APIVersion = "1"

// Header names and the fake Host the server checks.
const (
	// HeaderAPI carries APIVersion on every response.
	HeaderAPI = "Hagroup-Api"
	// HeaderVersion carries the agent's build version on every response.
	HeaderVersion = "Hagroup-Version"
	// Host is the fixed fake Host every request must carry. A browser
	// tricked into talking to the socket cannot set it.
	Host = "haagent.sock"
)

// Member states, as reported in MemberStatus.State.
const (
	StateActive     = "active"
	StateStandby    = "standby"
	StateFailed     = "failed"
	StateRecovering = "recovering"
	StateDown       = "down"    // probed without an engine: the token could not be opened
	StateUp         = "up"      // probed without an engine: the token answered
	StateUnknown    = "unknown" // not probed
)

// Source values of GroupsReport.Source.
const (
	// SourceAgent: the report came from a running haagent's engine.
	SourceAgent = "agent"
	// SourceConfig: no agent answered; the report was built from the
	// config file and by opening the tokens directly.
	SourceConfig = "config"
)

// Settings are the effective HA settings of a group (or the global
// defaults), as the wire carries them. Durations are Go duration strings.
type Settings struct {
	Only             bool   `json:"only"`
	RecoveryMode     string `json:"recoveryMode"`
	Retries          int    `json:"retries"`
	Interval         string `json:"interval"`
	CommandTimeout   string `json:"commandTimeout"`
	KeygenTimeout    string `json:"keygenTimeout"`
	ProbeInterval    string `json:"probeInterval"`
	Policy           string `json:"policy"`
	FailureThreshold int    `json:"failureThreshold"`
	Hedge            bool   `json:"hedge"`
}

// MemberStatus is one member's state in a GroupStatus.
type MemberStatus struct {
	Name        string `json:"name"`
	Module      string `json:"module"`
	Token       string `json:"token"` // how the token is selected: label=…, serial=… or the URI
	SlotID      *uint  `json:"slotId,omitempty"`
	TokenLabel  string `json:"tokenLabel,omitempty"`
	TokenSerial string `json:"tokenSerial,omitempty"`
	Standby     bool   `json:"standby"`
	Primary     bool   `json:"primary"`
	State       string `json:"state"`
	LastError   string `json:"lastError,omitempty"`
	InFlight    int64  `json:"inFlight"`
	Operations  uint64 `json:"operations"`
	Failures    uint64 `json:"failures"`
	// The figures every other process running the group reports (pkg/fleet),
	// summed; processes gone keep their share. Clients is how many report
	// the member now. Absent: zero (and always without an agent).
	ClientOperations uint64 `json:"clientOperations,omitempty"`
	ClientFailures   uint64 `json:"clientFailures,omitempty"`
	ClientFailovers  uint64 `json:"clientFailovers,omitempty"`
	Clients          int    `json:"clients,omitempty"`
	// Hedges counts the member's requests also sent to another member
	// because it was slow to answer, by the agent's engine and
	// (ClientHedges) by the reporting processes.
	Hedges       uint64 `json:"hedges,omitempty"`
	ClientHedges uint64 `json:"clientHedges,omitempty"`
	// NeedsSync reports whether the member lacks objects the group holds
	// (or holds objects the group deleted).
	NeedsSync bool `json:"needsSync"`

	// The fields below come from a running agent's engine (absent when
	// listgroups reads the configuration and tokens itself).

	// Since is when the member entered its current state.
	Since time.Time `json:"since,omitzero"`
	// Recovering reports whether a recovery attempt runs now.
	Recovering bool `json:"recovering,omitempty"`
	// AutoRecovery reports whether automatic attempts are scheduled.
	AutoRecovery bool `json:"autoRecovery,omitempty"`
	// GaveUp reports whether the automatic attempts ran out: the member
	// stays out until a manual recover.
	GaveUp bool `json:"gaveUp,omitempty"`
	// PINBlocked reports whether the member's token refused its PIN
	// (incorrect, locked, expired): no process logs it in or recovers it
	// automatically until `hactl hagroup recover` for it, which clears
	// the mark and tries once. PINBlockedReason says when and why.
	PINBlocked       bool   `json:"pinBlocked,omitempty"`
	PINBlockedReason string `json:"pinBlockedReason,omitempty"`
	// Attempts made in the current (or last) episode of automatic
	// recovery.
	Attempts int `json:"attempts,omitempty"`
	// AttemptsLeft is how many automatic attempts remain (-1: without
	// limit); nil when unknown.
	AttemptsLeft *int      `json:"attemptsLeft,omitempty"`
	LastAttempt  time.Time `json:"lastAttempt,omitzero"`
	NextAttempt  time.Time `json:"nextAttempt,omitzero"`
	// LastAttemptError is why the last recovery attempt failed.
	LastAttemptError string `json:"lastAttemptError,omitempty"`
	// OutOfSync is how many objects the member lacks, holds in excess or
	// holds in conflict, as last counted (at CheckedAt).
	OutOfSync int       `json:"outOfSync,omitempty"`
	CheckedAt time.Time `json:"checkedAt,omitzero"`
	// Conflicts names the objects the member holds in a version other
	// members do not share.
	Conflicts []string `json:"conflicts,omitempty"`
	// Unreplicated are keys made since the member was last caught up that
	// it could not receive.
	Unreplicated []UnreplicatedKey `json:"unreplicated,omitempty"`
	// MissingMechanisms the group needs and the member lacks (e.g.
	// CKM_AES_KEY_WRAP_PAD behind p11-kit 0.24).
	MissingMechanisms []string `json:"missingMechanisms,omitempty"`
	// CannotHold names the kinds of key the member's token was probed
	// unable to hold although it has the wrap mechanism (e.g. "EdDSA
	// keys" on SoftHSM 2.6): the keys_unholdable event, logged once.
	CannotHold []string `json:"cannotHold,omitempty"`
}

// UnreplicatedKey is a key a member could not receive.
type UnreplicatedKey struct {
	Object string    `json:"object"`
	Time   time.Time `json:"time,omitzero"`
}

// GroupStatus is one group as listgroups shows it.
type GroupStatus struct {
	Label    string         `json:"label"`
	Serial   string         `json:"serial"`
	Settings Settings       `json:"settings"`
	Members  []MemberStatus `json:"members"`
	// NeedsSync lists the members that need synchronisation.
	NeedsSync []string `json:"needsSync"`
	// Standbys lists the standby members by name.
	Standbys []string `json:"standbys"`
	// Healthy reports whether every non-standby member is in service.
	Healthy bool `json:"healthy"`
	// Hedges is how many of the group's requests were hedged (sent to a
	// second member, docs/DESIGN.md "Hedged requests"): the members'
	// Hedges and ClientHedges summed.
	Hedges uint64 `json:"hedges"`
	// TombstoneStall is the last stall of a tombstone register writer
	// not yet resolved by a synchronisation (nil: none).
	TombstoneStall *TombstoneStall `json:"tombstoneStall,omitempty"`
	// ComparedAt is when the comparison of the members that NeedsSync and
	// OutOfSync come from started: haagent's last (docs/DESIGN.md, "In
	// sync"), or one made for the request. ComparedAgo is its age when the
	// report was made, to the second.
	ComparedAt  time.Time `json:"comparedAt,omitzero"`
	ComparedAgo string    `json:"comparedAgo,omitempty"`
	// CompareError is why the members could not be compared: every member
	// then needs synchronisation.
	CompareError string `json:"compareError,omitempty"`
}

// TombstoneStall is a tombstone_stalled event the agent saw (its own
// engine's or a reporting process's): a writer of the members' tombstone
// registers stalled in mid-write past the fold protocol's margin. It stays
// until a synchronisation of the group (not a check) ends with no failure
// and no conflict.
type TombstoneStall struct {
	Time    time.Time `json:"time"`
	Member  string    `json:"member,omitempty"`
	Detail  string    `json:"detail,omitempty"`
	Program string    `json:"program,omitempty"`
	PID     int       `json:"pid,omitempty"`
	Host    string    `json:"host,omitempty"`
}

// GroupsReport is the answer to listgroups.
type GroupsReport struct {
	SchemaVersion int           `json:"schemaVersion"`
	Source        string        `json:"source"`
	ConfigPath    string        `json:"configPath"`
	Global        Settings      `json:"global"`
	Groups        []GroupStatus `json:"groups"`
}

// Degraded reports whether any group in the report is not fully healthy.
func (r GroupsReport) Degraded() bool {
	return slices.ContainsFunc(r.Groups, func(g GroupStatus) bool {
		return !g.Healthy || len(g.NeedsSync) > 0 || g.TombstoneStall != nil
	})
}

// RecoverRequest asks for a manual recovery of a group's failed members,
// or of one member.
type RecoverRequest struct {
	Group  string `json:"group"`
	Member string `json:"member,omitempty"`
	// Progress asks for a stream of progress lines (see ProgressLine)
	// before the result.
	Progress bool `json:"progress,omitempty"`
}

// MemberResult is the outcome of an action on one member.
type MemberResult struct {
	Member string `json:"member"`
	OK     bool   `json:"ok"`
	State  string `json:"state"`
	Detail string `json:"detail,omitempty"`
}

// RecoverResult is the answer to a RecoverRequest.
type RecoverResult struct {
	SchemaVersion int            `json:"schemaVersion"`
	Group         string         `json:"group"`
	Members       []MemberResult `json:"members"`
}

// Failed reports whether any member failed to recover.
func (r RecoverResult) Failed() bool {
	return slices.ContainsFunc(r.Members, func(m MemberResult) bool { return !m.OK })
}

// SyncRequest asks for a synchronisation (or, with Check, only its plan).
type SyncRequest struct {
	Group string `json:"group"`
	// Check plans without changing anything.
	Check bool `json:"check,omitempty"`
	// Prune destroys objects that exist only on some members instead of
	// replicating them; the caller must have confirmed it.
	Prune bool `json:"prune,omitempty"`
	// Progress asks for a stream of progress lines (see ProgressLine)
	// before the report.
	Progress bool `json:"progress,omitempty"`
}

// Progress is how far a synchronisation or recovery has come in applying
// its plan: Done of Total objects, the last on Member.
type Progress struct {
	Done   int    `json:"done"`
	Total  int    `json:"total"`
	Member string `json:"member"`
}

// ProgressLine is one line of the answer to a request that asked for
// progress: progress lines as the work goes, then one line with the
// result, or with the error.
type ProgressLine struct {
	Progress *Progress       `json:"progress,omitempty"`
	Result   json.RawMessage `json:"result,omitempty"`
	Error    string          `json:"error,omitempty"`
	Code     string          `json:"code,omitempty"`
}

// Difference is one object that is not the same on every member.
type Difference struct {
	Object  string   `json:"object"`  // identity, human readable
	Kind    string   `json:"kind"`    // missing, tombstoned, conflict
	Members []string `json:"members"` // the members the difference concerns
	Action  string   `json:"action"`  // what synchronize does (or did) about it
	Detail  string   `json:"detail,omitempty"`
}

// SyncReport is the answer to a SyncRequest.
type SyncReport struct {
	SchemaVersion int          `json:"schemaVersion"`
	Group         string       `json:"group"`
	Checked       bool         `json:"checked"` // true: planned only, nothing changed
	InSync        bool         `json:"inSync"`
	Differences   []Difference `json:"differences"`
	Applied       int          `json:"applied"`
	// Failed is how many actions failed (each a difference of kind
	// "failed").
	Failed    int `json:"failed"`
	Conflicts int `json:"conflicts"`
	// TombstoneStall, in a check, is the group's unresolved tombstone
	// stall (see GroupStatus): a check then fails (exit 3) in sync or not.
	TombstoneStall *TombstoneStall `json:"tombstoneStall,omitempty"`
}

// ReloadResult is the answer to a reload.
type ReloadResult struct {
	SchemaVersion int      `json:"schemaVersion"`
	ConfigPath    string   `json:"configPath"`
	Changes       []string `json:"changes"` // one line per group or member added, removed or changed
}

// Status describes the running agent.
type Status struct {
	SchemaVersion int       `json:"schemaVersion"`
	Version       string    `json:"version"`
	APIVersion    string    `json:"apiVersion"`
	PID           int       `json:"pid"`
	Started       time.Time `json:"started"`
	Uptime        string    `json:"uptime"`
	Socket        string    `json:"socket"`
	ConfigPath    string    `json:"configPath"`
	Groups        []string  `json:"groups"`
	// Access is what the asking connection may do: "read" or "write".
	Access string `json:"access"`
}

// Event is one line of the HA event log.
type Event struct {
	Time   time.Time `json:"time"`
	Group  string    `json:"group"`
	Member string    `json:"member,omitempty"`
	Event  string    `json:"event"`
	Detail string    `json:"detail,omitempty"`
	// Source says who wrote the event in logs written before the who
	// fields below existed ("libhapkcs11 pid 1234").
	Source string `json:"source,omitempty"`
	// Who saw it: the program, its pid and host (the agent's own events
	// name haagent), and for a reporting process its uid (SO_PEERCRED).
	Program string `json:"program,omitempty"`
	PID     int    `json:"pid,omitempty"`
	UID     *int   `json:"uid,omitempty"`
	Host    string `json:"host,omitempty"`
	// Repeats is, on a folded summary line, how many more times the event
	// happened in the window after the line that showed it first.
	Repeats int `json:"repeats,omitempty"`
}

// HALogRequest selects events from the HA event log.
type HALogRequest struct {
	// Since keeps events no older than this (0: all).
	Since time.Duration
	// Group keeps one group's events ("" : all).
	Group string
	// Follow keeps the stream open and sends new events as they happen.
	Follow bool
}

// keeps returns whether req keeps an event, at now.
func (req HALogRequest) keeps(now time.Time) func(Event) bool {
	var cutoff time.Time
	if req.Since > 0 {
		cutoff = now.Add(-req.Since)
	}
	return func(e Event) bool {
		return (req.Group == "" || e.Group == req.Group) && !e.Time.Before(cutoff)
	}
}

// ErrorBody is the JSON body of every non-2xx response.
type ErrorBody struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}
