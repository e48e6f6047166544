package main

import (
	"fmt"
	"io"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/spf13/cobra"
)

// haTarget returns the [ha] table to edit: the global one, or a group's
// override when group is set, with a name for messages.
func (a *app) haTarget(c *config.Config, group string) (*config.HA, string, error) {
	if group == "" {
		return &c.HA, "global", nil
	}
	g, err := groupOf(c, group, a.configPath())
	if err != nil {
		return nil, "", err
	}
	return &g.HA, fmt.Sprintf("group %q", group), nil
}

// settingCmd builds one of the commands that set one HA key. When show is
// set, --show prints the effective value instead (a line, or with --json
// the value show returns), and the setting flag named flag is needed only
// without --show.
func (a *app) settingCmd(use, short, example string, addFlags func(*cobra.Command), set func(h *config.HA) (string, error),
	flag string, show func(s config.Settings, scope string) (string, any)) *cobra.Command {
	var group string
	var showIt bool
	cmd := &cobra.Command{
		Use:     use,
		Short:   short,
		Example: example,
		Args:    noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if showIt {
				s, scope, err := a.effectiveSettings(group)
				if err != nil {
					return err
				}
				line, v := show(s, scope)
				return a.print(v, func(w io.Writer) error {
					_, err := fmt.Fprintln(w, line)
					return err
				})
			}
			return a.edit(cmd.Context(), func(c *config.Config) (string, error) {
				h, where, err := a.haTarget(c, group)
				if err != nil {
					return "", err
				}
				what, err := set(h)
				if err != nil {
					return "", err
				}
				return fmt.Sprintf("%s: %s", where, what), nil
			})
		}),
	}
	cmd.Flags().StringVar(&group, "group", "", "set it for this group only (default: the global [ha] setting)")
	cmd.Flags().Bool("json", false, "print the result as JSON")
	addFlags(cmd)
	if show == nil {
		cmd.MarkFlagRequired(flag)
	} else {
		cmd.Flags().BoolVar(&showIt, "show", false, "print the value in effect (the group's own, else the global one, else the default)")
		cmd.MarkFlagsOneRequired(flag, "show")
		cmd.MarkFlagsMutuallyExclusive(flag, "show")
	}
	return cmd
}

// effectiveSettings are the settings in effect globally, or for group,
// with a name for the scope.
func (a *app) effectiveSettings(group string) (config.Settings, string, error) {
	c, err := a.loadConfig()
	if err != nil {
		return config.Settings{}, "", err
	}
	if group == "" {
		return c.Settings(nil), "global", nil
	}
	g, err := groupOf(c, group, a.configPath())
	if err != nil {
		return config.Settings{}, "", err
	}
	return c.Settings(g), fmt.Sprintf("group %q", group), nil
}

// retryShow is retry --show's report.
type retryShow struct {
	SchemaVersion int    `json:"schemaVersion"`
	Scope         string `json:"scope"`
	// Retries: -1 without limit, 0 off.
	Retries int `json:"retries"`
}

// intervalShow is interval --show's report.
type intervalShow struct {
	SchemaVersion   int    `json:"schemaVersion"`
	Scope           string `json:"scope"`
	IntervalSeconds int    `json:"intervalSeconds"`
}

func newRecoveryModeCmd(a *app) *cobra.Command {
	var mode string
	return a.settingCmd("recoverymode",
		"Set the recovery mode: activeBasic or activeEnhanced",
		`  hactl hagroup recoverymode --mode activeEnhanced
  hactl hagroup recoverymode --mode activeBasic --group signing`,
		func(cmd *cobra.Command) {
			cmd.Flags().StringVar(&mode, "mode", "", "activeBasic (recover members in the background) or activeEnhanced (also restore sessions and logins after a total outage)")
		},
		func(h *config.HA) (string, error) {
			if mode != config.RecoveryActiveBasic && mode != config.RecoveryActiveEnhanced {
				return "", &usageError{fmt.Sprintf("--mode %q: want %s or %s", mode, config.RecoveryActiveBasic, config.RecoveryActiveEnhanced)}
			}
			h.RecoveryMode = mode
			return "recovery mode set to " + mode, nil
		}, "mode", nil)
}

