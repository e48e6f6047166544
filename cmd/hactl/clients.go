package main

import (
	"fmt"
	"io"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/spf13/cobra"
)

func newClientsCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "clients",
		Short: "List the processes that run a group and report to haagent",
		Long: `List the processes that run a group's engine — applications through
libhapkcs11.so, Go programs through pkg/ha — and report to haagent: pid,
program, host, uid, and per group each member's state as that process sees
it, its operations, failovers and errors, and when it last reported. The
pid and uid are the kernel's (SO_PEERCRED); the program and host are what
the process says. A process that exits leaves the list; one silent longer
than the expiry is forgotten (its counts stay in listgroups' APP columns
and in the metrics).

Needs a running haagent.`,
		Example: `  hactl hagroup clients
  hactl hagroup clients --json`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			c := a.client()
			defer c.Close()
			rep, err := c.Clients(cmd.Context())
			if err != nil {
				return err
			}
			return a.print(rep, func(w io.Writer) error {
				if len(rep.Clients) == 0 {
					_, err := fmt.Fprintf(w, "no process reports to haagent at %s\n", c.Path())
					return err
				}
				return renderTable(w, table(makeClientsTable(rep, time.Now())))
			})
		}),
	}
	cmd.Flags().Bool("json", false, "print the list as JSON")
	return cmd
}

// followLine renders one event of halog --follow in fixed-width columns,
// so that lines stay aligned without a table around them.
func followLine(e agent.Event) string {
	r := makeEventRow(e)
	return fmt.Sprintf("%-20s  %-32s  %-12s  %-10s  %-22s  %s", r[0], r[1], r[2], r[3], r[4], r[5])
}
