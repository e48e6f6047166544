package main

import (
	"fmt"

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
	cmd.AddCommand(newAgentStatusCmd(a), newAgentReloadCmd(a))
	return cmd
}

func newAgentStatusCmd(a *app) *cobra.Command {
	var jsonOut bool
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
			if jsonOut {
				return a.printJSON(st)
			}
			return renderTable(a.out, table(makeStatusTable(st, version)))
		}),
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print the status as JSON")
	return cmd
}

func newAgentReloadCmd(a *app) *cobra.Command {
	var jsonOut bool
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
			if jsonOut {
				return a.printJSON(res)
			}
			fmt.Fprintf(a.out, "haagent reloaded %s\n", res.ConfigPath)
			for _, ch := range res.Changes {
				fmt.Fprintln(a.out, "  "+ch)
			}
			if len(res.Changes) == 0 {
				fmt.Fprintln(a.out, "  no changes")
			}
			return nil
		}),
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print the result as JSON")
	return cmd
}