func newRetryCmd(a *app) *cobra.Command {
	var count int
	return a.settingCmd("retry",
		"Set how many times a failed member is retried (-1 unlimited, 0 off)",
		`  hactl hagroup retry --count -1
  hactl hagroup retry --count 0 --group signing
  hactl hagroup retry --show --group signing`,
		func(cmd *cobra.Command) {
			cmd.Flags().IntVar(&count, "count", 0, "recovery attempts: -1 without limit, 0 no auto-recovery")
		},
		func(h *config.HA) (string, error) {
			if count < -1 {
				return "", &usageError{fmt.Sprintf("--count %d: want -1 (unlimited), 0 (off) or a positive count", count)}
			}
			h.Retries = &count
			switch count {
			case -1:
				return "recovery retries set to unlimited", nil
			case 0:
				return "auto-recovery turned off (retries 0)", nil
			}
			return fmt.Sprintf("recovery retries set to %d", count), nil
		}, "count", func(s config.Settings, scope string) (string, any) {
			v := retryShow{SchemaVersion: agent.SchemaVersion, Scope: scope, Retries: s.Retries}
			switch {
			case s.Retries < 0:
				return scope + ": recovery retries unlimited", v
			case s.Retries == 0:
				return scope + ": auto-recovery off (retries 0)", v
			}
			return fmt.Sprintf("%s: recovery retries %d", scope, s.Retries), v
		})
}

func newIntervalCmd(a *app) *cobra.Command {
	var seconds int
	return a.settingCmd("interval",
		"Set the time between recovery attempts of a failed member",
		`  hactl hagroup interval --seconds 60
  hactl hagroup interval --show`,
		func(cmd *cobra.Command) {
			cmd.Flags().IntVar(&seconds, "seconds", 0, "seconds between recovery attempts (at least 1)")
		},
		func(h *config.HA) (string, error) {
			if seconds < 1 {
				return "", &usageError{fmt.Sprintf("--seconds %d: want at least 1", seconds)}
			}
			h.Interval = config.Duration(time.Duration(seconds) * time.Second)
			return fmt.Sprintf("recovery interval set to %ds", seconds), nil
		}, "seconds", func(s config.Settings, scope string) (string, any) {
			secs := int(s.Interval / time.Second)
			return fmt.Sprintf("%s: recovery interval %ds", scope, secs),
				intervalShow{SchemaVersion: agent.SchemaVersion, Scope: scope, IntervalSeconds: secs}
		})
}

// haOnlyResult is haonly --show's report.
type haOnlyResult struct {
	SchemaVersion int    `json:"schemaVersion"`
	Scope         string `json:"scope"`
	HAOnly        bool   `json:"haOnly"`
}

func newHAOnlyCmd(a *app) *cobra.Command {
	var enable, disable, show bool
	var group string
	cmd := &cobra.Command{
		Use:   "haonly",
		Short: "Show or set HA-only mode (list only virtual slots to applications)",
		Example: `  hactl hagroup haonly --show
  hactl hagroup haonly --enable`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if show {
				c, err := a.loadConfig()
				if err != nil {
					return err
				}
				var g *config.Group
				scope := "global"
				if group != "" {
					if g, err = groupOf(c, group, a.configPath()); err != nil {
						return err
					}
					scope = fmt.Sprintf("group %q", group)
				}
				on := c.Settings(g).Only
				return a.print(haOnlyResult{SchemaVersion: agent.SchemaVersion, Scope: scope, HAOnly: on}, func(w io.Writer) error {
					state := "disabled"
					if on {
						state = "enabled"
					}
					_, err := fmt.Fprintf(w, "%s: HA only %s\n", scope, state)
					return err
				})
			}
			return a.edit(cmd.Context(), func(c *config.Config) (string, error) {
				h, where, err := a.haTarget(c, group)
				if err != nil {
					return "", err
				}
				on := enable
				h.Only = &on
				if on {
					return where + ": HA only enabled (applications see only virtual slots)", nil
				}
				return where + ": HA only disabled (applications also see member slots)", nil
			})
		}),
	}
	cmd.Flags().BoolVar(&enable, "enable", false, "list only the virtual slots")
	cmd.Flags().BoolVar(&disable, "disable", false, "list member slots as well")
	cmd.Flags().BoolVar(&show, "show", false, "print the current setting")
	cmd.Flags().StringVar(&group, "group", "", "this group only (default: the global [ha] setting)")
	cmd.Flags().Bool("json", false, "print the result as JSON")
	cmd.MarkFlagsOneRequired("enable", "disable", "show")
	cmd.MarkFlagsMutuallyExclusive("enable", "disable", "show")
	return cmd
}
