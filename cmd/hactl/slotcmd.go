package main

import (
	"fmt"
	"io"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/spf13/cobra"
)

func newSlotCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "slot",
		Short:   "Inspect the physical tokens PKCS#11 modules offer",
		Example: `  hactl slot list --module /usr/lib/softhsm/libsofthsm2.so`,
		Args:    noArgs,
		RunE:    needSubcommand,
	}
	cmd.AddCommand(newSlotListCmd(a), newSlotCheckCmd(a))
	return cmd
}

// tokensResult is slot list's --json output.
type tokensResult struct {
	SchemaVersion int         `json:"schemaVersion"`
	Module        string      `json:"module"`
	Tokens        []tokenJSON `json:"tokens"`
}

// tokenJSON is one token in slot list's --json output.
type tokenJSON struct {
	SlotID       uint   `json:"slotId"`
	Label        string `json:"label"`
	Serial       string `json:"serial"`
	Manufacturer string `json:"manufacturer"`
	Model        string `json:"model"`
	Flags        uint   `json:"flags"`
	Initialized  bool   `json:"initialized"`
}

func newSlotListCmd(a *app) *cobra.Command {
	var mf memberFlags
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the tokens a PKCS#11 module offers (to build groups from)",
		Example: `  hactl slot list --module /usr/lib/softhsm/libsofthsm2.so
  hactl slot list --module /usr/lib/x86_64-linux-gnu/pkcs11/p11-kit-client.so \
      --module-env P11_KIT_SERVER_ADDRESS=unix:path=/run/hsm-b.sock --json
  hactl slot list --module /usr/lib/x86_64-linux-gnu/libsoftokn3.so \
      --init-args "configdir='sql:/var/lib/hagroup/nss-a' certPrefix='' keyPrefix='' secmod='secmod.db'"`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			m, err := mf.member()
			if err != nil {
				return err
			}
			ts, err := a.listTokens(cmd.Context(), slot.ModuleRef{Path: m.Module, Env: m.ModuleEnv, InitArgs: m.InitArgs})
			if err != nil {
				return fmt.Errorf("listing tokens of %s: %w", m.Module, err)
			}
			if ts == nil {
				ts = []slot.TokenSummary{}
			}
			res := tokensResult{SchemaVersion: agent.SchemaVersion, Module: m.Module, Tokens: []tokenJSON{}}
			for _, t := range ts {
				res.Tokens = append(res.Tokens, tokenJSON{t.SlotID, t.Label, t.Serial, t.Manufacturer, t.Model, t.Flags, t.Initialized})
			}
			return a.print(res, func(w io.Writer) error {
				if len(ts) == 0 {
					_, err := fmt.Fprintf(w, "%s offers no tokens\n", m.Module)
					return err
				}
				return renderTable(w, table(makeTokensTable(ts)))
			})
		}),
	}
	cmd.Flags().StringVar(&mf.module, "module", "", "path of the PKCS#11 module")
	cmd.Flags().StringArrayVar(&mf.env, "module-env", nil, "KEY=VALUE set while loading the module (repeatable)")
	cmd.Flags().StringVar(&mf.initArgs, "init-args", "", "the pReserved string of the module's C_Initialize, which NSS softokn needs (configdir='sql:DIR' …); never a PIN")
	cmd.Flags().Bool("json", false, "print the tokens as JSON")
	cmd.MarkFlagRequired("module")
	return cmd
}
