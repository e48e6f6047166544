package main

import (
	"github.com/spf13/cobra"
)

func newHagroupCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "hagroup",
		Short: "Create, change and watch HA groups (LunaCM's hagroup commands)",
		Example: `  hactl hagroup listgroups
  hactl hagroup addmember --group signing --name hsm-b --token-label ha-b --module /usr/lib/softhsm/libsofthsm2.so --pin-file /etc/hagroup/pin-b`,
		Args: noArgs,
		RunE: needSubcommand,
	}
	cmd.AddCommand(
		newCreateGroupCmd(a),
		newDeleteGroupCmd(a),
		newAddMemberCmd(a),
		newRemoveMemberCmd(a),
		newStandbyCmd(a, true),
		newStandbyCmd(a, false),
		newListGroupsCmd(a),
		newRecoverCmd(a),
		newSynchronizeCmd(a),
		newRecoveryModeCmd(a),
		newRetryCmd(a),
		newIntervalCmd(a),
		newHAOnlyCmd(a),
		newHALogCmd(a),
		newClientsCmd(a),
		newDomainCmd(a),
		newObjectsCmd(a),
	)
	return cmd
}
