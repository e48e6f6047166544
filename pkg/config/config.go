// Package config is hagroup's configuration: the TOML schema of
// hagroup.toml, its defaults, strict decoding and validation with file:line
// errors, PIN sources, and locked atomic edits.
//
// A file is read with [Load] (or [Parse] for bytes already in hand), which
// rejects unknown keys and runs [Config.Validate]. Programs that change the
// file (hactl) use [Edit], which serialises concurrent editors with a file
// lock and replaces the file atomically, so a reader sees either the old or
// the new configuration, never a mixture.
//
// The effective settings of a group come from [Config.Settings]: built-in
// defaults, overridden by the [ha] table, overridden by keys written in the
// group's own [[group]] table.
package config

import (
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/hagroup/hagroup/pkg/slot/dispatch"
)

// Paths and environment.
const (
	// DefaultPath is the configuration file used when neither a --config
	// flag nor $HAGROUP_CONF names one.
	DefaultPath = "/etc/hagroup/hagroup.toml"
	// EnvPath is the environment variable that names the configuration
	// file when no flag does.
	EnvPath = "HAGROUP_CONF"
)

// Load-balancing policies for the key "policy".
const (
	// PolicyLeastBusy sends work to the active member with the fewest
	// operations in flight, weighted by its recent latency.
	PolicyLeastBusy = "least-busy"
	// PolicyRoundRobin sends work to the active members in turn.
	PolicyRoundRobin = "round-robin"
	// PolicyPrimaryBackup sends all work to the first healthy member in
	// configured order.
	PolicyPrimaryBackup = "primary-backup"
)

// Recovery modes for the key "recovery_mode".
const (
	// RecoveryActiveBasic recovers a failed member in the background.
	RecoveryActiveBasic = "activeBasic"
	// RecoveryActiveEnhanced also restores sessions and login state after
	// every member has failed and come back.
	RecoveryActiveEnhanced = "activeEnhanced"
)

// Built-in defaults, used where neither [ha] nor a group sets a key.
const (
	DefaultOnly             = false
	DefaultRecoveryMode     = RecoveryActiveBasic
	DefaultRetries          = -1 // unlimited
	DefaultInterval         = 60 * time.Second
	DefaultPolicy           = PolicyLeastBusy
	DefaultFailureThreshold = 1
	DefaultProbeInterval    = 5 * time.Second
	DefaultTombstoneHorizon = 90 * 24 * time.Hour
	DefaultHedge            = true

	DefaultSocket      = "/run/hagroup/haagent.sock"
	DefaultStateDir    = "/var/lib/hagroup"
	DefaultLogMaxBytes = 10 << 20 // 10 MiB
)

// Config is the whole of hagroup.toml.
type Config struct {
	// Agent is the [agent] table: settings of haagent only.
	Agent Agent `toml:"agent"`
	// Library is the [library] table: how libhapkcs11.so runs in the
	// application's process.
	Library Library `toml:"library"`
	// HA is the [ha] table: defaults for every group.
	HA HA `toml:"ha"`
	// Groups are the [[group]] tables, in file order.
	Groups []Group `toml:"group"`

	// Path is the file the configuration was read from (or the name given
	// to Parse); it is used in error messages and is not part of the file.
	Path string `toml:"-"`

	// src locates keys in the file the configuration was parsed from, for
	// file:line in validation errors. Nil for configurations built or
	// changed in memory.
	src *source
}

// Agent is the [agent] table. Unset fields take the defaults applied by
// [Agent.WithDefaults].
type Agent struct {
	// Socket is the Unix socket haagent serves hactl on.
	Socket string `toml:"socket"`
	// StateDir holds tombstones and checkpoints.
	StateDir string `toml:"state_dir"`
	// LogFile is the HA event log; empty means none is written.
	LogFile string `toml:"log_file"`
	// LogMaxBytes is the size at which the event log is rotated.
	LogMaxBytes int64 `toml:"log_max_bytes"`
	// Metrics is the host:port of the Prometheus endpoint; empty means off.
	Metrics string `toml:"metrics"`
	// AllowedUIDs are user IDs, besides root and the agent's own, that may
	// use the socket.
	AllowedUIDs []int `toml:"allowed_uids"`
	// AllowedGroup is a group (name or numeric ID) whose members may use
	// the socket.
	AllowedGroup string `toml:"allowed_group"`
	// OthersReadOnly, when true, lets any other peer that can reach the
	// socket run read-only commands. Nil means unset (false).
	OthersReadOnly *bool `toml:"others_read_only"`
}

// WithDefaults returns a copy of a with every unset field given its
// default. The copy is meant for use, not for writing back to the file.
func (a Agent) WithDefaults() Agent {
	if a.Socket == "" {
		a.Socket = DefaultSocket
	}
	if a.StateDir == "" {
		a.StateDir = DefaultStateDir
	}
	if a.LogMaxBytes == 0 {
		a.LogMaxBytes = DefaultLogMaxBytes
	}
	if a.OthersReadOnly == nil {
		f := false
		a.OthersReadOnly = &f
	}
	a.AllowedUIDs = slices.Clone(a.AllowedUIDs)
	return a
}

