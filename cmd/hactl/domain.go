package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/secret"
	hasync "github.com/hagroup/hagroup/pkg/sync"
	"github.com/spf13/cobra"
)

// domainResult is domain --install's report.
type domainResult struct {
	SchemaVersion int      `json:"schemaVersion"`
	Group         string   `json:"group"`
	Members       []string `json:"members"`
	Trusted       bool     `json:"trusted"`
}

func newDomainCmd(a *app) *cobra.Command {
	var group, soPINEnv, soPINFile string
	var install, untrusted, jsonOut bool
	cmd := &cobra.Command{
		Use:   "domain",
		Short: "Install a group's domain key on every member (the key ceremony)",
		Long: `Install the group's domain key: an AES-256 key with the same value on every
member, under which private and secret keys are wrapped to replicate them.
The value is generated in memory, installed on every member, its key check
value verified equal everywhere, and forgotten.

Where the token allows, the key is installed by the Security Officer as a
trusted key, so keys made through the group can be wrapped under it alone;
the SO PIN of each member is prompted for on a terminal, or read from
--so-pin-file / --so-pin-env (the same for every member). --untrusted skips
the SO step (an operator-made key).

Every member must wrap and unwrap with CKM_AES_KEY_WRAP_PAD, and a trusted
install sets the nested CKA_UNWRAP_TEMPLATE; otherwise nothing is installed
and the error names the member. A token reached through p11-kit 0.24's
p11-kit-client.so offers neither: serve it with hsmserve and name it as
module "hagroup-remote:unix:/path/of/socket".`,
		Example: `  hactl hagroup domain --group signing --install
  hactl hagroup domain --group signing --install --so-pin-env HSM_SO_PIN
  hactl hagroup domain --group signing --install --untrusted`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if !install {
				return &usageError{"domain: nothing to do (pass --install)"}
			}
			ctx := cmd.Context()
			cfg, err := a.loadConfig()
			if err != nil {
				return err
			}
			g, err := groupOf(cfg, group, a.configPath())
			if err != nil {
				return err
			}
			set := cfg.Settings(g)
			var common secret.PIN
			switch {
			case soPINFile != "":
				b, err := os.ReadFile(soPINFile)
				if err != nil {
					return fmt.Errorf("--so-pin-file: %w", err)
				}
				common = secret.NewPIN([]byte(strings.TrimRight(string(b), "\r\n")))
				clear(b)
			case soPINEnv != "":
				v, ok := os.LookupEnv(soPINEnv)
				if !ok || v == "" {
					return fmt.Errorf("--so-pin-env %s: the variable is not set", soPINEnv)
				}
				common = secret.PINFromString(v)
			}
			defer common.Zero()
			p := a.prompter(false, jsonOut)
			var targets []hasync.DomainTarget
			var names []string
			defer func() {
				for _, t := range targets {
					t.Slot.Close()
					t.SOPIN.Zero()
				}
			}()
			for _, m := range g.Members {
				pin, err := m.ReadPIN()
				if err != nil {
					return agent.NameMember(m.Name, err)
				}
				s, err := a.openSlot(ctx, agent.MemberSpec(m, set, pin))
				if err != nil {
					pin.Zero()
					return agent.NameMember(m.Name, err)
				}
				t := hasync.DomainTarget{Slot: s, UserPIN: pin}
				if !untrusted {
					if !common.Empty() {
						t.SOPIN = common.Clone()
					} else {
						so, err := p.Password(fmt.Sprintf("SO PIN of member %q (token %s)", m.Name, agent.TokenSelector(m)))
						if errors.Is(err, errNoTerminal) {
							s.Close()
							a.quietUsage = true
							return &usageError{"domain: the SO PIN is needed and there is no terminal to ask on: pass --so-pin-file, --so-pin-env or --untrusted"}
						}
						if err != nil {
							s.Close()
							return err
						}
						t.SOPIN = so
					}
				}
				targets = append(targets, t)
				names = append(names, m.Name)
			}
			if err := hasync.InstallDomainKey(ctx, targets, g.Serial); err != nil {
				return fmt.Errorf("group %q: %w%s", group, err, p11kitHint(g.Members, err))
			}
			res := domainResult{SchemaVersion: agent.SchemaVersion, Group: group, Members: names, Trusted: !untrusted}
			if jsonOut {
				return a.printJSON(res)
			}
			kind := "trusted"
			if untrusted {
				kind = "untrusted"
			}
			_, err = fmt.Fprintf(a.out, "group %q: %s domain key installed on %s; key check values match\n", group, kind, strings.Join(names, ", "))
			return err
		}),
	}
	cmd.Flags().StringVar(&group, "group", "", "the group")
	cmd.Flags().BoolVar(&install, "install", false, "generate and install the domain key")
	cmd.Flags().BoolVar(&untrusted, "untrusted", false, "install without the SO (no CKA_TRUSTED)")
	cmd.Flags().StringVar(&soPINFile, "so-pin-file", "", "file holding the SO PIN (same for every member)")
	cmd.Flags().StringVar(&soPINEnv, "so-pin-env", "", "environment variable holding the SO PIN (same for every member)")
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print the result as JSON")
	cmd.MarkFlagRequired("group")
	cmd.MarkFlagsMutuallyExclusive("untrusted", "so-pin-file", "so-pin-env")
	return cmd
}

// p11kitHint explains, after a failed ceremony, why members reached through
// p11-kit-client.so cannot take part, and what to use instead: p11-kit's
// RPC (0.24) carries neither CKM_AES_KEY_WRAP_PAD nor nested attributes
// such as the domain key's CKA_UNWRAP_TEMPLATE.
func p11kitHint(members []config.Member, err error) string {
	if !errors.Is(err, hasync.ErrMechanismUnavailable) {
		return ""
	}
	var names []string
	for _, m := range members {
		if filepath.Base(m.Module) == "p11-kit-client.so" {
			names = append(names, m.Name)
		}
	}
	if len(names) == 0 {
		return ""
	}
	return fmt.Sprintf(" (member %s is reached through p11-kit-client.so, whose RPC carries neither CKM_AES_KEY_WRAP_PAD nor nested attributes such as the domain key's CKA_UNWRAP_TEMPLATE: serve its token with hsmserve and use module = \"hagroup-remote:unix:/path/of/socket\")",
		strings.Join(names, ", "))
}
