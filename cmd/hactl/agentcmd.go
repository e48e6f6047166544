package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/spf13/cobra"
)

func newAgentCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "agent",
		Short:   "Talk to haagent itself",
		Example: `  hactl agent status`,
		Args:    noArgs,
		RunE:    needSubcommand,
	}
	cmd.AddCommand(newAgentStatusCmd(a), newAgentReloadCmd(a), newAgentSetCmd(a))
	return cmd
}

func newAgentStatusCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show haagent's version, uptime, groups, socket and config",
		Long: `Show the running haagent's version and API version, its uptime, the groups it
runs, its socket and config file, and what this connection may do (read or
write). Exits 4 when no agent answers.`,
		Example: `  hactl agent status
  hactl agent status --json`,
		Args:        noArgs,
		Annotations: map[string]string{annotUsesAgent: "true"},
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			c := a.client()
			defer c.Close()
			st, err := c.Status(cmd.Context())
			if err != nil {
				return err
			}
			return a.print(st, tableOf(makeStatusTable(st, version)))
		}),
	}
	cmd.Flags().Bool("json", false, "print the status as JSON")
	return cmd
}

func newAgentReloadCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "reload",
		Short: "Tell haagent to re-read its configuration file",
		Long: `Tell haagent to re-read its configuration (as SIGHUP does) and print what
changed. A file that does not load or validate is refused with the reason
(file:line) and haagent keeps running the configuration it had.`,
		Example: `  hactl agent reload`,
		Args:    noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			c := a.client()
			defer c.Close()
			res, err := c.Reload(cmd.Context())
			if err != nil {
				return err
			}
			return a.print(res, func(w io.Writer) error {
				fmt.Fprintf(w, "haagent reloaded %s\n", res.ConfigPath)
				for _, ch := range res.Changes {
					fmt.Fprintln(w, "  "+ch)
				}
				if len(res.Changes) == 0 {
					fmt.Fprintln(w, "  no changes")
				}
				return nil
			})
		}),
	}
	cmd.Flags().Bool("json", false, "print the result as JSON")
	return cmd
}

// agentSettings is agent set --show's report: the [agent] table in effect
// (defaults filled in) and the keys the file sets.
type agentSettings struct {
	SchemaVersion  int      `json:"schemaVersion"`
	Config         string   `json:"config"`
	Socket         string   `json:"socket"`
	StateDir       string   `json:"stateDir"`
	LogFile        string   `json:"logFile"`
	LogMaxBytes    int64    `json:"logMaxBytes"`
	Metrics        string   `json:"metrics"`
	AllowedUIDs    []int    `json:"allowedUids"`
	AllowedGroup   string   `json:"allowedGroup"`
	OthersReadOnly bool     `json:"othersReadOnly"`
	Set            []string `json:"set"` // the keys written in the file
}

// agentKey is one [agent] key that agent set can write: its flag, its key
// in the file, how it is set from the flag's text, and how it is read.
type agentKey struct {
	flag, key, usage string
	set              func(a *config.Agent, v string) error
	get              func(a config.Agent) (string, bool) // value, whether the file sets it
}

// agentKeys lists every [agent] key of the schema, in file order.
var agentKeys = []agentKey{
	{"socket", "socket", "haagent's Unix socket (absolute path)",
		func(a *config.Agent, v string) error { a.Socket = v; return nil },
		func(a config.Agent) (string, bool) { return a.Socket, a.Socket != "" }},
	{"state-dir", "state_dir", "directory of tombstones and checkpoints (absolute path)",
		func(a *config.Agent, v string) error { a.StateDir = v; return nil },
		func(a config.Agent) (string, bool) { return a.StateDir, a.StateDir != "" }},
	{"log-file", "log_file", `the HA event log (absolute path; "" for none)`,
		func(a *config.Agent, v string) error { a.LogFile = v; return nil },
		func(a config.Agent) (string, bool) { return a.LogFile, a.LogFile != "" }},
	{"log-max-bytes", "log_max_bytes", "size at which the event log is rotated (0: the default)",
		func(a *config.Agent, v string) error {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return &usageError{fmt.Sprintf("--log-max-bytes %q: want a number of bytes", v)}
			}
			a.LogMaxBytes = n
			return nil
		},
		func(a config.Agent) (string, bool) { return strconv.FormatInt(a.LogMaxBytes, 10), a.LogMaxBytes != 0 }},
	{"metrics", "metrics", `host:port of the Prometheus endpoint ("" for none)`,
		func(a *config.Agent, v string) error { a.Metrics = v; return nil },
		func(a config.Agent) (string, bool) { return a.Metrics, a.Metrics != "" }},
	{"allowed-uids", "allowed_uids", `user IDs that may use the socket, comma-separated ("" for none)`,
		func(a *config.Agent, v string) error {
			a.AllowedUIDs = nil
			for f := range strings.SplitSeq(v, ",") {
				if f = strings.TrimSpace(f); f == "" {
					continue
				}
				uid, err := strconv.Atoi(f)
				if err != nil {
					return &usageError{fmt.Sprintf("--allowed-uids: %q is not a user ID", f)}
				}
				a.AllowedUIDs = append(a.AllowedUIDs, uid)
			}
			return nil
		},
		func(a config.Agent) (string, bool) {
			ids := make([]string, len(a.AllowedUIDs))
			for i, u := range a.AllowedUIDs {
				ids[i] = strconv.Itoa(u)
			}
			return strings.Join(ids, ","), len(a.AllowedUIDs) > 0
		}},
	{"allowed-group", "allowed_group", `group (name or ID) whose members may use the socket ("" for none)`,
		func(a *config.Agent, v string) error { a.AllowedGroup = v; return nil },
		func(a config.Agent) (string, bool) { return a.AllowedGroup, a.AllowedGroup != "" }},
	{"others-read-only", "others_read_only", "let any other local user run read-only commands (true or false)",
		func(a *config.Agent, v string) error {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return &usageError{fmt.Sprintf("--others-read-only %q: want true or false", v)}
			}
			a.OthersReadOnly = &b
			return nil
		},
		func(a config.Agent) (string, bool) {
			return strconv.FormatBool(a.OthersReadOnly != nil && *a.OthersReadOnly), a.OthersReadOnly != nil
		}},
}

