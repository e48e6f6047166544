package main

import (
	"fmt"

	"github.com/hagroup/hagroup/pkg/agent/report"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/spf13/cobra"
)

// groupOf finds a group in c or says which groups there are.
func groupOf(c *config.Config, label, path string) (*config.Group, error) {
	g, ok := c.Group(label)
	if !ok {
		var ls []string
		for _, g := range c.Groups {
			ls = append(ls, g.Label)
		}
		return nil, fmt.Errorf("group %q is not in %s (groups there: %s)", label, path, report.OrNone(ls))
	}
	return g, nil
}

// loadGroup loads the configuration and finds the group labelled label
// in it.
func (a *app) loadGroup(label string) (*config.Config, *config.Group, error) {
	c, err := a.loadConfig()
	if err != nil {
		return nil, nil, err
	}
	g, err := groupOf(c, label, a.configPath())
	return c, g, err
}

// memberOf finds a member in g or says which members there are.
func memberOf(g *config.Group, name string) (*config.Member, error) {
	m, ok := g.Member(name)
	if !ok {
		var ns []string
		for _, m := range g.Members {
			ns = append(ns, m.Name)
		}
		return nil, fmt.Errorf("group %q has no member %q (members: %s)", g.Label, name, report.OrNone(ns))
	}
	return m, nil
}

func newAddMemberCmd(a *app) *cobra.Command {
	var mf memberFlags
	var group string
	var standby bool
	cmd := &cobra.Command{
		Use:   "addmember",
		Short: "Add a member token to an HA group",
		Long: `Add a member to an HA group. The token is opened (and logged into when a PIN
source is given) to check it first. A running haagent reloads, catches the
new member up with the group's objects and only then gives it work.

The check also tries which kinds of key the token can wrap and unwrap with
CKM_AES_KEY_WRAP_PAD (with throwaway session keys), and warns of each kind
it could not hold (--json: cannotHold): while it serves with another
member, the group makes no key of that kind and does not offer the
mechanisms that generate it. A token behind p11-kit 0.24 holds no private
or secret key; SoftHSM 2.6 holds no EdDSA private key.

A member of another make receives keys by a way its pair proved by a round
trip (hactl slot check shows them), under a key agreed for each copy, not
under the domain key. Moving a group to another make without downtime:
  1. hactl slot check --group G for each new token (exit 3: keys of some
     kinds will not move; the reasons say which);
  2. hactl hagroup addmember each new token: haagent catches it up and
     only then gives it work;
  3. hactl hagroup synchronize --group G, then --check: what is left is
     the keys that cannot move;
  4. hactl hagroup objects --group G: the keys the new members lack;
  5. hactl hagroup removemember each old member: the application keeps
     signing through the group with the keys that moved.
A key cannot move when no proven way carries its kind (an EC private key
into NSS softokn), when the application made it unextractable under a
trusted domain key (it may be wrapped under that key only, and a make
that keeps no wrap-only key, as NSS, holds none), or when it is not
extractable on its member. Such keys stay on the old members: the
keys_unholdable event and listgroups' cannotHold name the kind, a
catch-up and synchronize report them unreplicable, and hactl hagroup
objects lists the members that lack them. Remove the old members only
once nothing needs those keys.`,
		Example: `  hactl hagroup addmember --group signing --name hsm-b --token-label ha-b \
      --module /usr/lib/softhsm/libsofthsm2.so --pin-file /etc/hagroup/pin-b
  hactl hagroup addmember --group signing --name hsm-c --uri 'pkcs11:token=ha-c' \
      --module /usr/lib/x86_64-linux-gnu/pkcs11/p11-kit-client.so \
      --module-env P11_KIT_SERVER_ADDRESS=unix:path=/run/hsm-c.sock --pin-env HSM_C_PIN --standby`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			m, err := mf.member()
			if err != nil {
				return err
			}
			m.Standby = standby
			c, g, err := a.loadGroup(group)
			if err != nil {
				return err
			}
			if _, ok := g.Member(m.Name); ok {
				return fmt.Errorf("group %q already has a member %q", group, m.Name)
			}
			ctx := cmd.Context()
			var holds []holdLine
			if !mf.noCheck {
				if err := samePIN(m, g); err != nil {
					return err
				}
				if err := report.CheckToken(ctx, m, c.Settings(g), a.openSlot, a.tokenLister(m)); err != nil {
					return err
				}
				if holds, err = memberCannotHold(ctx, a, m, c.Settings(g)); err != nil {
					return err
				}
			}
			return a.editNoting(ctx, holds, func(c *config.Config) (string, error) {
				g, err := groupOf(c, group, a.configPath())
				if err != nil {
					return "", err
				}
				if _, ok := g.Member(m.Name); ok {
					return "", fmt.Errorf("group %q already has a member %q", group, m.Name)
				}
				g.Members = append(g.Members, m)
				role := "member"
				if standby {
					role = "standby member"
				}
				return fmt.Sprintf("%s %q added to group %q", role, m.Name, group), nil
			})
		}),
	}
	cmd.Flags().StringVar(&group, "group", "", "the group to add to")
	cmd.Flags().StringVar(&mf.name, "name", "", "the member's name, used in logs and metrics")
	cmd.Flags().BoolVar(&standby, "standby", false, "add it as a standby member")
	cmd.Flags().Bool("json", false, "print the result as JSON")
	cmd.MarkFlagRequired("group")
	cmd.MarkFlagRequired("name")
	mf.register(cmd)
	return cmd
}

