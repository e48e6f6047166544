package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/spf13/cobra"
)

// eventLine is one --json line of halog.
type eventLine struct {
	SchemaVersion int `json:"schemaVersion"`
	agent.Event
}

func newHALogCmd(a *app) *cobra.Command {
	var follow, jsonOut bool
	var since time.Duration
	var group string
	cmd := &cobra.Command{
		Use:   "halog",
		Short: "Show the HA event log (failures, recoveries, replication)",
		Long: `Show the HA event log: members failing and recovering, standbys promoted,
objects replicated, conflicts found. From haagent when it runs, otherwise
straight from the config's log_file. --follow keeps printing new events
(haagent only). --json prints one JSON object per line.`,
		Example: `  hactl hagroup halog --since 1h
  hactl hagroup halog --follow --group signing --json`,
		Args:        noArgs,
		Annotations: map[string]string{annotUsesAgent: "true"},
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			req := agent.HALogRequest{Since: since, Group: group, Follow: follow}
			var events []agent.Event
			enc := json.NewEncoder(a.out)
			emit := func(e agent.Event) error {
				switch {
				case jsonOut:
					return enc.Encode(eventLine{agent.SchemaVersion, e})
				case follow:
					_, err := fmt.Fprintln(a.out, joinRow(makeEventRow(e)))
					return err
				}
				events = append(events, e)
				return nil
			}
			c := a.client()
			defer c.Close()
			err := c.HALog(cmd.Context(), req, emit)
			if agent.IsUnreachable(err) && !follow {
				cfg, cerr := a.loadConfig()
				if cerr != nil {
					return errors.Join(err, cerr)
				}
				if cfg.Agent.LogFile == "" {
					return fmt.Errorf("%w; and %s sets no agent.log_file to read instead", err, cfg.Path)
				}
				err = agent.ReadEventLogFile(cfg.Agent.LogFile, req, emit)
			}
			if err != nil {
				return err
			}
			if !jsonOut && !follow {
				if len(events) == 0 {
					fmt.Fprintln(a.out, "no events")
					return nil
				}
				return renderTable(a.out, table(makeEventsTable(events)))
			}
			return nil
		}),
	}
	cmd.Flags().BoolVar(&follow, "follow", false, "keep printing new events until interrupted")
	cmd.Flags().DurationVar(&since, "since", 0, "only events newer than this (e.g. 90m)")
	cmd.Flags().StringVar(&group, "group", "", "only this group's events")
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON lines")
	return cmd
}

func joinRow(r []string) string {
	s := ""
	for i, c := range r {
		if i > 0 {
			s += "  "
		}
		s += c
	}
	return s
}
