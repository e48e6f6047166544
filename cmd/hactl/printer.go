package main

import (
	"encoding/json"
	"io"

	"github.com/spf13/cobra"
)

// printer renders a command's typed result: as JSON for programs (--json)
// or as text for people. It is chosen once per run, before the command,
// from the command's --json flag (etcdctl's printer, chosen from
// --write-out); commands hand it their result and never ask which it is.
type printer interface {
	// print writes res to w; text renders it for people.
	print(w io.Writer, res any, text func(w io.Writer) error) error
	// forPrograms reports whether the output is for programs: such a run
	// never prompts and draws no progress.
	forPrograms() bool
}

// jsonPrinter writes the result as indented JSON.
type jsonPrinter struct{}

func (jsonPrinter) print(w io.Writer, res any, _ func(io.Writer) error) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}

func (jsonPrinter) forPrograms() bool { return true }

// textPrinter writes what the command's text renderer makes of the result.
type textPrinter struct{}

func (textPrinter) print(w io.Writer, _ any, text func(io.Writer) error) error { return text(w) }

func (textPrinter) forPrograms() bool { return false }

// choosePrinter picks the run's printer from cmd's --json flag.
func (a *app) choosePrinter(cmd *cobra.Command) {
	a.printer = textPrinter{}
	if on, err := cmd.Flags().GetBool("json"); err == nil && on {
		a.printer = jsonPrinter{}
	}
}

// print writes a command's result with the run's printer.
func (a *app) print(res any, text func(w io.Writer) error) error {
	return a.printer.print(a.out, res, text)
}

// jsonOut reports whether this run's output is for programs (--json).
func (a *app) jsonOut() bool { return a.printer.forPrograms() }

// tableOf is the text renderer of a result shown as one table.
func tableOf(header []string, rows [][]string) func(io.Writer) error {
	return func(w io.Writer) error { return renderTable(w, table(header, rows)) }
}