func newRemoveMemberCmd(a *app) *cobra.Command {
	var group, name string
	var yes bool
	cmd := &cobra.Command{
		Use:   "removemember",
		Short: "Remove a member from an HA group",
		Long: `Remove a member from an HA group. A running haagent drains the member (lets
its in-flight operations finish) and stops using it; the objects stay on the
token.`,
		Example: `  hactl hagroup removemember --group signing --member hsm-b --yes`,
		Args:    noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			_, g, err := a.loadGroup(group)
			if err != nil {
				return err
			}
			if _, err := memberOf(g, name); err != nil {
				return err
			}
			if err := a.confirm(a.prompter(yes), fmt.Sprintf("remove member %q from group %q", name, group)); err != nil {
				return err
			}
			return a.edit(cmd.Context(), func(c *config.Config) (string, error) {
				g, err := groupOf(c, group, a.configPath())
				if err != nil {
					return "", err
				}
				if !g.RemoveMember(name) {
					return "", fmt.Errorf("group %q has no member %q", group, name)
				}
				return fmt.Sprintf("member %q removed from group %q", name, group), nil
			})
		}),
	}
	cmd.Flags().StringVar(&group, "group", "", "the member's group")
	cmd.Flags().StringVar(&name, "member", "", "the member to remove")
	cmd.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation")
	cmd.Flags().Bool("json", false, "print the result as JSON")
	cmd.MarkFlagRequired("group")
	cmd.MarkFlagRequired("member")
	return cmd
}

// newStandbyCmd builds addstandby (on) or removestandby (off).
func newStandbyCmd(a *app, on bool) *cobra.Command {
	var group, name string
	use, short, example := "addstandby", "Designate a member as standby (it takes work only when no active member is left)",
		`  hactl hagroup addstandby --group signing --member hsm-c`
	if !on {
		use, short, example = "removestandby", "Return a standby member to active service",
			`  hactl hagroup removestandby --group signing --member hsm-c`
	}
	cmd := &cobra.Command{
		Use:     use,
		Short:   short,
		Example: example,
		Args:    noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.edit(cmd.Context(), func(c *config.Config) (string, error) {
				g, err := groupOf(c, group, a.configPath())
				if err != nil {
					return "", err
				}
				m, err := memberOf(g, name)
				if err != nil {
					return "", err
				}
				if m.Standby == on {
					if on {
						return fmt.Sprintf("member %q of group %q is already a standby", name, group), nil
					}
					return fmt.Sprintf("member %q of group %q is already active", name, group), nil
				}
				m.Standby = on
				if on {
					return fmt.Sprintf("member %q of group %q is now a standby", name, group), nil
				}
				return fmt.Sprintf("member %q of group %q is now active", name, group), nil
			})
		}),
	}
	cmd.Flags().StringVar(&group, "group", "", "the member's group")
	cmd.Flags().StringVar(&name, "member", "", "the member")
	cmd.Flags().Bool("json", false, "print the result as JSON")
	cmd.MarkFlagRequired("group")
	cmd.MarkFlagRequired("member")
	return cmd
}

// samePIN checks that new's PIN source holds the user PIN the group's
// members hold (a group has one user PIN: the application proves it on one
// member, docs/DESIGN.md "Login"). Members whose source cannot be read
// here (a pin_env of another environment) are not compared.
func samePIN(m config.Member, g *config.Group) error {
	pin, err := m.ReadPIN()
	if err != nil || pin.Empty() {
		return nil // the token check names a source that cannot be read
	}
	defer pin.Zero()
	for _, o := range g.Members {
		other, err := o.ReadPIN()
		if err != nil || other.Empty() {
			continue
		}
		same := pin.Equal(other)
		other.Zero()
		if !same {
			return fmt.Errorf("member %q: its PIN source holds another user PIN than member %q's: every member of a group holds the same user PIN, the one applications present", m.Name, o.Name)
		}
	}
	return nil
}
