package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/agent/report"
	"github.com/spf13/cobra"
)

func newListGroupsCmd(a *app) *cobra.Command {
	var group string
	var check bool
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
configuration and opens every member token itself, and says so. A degraded
group (a member down or out of sync, or a tombstone stall not yet resolved)
is summed up in one line after the tables (on stderr with --json), and
listgroups exits 3.

TOMBSTONE STALL is a writer of the members' tombstone registers that stalled
in mid-write past the fold protocol's margin (a paused VM, a suspended host):
its records were written again, and "hactl hagroup synchronize" (not
--check) re-applies every tombstone on every member and clears it.

NEEDS SYNC comes from a comparison of the members by the rule synchronize
--check applies, and "compared" says how long ago it was made. haagent
compares each group at start, every recovery interval (10s at least), and
soon after anything that can change what the members hold (its own
recoveries and synchronisations, a member failing, what applications report
to it); listgroups shows that comparison, and compares again first when it
is older than three periods, so no answer rests on an older one. A
difference made behind haagent's back (a tool writing to a member directly)
shows at the next comparison; --check compares the members now (as
synchronize --check does) and fails when haagent is not running. Without
haagent, hactl logs the members in with their own PIN sources to compare
them now (it recovers nothing). A group that cannot be compared (no PIN
source, no member up) needs synchronisation.`,
		Example: `  hactl hagroup listgroups
  hactl hagroup listgroups --group signing --json
  hactl hagroup listgroups --check`,
		Args:        noArgs,
		Annotations: map[string]string{annotUsesAgent: "true"},
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			c := a.client()
			defer c.Close()
			list := c.ListGroups
			if check {
				list = c.CompareGroups
			}
			rep, err := list(ctx, group)
			source, unreachable := "haagent at "+c.Path(), error(nil)
			if agent.IsUnreachable(err) {
				unreachable = err
				cfg, cerr := a.loadConfig()
				if cerr != nil {
					return cerr
				}
				rep, err = report.ProbeReport(ctx, cfg, group, a.openSlot)
				if err == nil {
					compareLocal(ctx, cfg, &rep)
				}
				source = fmt.Sprintf("%s and its tokens (haagent is not running at %s)", cfg.Path, c.Path())
			}
			if err == nil && check && unreachable != nil {
				return fmt.Errorf("--check compares the members through haagent: %w", unreachable)
			}
			if err != nil {
				return err
			}
			if err := a.print(rep, func(w io.Writer) error { return printGroupsReport(w, rep, source) }); err != nil || !rep.Degraded() {
				return err
			}
			return &problemError{msg: degradedSummary(rep), shown: !a.jsonOut()}
		}),
	}
	cmd.Flags().StringVar(&group, "group", "", "show only this group")
	cmd.Flags().Bool("json", false, "print the report as JSON")
	cmd.Flags().BoolVar(&check, "check", false, "have haagent compare the members now (fail when it is not running); exit 3 when one differs")
	return cmd
}

func printGroupsReport(w io.Writer, rep agent.GroupsReport, source string) error {
	fmt.Fprintf(w, "Source: %s\n\n", source)
	if err := renderTable(w, table(makeSettingsTable(rep.Global))); err != nil {
		return err
	}
	if len(rep.Groups) == 0 {
		fmt.Fprintln(w, "\nNo groups configured.")
	}
	for _, g := range rep.Groups {
		fmt.Fprintln(w)
		if err := renderTable(w, table(makeGroupTable(g))); err != nil {
			return err
		}
		fmt.Fprintln(w)
		if err := renderTable(w, table(makeMembersTable(g))); err != nil {
			return err
		}
	}
	if rep.Degraded() {
		fmt.Fprintf(w, "\n%s\n", degradedSummary(rep))
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
		if g.TombstoneStall != nil {
			parts = append(parts, fmt.Sprintf("group %q: %s", g.Label, stallLine(*g.TombstoneStall, g.Label)))
		}
	}
	return strings.Join(parts, "; ")
}