// The values of library.process.
const (
	// ProcessInProcess runs the HA engine in the application's process
	// (the default); a process forked from it gets a helper.
	ProcessInProcess = "in-process"
	// ProcessHelper runs the engine in a helper process for every
	// application, forked or not.
	ProcessHelper = "helper"
)

// Library is the [library] table.
type Library struct {
	// Process is ProcessInProcess or ProcessHelper; empty means
	// ProcessInProcess.
	Process string `toml:"process"`
}

// HA holds the high-availability keys, used both for the [ha] table
// (defaults for every group) and inline in a [[group]] table (that group's
// override). Every field is optional: a nil pointer, an empty string or a
// zero Duration means unset.
type HA struct {
	// Only hides the member slots and lists only the virtual slots (Luna's
	// HAOnly).
	Only *bool `toml:"only"`
	// RecoveryMode is RecoveryActiveBasic or RecoveryActiveEnhanced.
	RecoveryMode string `toml:"recovery_mode"`
	// Retries is how many times a failed member is retried; -1 unlimited,
	// 0 off.
	Retries *int `toml:"retries"`
	// Interval is the time between recovery attempts (at least 1s).
	Interval Duration `toml:"interval"`
	// CommandTimeout bounds every call to a member.
	CommandTimeout Duration `toml:"command_timeout"`
	// KeygenTimeout bounds key generation on a member.
	KeygenTimeout Duration `toml:"keygen_timeout"`
	// Policy is PolicyLeastBusy, PolicyRoundRobin or PolicyPrimaryBackup.
	Policy string `toml:"policy"`
	// FailureThreshold is how many consecutive health failures drop a
	// member from rotation (at least 1).
	FailureThreshold *int `toml:"failure_threshold"`
	// ProbeInterval is the time between the agent's health probes of idle
	// members.
	ProbeInterval Duration `toml:"probe_interval"`
	// TombstoneHorizon is how long a deletion is remembered for members
	// that are away.
	TombstoneHorizon Duration `toml:"tombstone_horizon"`
	// Hedge sends a single-part request a member is slow to answer to
	// another member too, the first answer winning (docs/DESIGN.md,
	// "Hedged requests").
	Hedge *bool `toml:"hedge"`
}

// Group is one [[group]] table: one virtual slot.
type Group struct {
	// Label is the virtual token's label, unique in the file.
	Label string `toml:"label"`
	// Serial is the virtual token's serial number (digits), unique in the
	// file when set; creategroup assigns one.
	Serial string `toml:"serial"`
	// Members are the [[group.member]] tables, in configured order (the
	// first healthy one is the primary).
	Members []Member `toml:"member"`
	// HA holds this group's overrides of the [ha] keys, written inline in
	// the [[group]] table.
	HA
}

// Member is one [[group.member]] table: one physical token.
type Member struct {
	// Name is stable and unique in its group; used in logs and metrics.
	Name string `toml:"name"`
	// Module is the absolute path of the PKCS#11 module.
	Module string `toml:"module"`
	// ModuleEnv is environment the module reads at load time (such as
	// P11_KIT_SERVER_ADDRESS); a member with one gets its own module
	// context.
	ModuleEnv map[string]string `toml:"module_env"`
	// InitArgs is the pReserved string of the module's C_Initialize
	// (p11-kit's x-init-reserved), which NSS softokn needs: such as
	// "configdir='sql:/var/lib/nss' certPrefix='' keyPrefix='' secmod='secmod.db'".
	// Never a PIN. A token served by hsmserve takes them on hsmserve's
	// command line instead.
	InitArgs string `toml:"init_args"`
	// TokenLabel, TokenSerial and URI select the token; exactly one is set.
	TokenLabel  string `toml:"token_label"`
	TokenSerial string `toml:"token_serial"`
	URI         string `toml:"uri"`
	// PINFile and PINEnv are where the user PIN comes from; at most one is
	// set. See [Member.ReadPIN].
	PINFile string `toml:"pin_file"`
	PINEnv  string `toml:"pin_env"`
	// Standby members take no work until every active member is down.
	Standby bool `toml:"standby"`
	// Dispatch is how calls reach the member's module: "handoff" (the
	// default, also when empty) or "inline"; pkg/slot/dispatch says what
	// each means.
	Dispatch string `toml:"dispatch"`
	// ServerUID, for a token served by hsmserve (module hagroup-remote:),
	// is the uid hsmserve must run as; root is accepted too. Unset: the
	// uid of the process using the group. See [Member.ExpectedServerUID].
	ServerUID *int64 `toml:"server_uid"`
}

