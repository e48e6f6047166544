package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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
	var follow bool
	var since time.Duration
	var group string
	cmd := &cobra.Command{
		Use:   "halog",
		Short: "Show the HA event log (failures, recoveries, replication)",
		Long: `Show the HA event log: members failing and recovering, standbys promoted,
objects replicated, conflicts found — seen by haagent or reported to it by
the applications running the group. Each line says when (RFC 3339, UTC),
who (program[pid]@host, and the uid of a reporting application), the group,
member and event; repeats of an event within a minute are folded into one
line ("×12 more in 1m0s"). From haagent when it runs, otherwise straight
from the config's log_file. --follow keeps printing new events (haagent
only). --json prints one JSON object per line.`,
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
				case a.jsonOut():
					return enc.Encode(eventLine{agent.SchemaVersion, e})
				case follow:
					_, err := fmt.Fprintln(a.out, followLine(e))
					return err
				}
				events = append(events, e)
				return nil
			}
			if follow && !a.jsonOut() {
				h := eventHeader
				fmt.Fprintf(a.out, "%-20s  %-32s  %-12s  %-10s  %-22s  %s\n", h[0], h[1], h[2], h[3], h[4], h[5])
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
			if !a.jsonOut() && !follow {
				if len(events) == 0 {
					fmt.Fprintln(a.out, "no events")
					return nil
				}
				// Lines appended by processes without an agent may be out of
				// order by a little; a person reads them in time order.
				slices.SortStableFunc(events, func(x, y agent.Event) int { return x.Time.Compare(y.Time) })
				return renderTable(a.out, table(makeEventsTable(events)))
			}
			return nil
		}),
	}
	cmd.Flags().BoolVar(&follow, "follow", false, "keep printing new events until interrupted")
	cmd.Flags().DurationVar(&since, "since", 0, "only events newer than this (e.g. 90m)")
	cmd.Flags().StringVar(&group, "group", "", "only this group's events")
	cmd.Flags().Bool("json", false, "print JSON lines")
	return cmd
}
