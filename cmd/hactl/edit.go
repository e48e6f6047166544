package main

import (
	"context"
	"fmt"
	"io"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/config"
)

// editResult is what a config-editing command reports.
type editResult struct {
	SchemaVersion int    `json:"schemaVersion"`
	Config        string `json:"config"`
	Change        string `json:"change"`
	// Agent says whether a running haagent took the change: "reloaded",
	// "not running", or why it was not told.
	Agent        string   `json:"agent"`
	AgentChanges []string `json:"agentChanges,omitempty"`
	// CannotHold lists the kinds of key a member added could not hold.
	CannotHold []holdLine `json:"cannotHold,omitempty"`
}

// edit changes the config under its lock (atomically; nothing is written
// when fn or validation fails), then tells a running agent to reload.
// fn returns a one-line description of the change.
func (a *app) edit(ctx context.Context, fn func(c *config.Config) (string, error)) error {
	return a.editNoting(ctx, nil, fn)
}

// editNoting is edit, reporting also the kinds of key a member could not
// hold (warnings, or cannotHold in JSON).
func (a *app) editNoting(ctx context.Context, holds []holdLine, fn func(c *config.Config) (string, error)) error {
	path := a.configPath()
	// The agent to tell is the one running now, at the socket the file
	// names before the edit (which may change it).
	sock := a.socketPath()
	var change string
	err := config.Edit(ctx, path, func(c *config.Config) error {
		s, err := fn(c)
		change = s
		return err
	})
	if err != nil {
		return err
	}
	res := editResult{SchemaVersion: agent.SchemaVersion, Config: path, Change: change, CannotHold: holds}
	a.tellAgent(ctx, sock, &res)
	return a.print(res, func(w io.Writer) error {
		fmt.Fprintln(w, change)
		printCannotHold(a.errOut, holds)
		switch res.Agent {
		case "reloaded":
			fmt.Fprintln(w, "haagent reloaded")
			for _, c := range res.AgentChanges {
				fmt.Fprintln(w, "  "+c)
			}
		case "not running":
			fmt.Fprintln(w, "haagent is not running: the change applies when it starts")
		default:
			fmt.Fprintf(a.errOut, "warning: haagent %s\n", res.Agent)
		}
		return nil
	})
}

func (a *app) tellAgent(ctx context.Context, sock string, res *editResult) {
	c := agent.NewClient(sock)
	defer c.Close()
	rr, err := c.Reload(ctx)
	switch {
	case err == nil:
		res.Agent, res.AgentChanges = "reloaded", rr.Changes
		if rr.ConfigPath != "" && canonicalPath(rr.ConfigPath) != canonicalPath(res.Config) {
			res.Agent = fmt.Sprintf("at %s reloaded %s, not %s: it does not use the file edited", c.Path(), rr.ConfigPath, res.Config)
		}
	case agent.IsUnreachable(err):
		res.Agent = "not running"
	default:
		res.Agent = fmt.Sprintf("at %s was not reloaded: %v (send it SIGHUP)", c.Path(), err)
	}
}