// ExpectedServerUID is the uid a served member's hsmserve must run as,
// as pkg/remote takes it (nil: the caller's own uid). Validate has checked
// the range.
func (m Member) ExpectedServerUID() *uint32 {
	if m.ServerUID == nil {
		return nil
	}
	uid := uint32(*m.ServerUID)
	return &uid
}

// Settings are the effective HA settings of one group, every field
// resolved.
type Settings struct {
	Only             bool
	RecoveryMode     string
	Retries          int
	Interval         time.Duration
	CommandTimeout   time.Duration
	KeygenTimeout    time.Duration
	ProbeInterval    time.Duration
	TombstoneHorizon time.Duration
	Policy           string
	FailureThreshold int
	Hedge            bool
}

// Defaults returns the built-in settings.
func Defaults() Settings {
	return Settings{
		Only:             DefaultOnly,
		RecoveryMode:     DefaultRecoveryMode,
		Retries:          DefaultRetries,
		Interval:         DefaultInterval,
		CommandTimeout:   dispatch.DefaultCommandTimeout,
		KeygenTimeout:    dispatch.DefaultKeygenTimeout,
		ProbeInterval:    DefaultProbeInterval,
		TombstoneHorizon: DefaultTombstoneHorizon,
		Policy:           DefaultPolicy,
		FailureThreshold: DefaultFailureThreshold,
		Hedge:            DefaultHedge,
	}
}

// override sets in s every key that h sets.
func (s *Settings) override(h HA) {
	if h.Only != nil {
		s.Only = *h.Only
	}
	if h.RecoveryMode != "" {
		s.RecoveryMode = h.RecoveryMode
	}
	if h.Retries != nil {
		s.Retries = *h.Retries
	}
	for _, d := range []struct {
		src Duration
		dst *time.Duration
	}{
		{h.Interval, &s.Interval},
		{h.CommandTimeout, &s.CommandTimeout},
		{h.KeygenTimeout, &s.KeygenTimeout},
		{h.ProbeInterval, &s.ProbeInterval},
		{h.TombstoneHorizon, &s.TombstoneHorizon},
	} {
		if d.src.IsSet() {
			*d.dst = d.src.Std()
		}
	}
	if h.Policy != "" {
		s.Policy = h.Policy
	}
	if h.FailureThreshold != nil {
		s.FailureThreshold = *h.FailureThreshold
	}
	if h.Hedge != nil {
		s.Hedge = *h.Hedge
	}
}

// Settings returns the effective settings of g: the built-in defaults,
// overridden by [ha], overridden by g's own keys. g may be nil (the [ha]
// settings), and so may c (the defaults).
func (c *Config) Settings(g *Group) Settings {
	s := Defaults()
	if c != nil {
		s.override(c.HA)
	}
	if g != nil {
		s.override(g.HA)
	}
	return s
}

// Group returns the group labelled label, as a pointer into c.Groups so
// that an [Edit] function can change it in place.
func (c *Config) Group(label string) (*Group, bool) {
	for i := range c.Groups {
		if c.Groups[i].Label == label {
			return &c.Groups[i], true
		}
	}
	return nil, false
}

// RemoveGroup removes the group labelled label and reports whether there
// was one.
func (c *Config) RemoveGroup(label string) bool {
	n := len(c.Groups)
	c.Groups = slices.DeleteFunc(c.Groups, func(g Group) bool { return g.Label == label })
	return len(c.Groups) != n
}

// firstSerial is the serial NextSerial hands out in a file without groups.
const firstSerial = 1000001

// NextSerial returns a virtual slot serial that no group in c uses: one
// more than the largest numeric serial in use, and at least 1000001.
func (c *Config) NextSerial() string {
	next := uint64(firstSerial)
	for _, g := range c.Groups {
		if n, err := strconv.ParseUint(g.Serial, 10, 64); err == nil && n >= next && n < 1e16-1 {
			next = n + 1
		}
	}
	return strconv.FormatUint(next, 10)
}

// Member returns the member called name, as a pointer into g.Members.
func (g *Group) Member(name string) (*Member, bool) {
	for i := range g.Members {
		if g.Members[i].Name == name {
			return &g.Members[i], true
		}
	}
	return nil, false
}

// RemoveMember removes the member called name and reports whether there
// was one.
func (g *Group) RemoveMember(name string) bool {
	n := len(g.Members)
	g.Members = slices.DeleteFunc(g.Members, func(m Member) bool { return m.Name == name })
	return len(g.Members) != n
}

// ResolvePath returns the configuration file to use: flag when it is not
// empty, else $HAGROUP_CONF when set and not empty, else DefaultPath.
func ResolvePath(flag string) string {
	if flag != "" {
		return flag
	}
	if p := os.Getenv(EnvPath); p != "" {
		return p
	}
	return DefaultPath
}
