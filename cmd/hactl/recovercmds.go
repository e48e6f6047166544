package main

import (
	"errors"
	"fmt"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/spf13/cobra"
)

func newRecoverCmd(a *app) *cobra.Command {
	var group, member string
	var jsonOut bool
	cmd := &cobra.Command{
		Use:   "recover",
		Short: "Recover a group's failed members now (manual recovery)",
		Long: `Ask haagent to recover a group's failed members now, or one member: reopen
the token, log in, apply what was created and deleted while it was away, and
return it to service. haagent never runs two recoveries of one member at once,
so this is safe while auto-recovery is on.

A member whose token refused its PIN (CKR_PIN_INCORRECT, CKR_PIN_LOCKED,
CKR_PIN_EXPIRED) is PIN-blocked: no process sharing the state directory logs
it in or recovers it automatically, so a wrong pin_file cannot lock the HSM's
user out. Fix its pin_file or pin_env (or unlock the PIN on the HSM), then
recover it: this clears the mark and makes one attempt, with one C_Login.`,
		Example: `  hactl hagroup recover --group signing
  hactl hagroup recover --group signing --member hsm-b`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			c := a.client()
			defer c.Close()
			res, err := c.Recover(cmd.Context(), agent.RecoverRequest{Group: group, Member: member})
			if err != nil {
				return err
			}
			if jsonOut {
				err = a.printJSON(res)
			} else if len(res.Members) == 0 {
				_, err = fmt.Fprintf(a.out, "group %q has no failed member to recover\n", group)
			} else {
				err = renderTable(a.out, table(makeRecoverTable(res)))
			}
			if err != nil {
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
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print the result as JSON")
	cmd.MarkFlagRequired("group")
	return cmd
}

func newSynchronizeCmd(a *app) *cobra.Command {
	var group string
	var check, prune, yes, jsonOut bool
	cmd := &cobra.Command{
		Use:   "synchronize",
		Short: "Make every member of a group hold the same objects",
		Long: `Compare the objects on every member of a group and replicate what is missing,
honouring deletions recorded while a member was away. Two different keys
under one identity are reported as conflicts and never resolved by guessing.

--check only prints the differences and exits 3 when there are any: made for
cron. --prune destroys objects found on some members only instead of
replicating them (asks first; --yes for scripts).`,
		Example: `  hactl hagroup synchronize --group signing --check
  hactl hagroup synchronize --group signing
  hactl hagroup synchronize --group signing --prune --yes`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if prune {
				if err := a.confirm(a.prompter(yes, jsonOut), fmt.Sprintf("destroy the objects that only some members of %q hold", group)); err != nil {
					return err
				}
			}
			c := a.client()
			defer c.Close()
			res, err := c.Synchronize(cmd.Context(), agent.SyncRequest{Group: group, Check: check, Prune: prune})
			if err != nil {
				return err
			}
			if jsonOut {
				err = a.printJSON(res)
			} else {
				err = printSyncReport(a, res)
			}
			if err != nil {
				return err
			}
			switch {
			case check && !res.InSync:
				return &problemError{fmt.Sprintf("group %q is out of sync: %d difference(s)", group, len(res.Differences))}
			case res.Conflicts > 0:
				return &problemError{fmt.Sprintf("group %q has %d conflict(s) that need an operator", group, res.Conflicts)}
			}
			return nil
		}),
	}
	cmd.Flags().StringVar(&group, "group", "", "the group")
	cmd.Flags().BoolVar(&check, "check", false, "only print the differences; exit 3 when there are any")
	cmd.Flags().BoolVar(&prune, "prune", false, "destroy objects found on some members only instead of replicating them")
	cmd.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation")
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print the report as JSON")
	cmd.MarkFlagRequired("group")
	cmd.MarkFlagsMutuallyExclusive("check", "prune")
	return cmd
}

func printSyncReport(a *app, r agent.SyncReport) error {
	if len(r.Differences) > 0 {
		if err := renderTable(a.out, table(makeDiffTable(r))); err != nil {
			return err
		}
	}
	switch {
	case r.InSync && r.Checked:
		fmt.Fprintf(a.out, "group %q is in sync\n", r.Group)
	case r.Checked:
		fmt.Fprintf(a.out, "group %q is out of sync: %d difference(s)\n", r.Group, len(r.Differences))
	default:
		fmt.Fprintf(a.out, "group %q synchronised: %d change(s) applied, %d conflict(s)\n", r.Group, r.Applied, r.Conflicts)
	}
	return nil
}
