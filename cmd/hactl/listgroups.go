package main

import (
	"fmt"
	"strings"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/spf13/cobra"
)

func newListGroupsCmd(a *app) *cobra.Command {
	var group string
	var jsonOut bool
	cmd := &cobra.Command{
		Use:   "listgroups",
		Short: "Show the HA groups, their members and their health",
		Long: `Show the global HA settings, then for each group its label, serial, policy,
members with their state, last error, operations in flight and done, the
automatic recovery attempts left, whether each needs synchronisation (and
how many objects it lacks or holds in excess), the members that need
synchronisation and the standby members. --json adds, per member, since
when it is in its state, the recovery attempts made, the last and next
attempt and why the last failed, whether recovery gave up, when it was last
checked, its conflicts, the keys it could not receive and the mechanisms it
lacks.

A member whose token refused its PIN shows "0 (PIN refused)" as its attempts
left (pinBlocked and pinBlockedReason in --json): nothing logs it in again
until "hactl hagroup recover" for it.

OPS and FAILURES are the agent's own; APP OPS and APP FAILURES sum what every
application running the group reports to haagent (libhapkcs11.so, Go
programs on pkg/ha), CLIENTS is how many report the member now (hactl
hagroup clients lists them).

The states come from haagent when it runs; otherwise hactl reads the
configuration and opens every member token itself (without logging in), and
says so. Exits 3 when a group is degraded (a member down or out of sync).`,
		Example: `  hactl hagroup listgroups
  hactl hagroup listgroups --group signing --json`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			c := a.client()
			defer c.Close()
			rep, err := c.ListGroups(ctx, group)
			source := "haagent at " + c.Path()
			if agent.IsUnreachable(err) {
				cfg, cerr := a.loadConfig()
				if cerr != nil {
					return cerr
				}
				rep, err = agent.ProbeReport(ctx, cfg, group, a.openSlot)
				source = fmt.Sprintf("%s and its tokens (haagent is not running at %s)", cfg.Path, c.Path())
			}
			if err != nil {
				return err
			}
			if jsonOut {
				if err := a.printJSON(rep); err != nil {
					return err
				}
			} else if err := printGroupsReport(a, rep, source); err != nil {
				return err
			}
			if rep.Degraded() {
				return &problemError{degradedSummary(rep)}
			}
			return nil
		}),
	}
	cmd.Flags().StringVar(&group, "group", "", "show only this group")
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print the report as JSON")
	return cmd
}

func printGroupsReport(a *app, rep agent.GroupsReport, source string) error {
	fmt.Fprintf(a.out, "Source: %s\n\n", source)
	if err := renderTable(a.out, table(makeSettingsTable(rep.Global))); err != nil {
		return err
	}
	if len(rep.Groups) == 0 {
		fmt.Fprintln(a.out, "\nNo groups configured.")
	}
	for _, g := range rep.Groups {
		fmt.Fprintln(a.out)
		if err := renderTable(a.out, table(makeGroupTable(g))); err != nil {
			return err
		}
		fmt.Fprintln(a.out)
		if err := renderTable(a.out, table(makeMembersTable(g))); err != nil {
			return err
		}
	}
	return nil
}

// degradedSummary names what is wrong, for the exit-3 message.
func degradedSummary(rep agent.GroupsReport) string {
	var parts []string
	for _, g := range rep.Groups {
		var down []string
		for _, m := range g.Members {
			if !m.Standby && m.State != agent.StateActive && m.State != agent.StateUp {
				down = append(down, fmt.Sprintf("%s %s", m.Name, m.State))
			}
		}
		switch {
		case len(down) > 0:
			parts = append(parts, fmt.Sprintf("group %q is degraded: %s", g.Label, strings.Join(down, ", ")))
		case len(g.NeedsSync) > 0:
			parts = append(parts, fmt.Sprintf("group %q needs synchronisation: %s", g.Label, strings.Join(g.NeedsSync, ", ")))
		case !g.Healthy:
			parts = append(parts, fmt.Sprintf("group %q is degraded", g.Label))
		}
	}
	return strings.Join(parts, "; ")
}
