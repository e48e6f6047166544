package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/BurntSushi/toml"
	buildversion "github.com/hagroup/hagroup/internal/version"
	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// version is this build's version, as every hagroup binary reports it.
var version = buildversion.String()

// app is what every command shares: standard streams, the global flags and
// the seams tests replace (through fields, never package variables).
type app struct {
	in          io.Reader
	out, errOut io.Writer

	configFlag string
	socketFlag string

	// isTerminal reports whether stdin and stdout are a terminal.
	isTerminal func() bool
	// newPrompter makes the interactive prompter; used only on a terminal.
	newPrompter func() Prompter
	// listTokens and openSlot reach real tokens.
	listTokens func(ctx context.Context, ref slot.ModuleRef) ([]slot.TokenSummary, error)
	openSlot   func(ctx context.Context, spec slot.Spec) (*slot.Slot, error)

	// printer renders results: chosen once per run (choosePrinter).
	printer printer

	// quietUsage suppresses the "Run --help" hint (set by commands whose
	// usage errors are self-explanatory, such as a refused prompt).
	quietUsage bool
}

func newApp(in io.Reader, out, errOut io.Writer) *app {
	a := &app{in: in, out: out, errOut: errOut, listTokens: slot.ListModuleTokens, openSlot: slot.Open, printer: textPrinter{}}
	a.isTerminal = func() bool {
		fi, ok := in.(*os.File)
		fo, ok2 := out.(*os.File)
		return ok && ok2 && term.IsTerminal(int(fi.Fd())) && term.IsTerminal(int(fo.Fd()))
	}
	a.newPrompter = func() Prompter { return newSurveyPrompter(in, out, errOut) }
	return a
}

func newRootCmd(a *app) *cobra.Command {
	root := &cobra.Command{
		Use:   "hactl",
		Short: "Operate hagroup HA groups of PKCS#11 tokens",
		Long: `hactl operates hagroup: high-availability groups of PKCS#11 tokens presented
as one virtual slot. It edits the configuration file (locked, atomically) and
sends live commands to haagent over its Unix socket.

Exit codes: 0 ok, 1 error, 2 usage, 3 a check found a problem (degraded group,
member down, out of sync), 4 haagent unreachable, 5 permission denied, 6 an
action failed (a copy of synchronize), 7 a confirmation declined, 130
interrupted (Ctrl-C).`,
		Example: `  hactl hagroup creategroup --label signing --token-label ha-a --module /usr/lib/softhsm/libsofthsm2.so --pin-file /etc/hagroup/pin-a
  hactl hagroup listgroups
  hactl hagroup synchronize --group signing --check`,
		Version:           version,
		SilenceUsage:      true,
		SilenceErrors:     true,
		Args:              noArgs,
		RunE:              needSubcommand,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		DisableAutoGenTag: true,
	}
	root.SetIn(a.in)
	root.SetOut(a.out)
	root.SetErr(a.errOut)
	pf := root.PersistentFlags()
	pf.StringVar(&a.configFlag, "config", "", "configuration file (default $HAGROUP_CONF, else "+config.DefaultPath+")")
	pf.StringVar(&a.socketFlag, "socket", "", "haagent's socket (default: the config's agent.socket, else "+config.DefaultSocket+")")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return &usageError{err.Error()} })
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		a.choosePrinter(cmd)
		return a.checkConfigFlag(cmd)
	}

	root.AddCommand(
		newHagroupCmd(a),
		newSlotCmd(a),
		newAgentCmd(a),
		newConfigCmd(a),
		newCompletionCmd(a),
		newManCmd(a),
	)
	registerValueCompletions(root, a)
	return root
}

// noArgs rejects positional arguments on commands that take none.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		if cmd.HasSubCommands() {
			return &usageError{fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())}
		}
		return &usageError{fmt.Sprintf("%s takes no arguments, got %q", cmd.CommandPath(), args)}
	}
	return nil
}

// exactArgs wants exactly n positional arguments.
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return &usageError{fmt.Sprintf("%s takes %d argument(s), got %d", cmd.CommandPath(), n, len(args))}
		}
		return nil
	}
}

// needSubcommand is the RunE of group commands run bare.
func needSubcommand(cmd *cobra.Command, args []string) error {
	cmd.Help()
	return &usageError{fmt.Sprintf("%s needs a subcommand", cmd.CommandPath())}
}

// runE wraps a command's work so its errors are told apart from cobra's.
func runE(f func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		if err := f(cmd, args); err != nil {
			return &runError{err}
		}
		return nil
	}
}

// commandPathOf finds the deepest command named by args, for the usage hint.
func commandPathOf(root *cobra.Command, args []string) string {
	c, _, err := root.Find(args)
	if err != nil || c == nil || c == root {
		return ""
	}
	return strings.TrimPrefix(c.CommandPath(), "hactl ")
}

// configPath is the configuration file in use.
func (a *app) configPath() string { return config.ResolvePath(a.configFlag) }

// loadConfig loads the configuration; a missing file is reported with a
// hint on how to make one.
func (a *app) loadConfig() (*config.Config, error) {
	p := a.configPath()
	c, err := config.Load(p)
	if errors.Is(err, config.ErrNoConfig) {
		return nil, fmt.Errorf("%s does not exist: create a group with 'hactl hagroup creategroup' or pass --config: %w", p, err)
	}
	return c, err
}

// socketPath is --socket, else the config's agent.socket, else the default.
// A config that fails validation is still read for its socket, so an
// operator with a broken file reaches the agent (whose reload then says
// what is wrong) instead of the default path.
func (a *app) socketPath() string {
	if a.socketFlag != "" {
		return a.socketFlag
	}
	c, err := config.Load(a.configPath())
	if err == nil {
		return c.Agent.WithDefaults().Socket
	}
	var loose struct {
		Agent struct {
			Socket string `toml:"socket"`
		} `toml:"agent"`
	}
	if _, derr := toml.DecodeFile(a.configPath(), &loose); derr == nil && loose.Agent.Socket != "" {
		return loose.Agent.Socket
	}
	return config.DefaultSocket
}

func (a *app) client() *agent.Client { return agent.NewClient(a.socketPath()) }

// prompter returns the prompter for a command: the interactive one only
// on a terminal and when neither --yes nor --json was given.
func (a *app) prompter(yes bool) Prompter {
	if yes || a.jsonOut() || !a.isTerminal() {
		return noPrompter{yes: yes}
	}
	return a.newPrompter()
}

// confirm asks a yes/no question, or requires --yes where it cannot ask.
func (a *app) confirm(p Prompter, what string) error {
	ok, err := p.Confirm(what + "?")
	if errors.Is(err, errNoTerminal) {
		a.quietUsage = true
		return &usageError{fmt.Sprintf("%s: pass --yes to confirm (no terminal to ask on)", what)}
	}
	if err != nil {
		return err
	}
	if !ok {
		return errDeclined
	}
	return nil
}

// tokenLister lists the tokens of m's module as report.CheckToken wants it,
// with m's init arguments.
func (a *app) tokenLister(m config.Member) func(ctx context.Context, module string, env map[string]string) ([]slot.TokenSummary, error) {
	return func(ctx context.Context, module string, env map[string]string) ([]slot.TokenSummary, error) {
		return a.listTokens(ctx, slot.ModuleRef{Path: module, Env: env, InitArgs: m.InitArgs})
	}
}
