package main

import (
	"github.com/spf13/cobra"
)

func newCompletionCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "completion",
		Short: "Print a shell completion script",
		Example: `  source <(hactl completion bash)
  hactl completion zsh > "${fpath[1]}/_hactl"`,
		Args: noArgs,
		RunE: needSubcommand,
	}
	shells := []struct {
		name, example string
		gen           func(root *cobra.Command) error
	}{
		{"bash", `  source <(hactl completion bash)`, func(r *cobra.Command) error { return r.GenBashCompletionV2(a.out, true) }},
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
