package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/spf13/cobra"
)

func newRecoverCmd(a *app) *cobra.Command {
	var group, member string
	cmd := &cobra.Command{
		Use:   "recover",
		Short: "Recover a group's failed members now (manual recovery)",
		Long: `Ask haagent to recover a group's failed members now, or one member: reopen
the token, log in, apply what was created and deleted while it was away, and
return it to service. haagent never runs two recoveries of one member at once,
so this is safe while auto-recovery is on. On a terminal (and without
--json), a bar on stderr shows the objects copied or deleted so far, of the
catch-up's total, and the member.

A member whose token refused its PIN (CKR_PIN_INCORRECT, CKR_PIN_LOCKED,
CKR_PIN_EXPIRED) is PIN-blocked: no process sharing the state directory logs
it in or recovers it automatically, so a wrong pin_file cannot lock the HSM's
user out. Fix its pin_file or pin_env (or unlock the PIN on the HSM), then
recover it: this clears the mark and makes one attempt, with one C_Login.`,
		Example: `  hactl hagroup recover --group signing
  hactl hagroup recover --group signing --member hsm-b`,
		Args:        noArgs,
		Annotations: map[string]string{annotUsesAgent: "true"},
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			c := a.client()
			defer c.Close()
			req := agent.RecoverRequest{Group: group, Member: member}
			show, end := a.progress(false)
			res, err := c.Recover(cmd.Context(), req, show)
			end()
			if err != nil {
				return err
			}
			if err := a.print(res, func(w io.Writer) error {
				if len(res.Members) == 0 {
					_, err := fmt.Fprintf(w, "group %q has no failed member to recover\n", group)
					return err
				}
				return renderTable(w, table(makeRecoverTable(res)))
			}); err != nil {
				return err
			}
			if res.Failed() {
				return errors.New("recovery failed for at least one member (see DETAIL)")
			}
			return nil
		}),
	}
	cmd.Flags().StringVar(&group, "group", "", "the group")
	cmd.Flags().StringVar(&member, "member", "", "only this member (default: every failed member)")
	cmd.Flags().Bool("json", false, "print the result as JSON")
	cmd.MarkFlagRequired("group")
	return cmd
}

func newSynchronizeCmd(a *app) *cobra.Command {
	var group string
	var check, prune, yes bool
	cmd := &cobra.Command{
		Use:   "synchronize",
		Short: "Make every member of a group hold the same objects",
		Long: `Compare the objects on every member of a group and replicate what is missing,
honouring deletions recorded while a member was away. Two different keys
under one identity are reported as conflicts and never resolved by guessing.

--check only prints the differences and exits 3 when there are any, or
while a tombstone stall (see listgroups) is unresolved: made for cron. A
synchronisation that ends with no failure and no conflict resolves the stall. --prune destroys objects found on some members only instead of
replicating them (asks first; --yes for scripts).

The last line sums it up: changes applied, failed and conflicts (the JSON has
applied, failed and conflicts). Exits 6 when an action failed (each is a
"failed" row, with its cause), else 3 when conflicts remain. On a terminal
(and without --json or --check), a bar on stderr shows the objects done so
far, of the plan's total, and the member they go to.`,
		Example: `  hactl hagroup synchronize --group signing --check
  hactl hagroup synchronize --group signing
  hactl hagroup synchronize --group signing --prune --yes`,
		Args:        noArgs,
		Annotations: map[string]string{annotUsesAgent: "true"},
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if prune {
				if err := a.confirm(a.prompter(yes), fmt.Sprintf("destroy the objects that only some members of %q hold", group)); err != nil {
					return err
				}
			}
			c := a.client()
			defer c.Close()
			req := agent.SyncRequest{Group: group, Check: check, Prune: prune}
			show, end := a.progress(check)
			res, err := c.Synchronize(cmd.Context(), req, show)
			end()
			if err != nil {
				return err
			}
			if err := a.print(res, func(w io.Writer) error { return printSyncReport(w, res) }); err != nil {
				return err
			}
			return syncOutcome(res, !a.jsonOut())
		}),
	}
	cmd.Flags().StringVar(&group, "group", "", "the group")
	cmd.Flags().BoolVar(&check, "check", false, "only print the differences; exit 3 when there are any")
	cmd.Flags().BoolVar(&prune, "prune", false, "destroy objects found on some members only instead of replicating them")
	cmd.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation")
	cmd.Flags().Bool("json", false, "print the report as JSON")
	cmd.MarkFlagRequired("group")
	cmd.MarkFlagsMutuallyExclusive("check", "prune")
	return cmd
}

func printSyncReport(w io.Writer, r agent.SyncReport) error {
	if len(r.Differences) > 0 {
		if err := renderTable(w, table(makeDiffTable(r))); err != nil {
			return err
		}
	}
	if r.TombstoneStall != nil {
		if _, err := fmt.Fprintln(w, stallLine(*r.TombstoneStall, r.Group)); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintln(w, syncSummary(r))
	return err
}

// stallLine says what an unresolved tombstone stall is and what resolves
// it.
func stallLine(s agent.TombstoneStall, group string) string {
	who := s.Program
	if s.PID != 0 {
		who = fmt.Sprintf("%s[%d]", who, s.PID)
	}
	if s.Host != "" {
		who += " on " + s.Host
	}
	if who == "" {
		who = "haagent"
	}
	return fmt.Sprintf("tombstone register stall at %s (member %s, %s): %s; unresolved until hactl hagroup synchronize --group %s",
		s.Time.Format(time.RFC3339), dash(s.Member), who, dash(s.Detail), group)
}

// syncSummary is the one line that sums a synchronisation up.
func syncSummary(r agent.SyncReport) string {
	switch {
	case r.InSync && r.Checked:
		return fmt.Sprintf("group %q is in sync", r.Group)
	case r.Checked:
		return fmt.Sprintf("group %q is out of sync: %d difference(s)", r.Group, len(r.Differences))
	}
	return fmt.Sprintf("group %q synchronised: %d change(s) applied, %d failed, %d conflict(s)", r.Group, r.Applied, r.Failed, r.Conflicts)
}

// syncOutcome is the error (and so the exit code) of a synchronisation:
// failed copies (6) before conflicts and differences found by a check
// (3). shown says the summary is already printed with the report.
func syncOutcome(r agent.SyncReport, shown bool) error {
	switch {
	case r.Failed > 0:
		return &failedError{msg: syncSummary(r), shown: shown}
	case r.Checked && !r.InSync:
		return &problemError{msg: syncSummary(r), shown: shown}
	case r.Checked && r.TombstoneStall != nil:
		return &problemError{msg: stallLine(*r.TombstoneStall, r.Group), shown: shown}
	case r.Conflicts > 0:
		return &problemError{msg: syncSummary(r), shown: shown}
	}
	return nil
}
