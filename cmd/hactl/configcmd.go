package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/spf13/cobra"
)

// annotUsesAgent marks the commands that report or act through haagent:
// with --config, they say when the agent runs another file.
const annotUsesAgent = "hactl/uses-agent"

// annotNoConfigCheck marks the commands that read --config themselves
// and must run when it is invalid.
const annotNoConfigCheck = "hactl/no-config-check"

func newConfigCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "config",
		Short:   "Check the configuration file",
		Example: `  hactl config validate /etc/hagroup/hagroup.toml`,
		Args:    noArgs,
		RunE:    needSubcommand,
	}
	cmd.AddCommand(newConfigValidateCmd(a))
	return cmd
}

// configProblem is one problem of config validate's report.
type configProblem struct {
	File    string `json:"file"`
	Line    int    `json:"line,omitempty"`
	Group   string `json:"group,omitempty"`
	Member  string `json:"member,omitempty"`
	Key     string `json:"key,omitempty"`
	Message string `json:"message"`
}

// validateResult is config validate's report.
type validateResult struct {
	SchemaVersion int             `json:"schemaVersion"`
	Config        string          `json:"config"`
	Valid         bool            `json:"valid"`
	Groups        int             `json:"groups"`
	Members       int             `json:"members"`
	Problems      []configProblem `json:"problems"`
}

func newConfigValidateCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "validate [FILE]",
		Short: "Check a configuration file and list every problem with its line",
		Long: `Load FILE (default: --config, $HAGROUP_CONF, else ` + config.DefaultPath + `) as haagent
and hactl do, strictly, and list every problem found, each with its file and
line: syntax errors, unknown keys, values of the wrong type, and every rule
of the schema. Nothing is changed and no token is opened. Exits 0 when the
file is valid, 1 otherwise.`,
		Example: `  hactl config validate
  hactl config validate /etc/hagroup/new.toml --json`,
		Annotations: map[string]string{annotNoConfigCheck: "true"},
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return &usageError{fmt.Sprintf("%s takes at most one file, got %d", cmd.CommandPath(), len(args))}
			}
			return nil
		},
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			path := a.configPath()
			if len(args) == 1 {
				path = args[0]
			}
			res := validateResult{SchemaVersion: agent.SchemaVersion, Config: path, Problems: []configProblem{}}
			c, err := config.Load(path)
			if err != nil && !errors.As(err, new(*config.FieldError)) {
				return err // missing, unreadable: not a report of problems
			}
			if err == nil {
				res.Valid, res.Groups = true, len(c.Groups)
				for _, g := range c.Groups {
					res.Members += len(g.Members)
				}
			}
			for _, e := range fieldErrors(err) {
				res.Problems = append(res.Problems, configProblem{File: e.File, Line: e.Line, Group: e.Group,
					Member: e.Member, Key: e.Key, Message: e.Msg})
			}
			summary := fmt.Sprintf("%s: %d problem(s)", path, len(res.Problems))
			if perr := a.print(res, func(w io.Writer) error {
				for _, e := range fieldErrors(err) {
					fmt.Fprintln(w, e.Error())
				}
				if res.Valid {
					summary = fmt.Sprintf("%s: valid: %d group(s), %d member(s)", path, res.Groups, res.Members)
				}
				_, err := fmt.Fprintln(w, summary)
				return err
			}); perr != nil {
				return perr
			}
			if !res.Valid {
				return &reportedError{msg: summary, shown: !a.jsonOut()}
			}
			return nil
		}),
	}
	cmd.Flags().Bool("json", false, "print the report as JSON")
	return cmd
}

// fieldErrors lists the problems joined in err, in file order.
func fieldErrors(err error) []*config.FieldError {
	var out []*config.FieldError
	for _, e := range flattenErrors(err) {
		var fe *config.FieldError
		if errors.As(e, &fe) {
			out = append(out, fe)
		}
	}
	slices.SortStableFunc(out, func(a, b *config.FieldError) int { return cmp.Compare(a.Line, b.Line) })
	return out
}

func flattenErrors(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flattenErrors(e)...)
		}
		return out
	}
	if err == nil {
		return nil
	}
	return []error{err}
}

// checkConfigFlag runs before every command given --config: a file that
// exists and does not load is an error (file:line), whatever the
// command; and a command that goes through haagent says so when the agent
// runs another file.
func (a *app) checkConfigFlag(cmd *cobra.Command) error {
	if a.configFlag == "" || cmd.Annotations[annotNoConfigCheck] != "" {
		return nil
	}
	if _, err := config.Load(a.configFlag); err != nil && !errors.Is(err, config.ErrNoConfig) {
		return &runError{fmt.Errorf("--config %s does not load:\n%w", a.configFlag, err)}
	}
	if cmd.Annotations[annotUsesAgent] != "" {
		a.warnOtherConfig(cmd.Context())
	}
	return nil
}

// warnOtherConfig says, on stderr, when the agent at the socket runs a
// file other than --config (paths compared once made absolute and free of
// links). An agent that does not answer says nothing here: the command
// reports that itself.
func (a *app) warnOtherConfig(ctx context.Context) {
	c := a.client()
	defer c.Close()
	st, err := c.Status(ctx)
	if err != nil || st.ConfigPath == "" {
		return
	}
	if canonicalPath(st.ConfigPath) != canonicalPath(a.configFlag) {
		fmt.Fprintf(a.errOut, "hactl: warning: haagent at %s runs %s, not %s: what it reports and does is for its file\n",
			c.Path(), st.ConfigPath, a.configFlag)
	}
}

// canonicalPath is p made absolute, with its symbolic links resolved where
// they exist.
func canonicalPath(p string) string {
	if abs, err := filepath.Abs(p); err == nil {
		p = abs
	}
	if real, err := filepath.EvalSymlinks(p); err == nil {
		p = real
	}
	return p
}
