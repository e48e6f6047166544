package main

import (
	"io"
	"slices"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/spf13/cobra"
)

func newCompletionCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "completion",
		Short: "Print a shell completion script",
		Long: `Print a shell completion script. Flag values are completed from the
configuration (--group, --member, deletegroup's --label) and from their fixed
choices (--mode). The bash script needs the bash-completion package.`,
		Example: `  source <(hactl completion bash)
  hactl completion zsh > "${fpath[1]}/_hactl"`,
		Args: noArgs,
		RunE: needSubcommand,
	}
	shells := []struct {
		name, example string
		gen           func(root *cobra.Command) error
	}{
		{"bash", `  source <(hactl completion bash)`, func(r *cobra.Command) error { return genBash(r, a.out) }},
		{"zsh", `  hactl completion zsh > "${fpath[1]}/_hactl"`, func(r *cobra.Command) error { return r.GenZshCompletion(a.out) }},
		{"fish", `  hactl completion fish > ~/.config/fish/completions/hactl.fish`, func(r *cobra.Command) error { return r.GenFishCompletion(a.out, true) }},
		{"powershell", `  hactl completion powershell | Out-String | Invoke-Expression`, func(r *cobra.Command) error { return r.GenPowerShellCompletionWithDesc(a.out) }},
	}
	for _, sh := range shells {
		cmd.AddCommand(&cobra.Command{
			Use:     sh.name,
			Short:   "Print the " + sh.name + " completion script",
			Example: sh.example,
			Args:    noArgs,
			RunE: runE(func(c *cobra.Command, _ []string) error {
				return sh.gen(c.Root())
			}),
		})
	}
	return cmd
}

// bashNeedsBashCompletion replaces the script's fallback for shells without
// the bash-completion package, which would fail on every TAB with
// "_get_comp_words_by_ref: command not found", by one that says what is
// missing. With bash-completion loaded the script uses _init_completion and
// never calls it.
const bashNeedsBashCompletion = `
# hactl: without the bash-completion package, say what is missing.
__hactl_init_completion()
{
    if ! declare -F _get_comp_words_by_ref >/dev/null 2>&1; then
        printf '\nhactl: completion needs the bash-completion package (apt install bash-completion)\n' >&2
        return 1
    fi
    COMPREPLY=()
    _get_comp_words_by_ref "$@" cur prev words cword
}
`

// genBash writes cobra's bash script with the fallback above.
func genBash(root *cobra.Command, w io.Writer) error {
	if err := root.GenBashCompletionV2(w, true); err != nil {
		return err
	}
	_, err := io.WriteString(w, bashNeedsBashCompletion)
	return err
}

// flagChoices are the fixed values of enumerated flags, by command name and
// flag.
var flagChoices = map[[2]string][]string{
	{"recoverymode", "mode"}: {config.RecoveryActiveBasic, config.RecoveryActiveEnhanced},
}

// registerValueCompletions gives every command's flags their value
// completions, by flag name, so a command added later gets them too:
// --group and deletegroup's --label complete the configuration's group
// labels, --member the members (of --group when given), --module files
// ending in .so, and flagChoices their values.
func registerValueCompletions(root *cobra.Command, a *app) {
	walkCommands(root, func(c *cobra.Command) {
		completers := map[string]cobra.CompletionFunc{
			"group":  a.completeGroups,
			"member": a.completeMembers,
			"module": func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
				return []string{"so"}, cobra.ShellCompDirectiveFilterFileExt
			},
		}
		if c.Name() != "creategroup" { // there --label names a new group
			completers["label"] = a.completeGroups
		}
		for key, values := range flagChoices {
			if key[0] == c.Name() {
				completers[key[1]] = cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp)
			}
		}
		for name, fn := range completers {
			if c.LocalFlags().Lookup(name) == nil {
				continue
			}
			if _, done := c.GetFlagCompletionFunc(name); done {
				continue // the command chose its own
			}
			c.RegisterFlagCompletionFunc(name, fn)
		}
	})
}

func walkCommands(c *cobra.Command, fn func(*cobra.Command)) {
	fn(c)
	for _, sub := range c.Commands() {
		walkCommands(sub, fn)
	}
}

// completionConfig reads the configuration hactl would use, leniently: a
// file with a validation problem still completes the names it holds. Nil
// when it cannot be read.
func (a *app) completionConfig() *config.Config {
	var cfg config.Config
	if _, err := toml.DecodeFile(config.ResolvePath(a.configFlag), &cfg); err != nil {
		return nil
	}
	return &cfg
}

func (a *app) completeGroups(_ *cobra.Command, _ []string, prefix string) ([]string, cobra.ShellCompDirective) {
	var labels []string
	if cfg := a.completionConfig(); cfg != nil {
		for _, g := range cfg.Groups {
			if strings.HasPrefix(g.Label, prefix) {
				labels = append(labels, g.Label)
			}
		}
	}
	return labels, cobra.ShellCompDirectiveNoFileComp
}

func (a *app) completeMembers(cmd *cobra.Command, _ []string, prefix string) ([]string, cobra.ShellCompDirective) {
	group, _ := cmd.Flags().GetString("group")
	var names []string
	if cfg := a.completionConfig(); cfg != nil {
		for _, g := range cfg.Groups {
			if group != "" && g.Label != group {
				continue
			}
			for _, m := range g.Members {
				if strings.HasPrefix(m.Name, prefix) && !slices.Contains(names, m.Name) {
					names = append(names, m.Name)
				}
			}
		}
	}
	return names, cobra.ShellCompDirectiveNoFileComp
}
