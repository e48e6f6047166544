package main

import (
	"errors"
	"fmt"
	"math"
	"os/user"
	"strconv"
	"strings"

	"github.com/hagroup/hagroup/pkg/agent/report"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/spf13/cobra"
)

// memberFlags are the flags that describe a member token, shared by
// creategroup and addmember.
type memberFlags struct {
	name        string
	tokenLabel  string
	tokenSerial string
	uri         string
	module      string
	env         []string
	initArgs    string
	pinFile     string
	pinEnv      string
	serverUser  string
	noCheck     bool
}

func (f *memberFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.tokenLabel, "token-label", "", "the member token's label")
	fl.StringVar(&f.tokenSerial, "token-serial", "", "the member token's serial number")
	fl.StringVar(&f.uri, "uri", "", "the member token as an RFC 7512 pkcs11: URI")
	fl.StringVar(&f.module, "module", "", "path of the PKCS#11 module that offers the token")
	fl.StringArrayVar(&f.env, "module-env", nil, "KEY=VALUE set while loading the module (repeatable; gives the member its own module context)")
	fl.StringVar(&f.initArgs, "init-args", "", "the pReserved string of the module's C_Initialize, which NSS softokn needs (configdir='sql:DIR' …); never a PIN")
	fl.StringVar(&f.pinFile, "pin-file", "", "file holding the user PIN (never a PIN on the command line)")
	fl.StringVar(&f.pinEnv, "pin-env", "", "environment variable holding the user PIN")
	fl.StringVar(&f.serverUser, "server-uid", "", "for a module hagroup-remote:unix:PATH: the user (name or uid) hsmserve must run as (default: the user of each process using the group)")
	fl.BoolVar(&f.noCheck, "no-check", false, "do not open the token to check it (it is not reachable from here)")
	cmd.MarkFlagsOneRequired("token-label", "token-serial", "uri")
	cmd.MarkFlagsMutuallyExclusive("token-label", "token-serial", "uri")
	cmd.MarkFlagsMutuallyExclusive("pin-file", "pin-env")
	cmd.MarkFlagRequired("module")
}

// member builds the config member the flags describe.
func (f *memberFlags) member() (config.Member, error) {
	m := config.Member{Name: f.name, Module: f.module, TokenLabel: f.tokenLabel, TokenSerial: f.tokenSerial,
		URI: f.uri, PINFile: f.pinFile, PINEnv: f.pinEnv, InitArgs: f.initArgs}
	if f.serverUser != "" {
		uid, err := lookupUID(f.serverUser)
		if err != nil {
			return m, &usageError{fmt.Sprintf("--server-uid %q: %v", f.serverUser, err)}
		}
		m.ServerUID = &uid
	}
	for _, kv := range f.env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return m, &usageError{fmt.Sprintf("--module-env %q: want KEY=VALUE", kv)}
		}
		if m.ModuleEnv == nil {
			m.ModuleEnv = map[string]string{}
		}
		if _, dup := m.ModuleEnv[k]; dup {
			return m, &usageError{fmt.Sprintf("--module-env %s given twice", k)}
		}
		m.ModuleEnv[k] = v
	}
	return m, nil
}

// defaultMemberName names a member after its token when no --name is given.
func defaultMemberName(f *memberFlags) string {
	switch {
	case f.tokenLabel != "":
		return f.tokenLabel
	case f.tokenSerial != "":
		return "serial-" + f.tokenSerial
	default:
		return "member-1"
	}
}

func newCreateGroupCmd(a *app) *cobra.Command {
	var mf memberFlags
	var label, serial string
	cmd := &cobra.Command{
		Use:   "creategroup",
		Short: "Create an HA group with its first (primary) member",
		Long: `Create an HA group in the configuration with its first member, which is the
group's primary: new keys are made there first. The virtual slot serial is
assigned unless --serial is given. The member's token is opened (and logged
into when a PIN source is given) to check it before anything is written.`,
		Example: `  hactl hagroup creategroup --label signing --name hsm-a --token-label ha-a \
      --module /usr/lib/softhsm/libsofthsm2.so --pin-file /etc/hagroup/pin-a`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if mf.name == "" {
				mf.name = defaultMemberName(&mf)
			}
			m, err := mf.member()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if !mf.noCheck {
				if err := report.CheckToken(ctx, m, config.Defaults(), a.openSlot, a.tokenLister(m)); err != nil {
					return err
				}
			}
			return a.edit(ctx, func(c *config.Config) (string, error) {
				if _, ok := c.Group(label); ok {
					return "", fmt.Errorf("group %q already exists in %s", label, a.configPath())
				}
				s := serial
				if s == "" {
					s = c.NextSerial()
				}
				c.Groups = append(c.Groups, config.Group{Label: label, Serial: s, Members: []config.Member{m}})
				return fmt.Sprintf("group %q created: serial %s, primary member %q", label, s, m.Name), nil
			})
		}),
	}
	cmd.Flags().StringVar(&label, "label", "", "the group's label (its virtual token label)")
	cmd.Flags().StringVar(&mf.name, "name", "", "the first member's name (default: the token label)")
	cmd.Flags().StringVar(&serial, "serial", "", "the virtual slot serial (default: the next free one)")
	cmd.Flags().Bool("json", false, "print the result as JSON")
	cmd.MarkFlagRequired("label")
	mf.register(cmd)
	return cmd
}

func newDeleteGroupCmd(a *app) *cobra.Command {
	var label string
	var yes bool
	cmd := &cobra.Command{
		Use:     "deletegroup",
		Short:   "Remove an HA group from the configuration (objects stay on the tokens)",
		Example: `  hactl hagroup deletegroup --label signing --yes`,
		Args:    noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			c, err := a.loadConfig()
			if err != nil {
				return err
			}
			if _, ok := c.Group(label); !ok {
				return fmt.Errorf("group %q is not in %s", label, a.configPath())
			}
			if err := a.confirm(a.prompter(yes), fmt.Sprintf("delete group %q from %s", label, a.configPath())); err != nil {
				return err
			}
			return a.edit(cmd.Context(), func(c *config.Config) (string, error) {
				if !c.RemoveGroup(label) {
					return "", fmt.Errorf("group %q is not in %s", label, a.configPath())
				}
				return fmt.Sprintf("group %q deleted (its objects stay on the member tokens)", label), nil
			})
		}),
	}
	cmd.Flags().StringVar(&label, "label", "", "the group to delete")
	cmd.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation")
	cmd.Flags().Bool("json", false, "print the result as JSON")
	cmd.MarkFlagRequired("label")
	return cmd
}

// lookupUID is the uid of a user given by name or number.
func lookupUID(s string) (int64, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 0 || n > math.MaxUint32 {
			return 0, errors.New("not a user ID")
		}
		return n, nil
	}
	u, err := user.Lookup(s)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(u.Uid, 10, 64)
}