func newAgentSetCmd(a *app) *cobra.Command {
	values := make([]string, len(agentKeys))
	var show bool
	cmd := &cobra.Command{
		Use:   "set",
		Short: "Show or set haagent's own settings (the [agent] table)",
		Long: `Set keys of the [agent] table: haagent's socket, state directory, event log
and its rotation size, metrics endpoint, and who may use the socket. Each
flag given sets its key ("" clears it back to the default); the edit is
locked and atomic and keeps the file's comments, as every hactl edit is, and a
running haagent is told to reload (a new socket, state directory or metrics
endpoint takes effect when it restarts; it says so). --show prints the
settings in effect, defaults filled in.`,
		Example: `  hactl agent set --socket /run/hagroup/haagent.sock --state-dir /var/lib/hagroup
  hactl agent set --log-file /var/log/hagroup/ha.log --log-max-bytes 10485760
  hactl agent set --metrics 127.0.0.1:9464 --allowed-uids 1001,1002
  hactl agent set --show`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if show {
				return a.showAgentSettings()
			}
			var given []int
			for i, k := range agentKeys {
				if cmd.Flags().Changed(k.flag) {
					given = append(given, i)
				}
			}
			if len(given) == 0 {
				return &usageError{"agent set: give at least one setting, or --show"}
			}
			return a.edit(cmd.Context(), func(c *config.Config) (string, error) {
				var done []string
				for _, i := range given {
					k := agentKeys[i]
					if err := k.set(&c.Agent, values[i]); err != nil {
						return "", err
					}
					v, set := k.get(c.Agent)
					if !set {
						v = "unset (default)"
					}
					done = append(done, fmt.Sprintf("agent.%s = %s", k.key, v))
				}
				return strings.Join(done, "; "), nil
			})
		}),
	}
	for i, k := range agentKeys {
		cmd.Flags().StringVar(&values[i], k.flag, "", k.usage)
	}
	cmd.Flags().BoolVar(&show, "show", false, "print the settings in effect")
	cmd.Flags().Bool("json", false, "print the result as JSON")
	for _, k := range agentKeys {
		cmd.MarkFlagsMutuallyExclusive("show", k.flag)
	}
	return cmd
}

// showAgentSettings prints the [agent] settings in effect.
func (a *app) showAgentSettings() error {
	c, err := a.loadConfig()
	if err != nil {
		return err
	}
	eff := c.Agent.WithDefaults()
	res := agentSettings{SchemaVersion: agent.SchemaVersion, Config: c.Path, Socket: eff.Socket, StateDir: eff.StateDir,
		LogFile: eff.LogFile, LogMaxBytes: eff.LogMaxBytes, Metrics: eff.Metrics, AllowedUIDs: slices.Clone(eff.AllowedUIDs),
		AllowedGroup: eff.AllowedGroup, OthersReadOnly: *eff.OthersReadOnly, Set: []string{}}
	if res.AllowedUIDs == nil {
		res.AllowedUIDs = []int{}
	}
	rows := make([][]string, 0, len(agentKeys))
	for _, k := range agentKeys {
		_, set := k.get(c.Agent)
		v, _ := k.get(eff)
		from := "default"
		if set {
			from = "set"
			res.Set = append(res.Set, k.key)
		}
		rows = append(rows, []string{k.key, dash(v), from})
	}
	return a.print(res, tableOf([]string{"AGENT SETTING", "VALUE", "FROM"}, rows))
}
