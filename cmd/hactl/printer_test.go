package main

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestPrinterChosenFromTheJSONFlag: a run's printer is picked once from
// the command's --json flag; a command without one prints text.
func TestPrinterChosenFromTheJSONFlag(t *testing.T) {
	res := struct {
		A int `json:"a"`
	}{1}
	text := func(w io.Writer) error { _, err := io.WriteString(w, "a is 1\n"); return err }
	for _, tc := range []struct {
		name, set, want string
		hasFlag         bool
	}{
		{"--json", "true", "{\n  \"a\": 1\n}\n", true},
		{"no --json", "false", "a is 1\n", true},
		{"no json flag", "", "a is 1\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			a := newApp(strings.NewReader(""), &out, io.Discard)
			cmd := &cobra.Command{Use: "x"}
			if tc.hasFlag {
				cmd.Flags().Bool("json", false, "")
				if err := cmd.Flags().Set("json", tc.set); err != nil {
					t.Fatal(err)
				}
			}
			a.choosePrinter(cmd)
			if err := a.print(res, text); err != nil {
				t.Fatal(err)
			}
			if out.String() != tc.want {
				t.Errorf("printed %q, want %q", out.String(), tc.want)
			}
			if a.jsonOut() != (tc.set == "true") {
				t.Errorf("jsonOut() = %v with --json=%q", a.jsonOut(), tc.set)
			}
		})
	}
}
