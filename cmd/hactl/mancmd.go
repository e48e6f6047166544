package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// manDate is the date printed in generated man pages. Fixed, so the pages
// in man/ change only when the commands do.
var manDate = time.Date(2025, time.January, 1, 0, 0, 0, 0, time.UTC)

func newManCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "man DIR",
		Short:   "Write hactl's man pages into DIR",
		Example: `  hactl man man/`,
		Hidden:  true,
		Args:    exactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if err := os.MkdirAll(args[0], 0o755); err != nil {
				return err
			}
			if err := genMan(cmd.Root(), args[0]); err != nil {
				return err
			}
			_, err := fmt.Fprintf(a.out, "man pages written to %s\n", args[0])
			return err
		}),
	}
}

// genMan writes one page per visible command into dir.
func genMan(root *cobra.Command, dir string) error {
	h := &doc.GenManHeader{Title: "HACTL", Section: "1", Source: "hagroup", Manual: "hagroup manual", Date: &manDate}
	return doc.GenManTree(root, h, dir)
}
