package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"
)

// The pages of docs/json describe each command's --json output as a table
// of fields, one row per field path:
//
//	| `groups[].members[].lastError` | string | no | … |
//
// path, type (string, number, boolean, object, array), whether it is
// always there (yes) or may be left out (no), and what it means. The
// jsondoc command checks a command's real output against its page.

// docField is one row of a page.
type docField struct {
	typ    string
	always bool
}

var docRow = regexp.MustCompile("^\\| `([^`]+)` \\| (string|number|boolean|object|array) \\| (yes|no) \\|")

// readJSONDoc reads the field table of a page.
func readJSONDoc(path string) (map[string]docField, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	fields := map[string]docField{}
	for line := range strings.SplitSeq(string(b), "\n") {
		if m := docRow.FindStringSubmatch(line); m != nil {
			if _, dup := fields[m[1]]; dup {
				return nil, fmt.Errorf("%s: field %s documented twice", path, m[1])
			}
			fields[m[1]] = docField{typ: m[2], always: m[3] == "yes"}
		}
	}
	if len(fields) == 0 {
		return nil, fmt.Errorf("%s: no field table", path)
	}
	return fields, nil
}

// jsonFields records the path and type of every field in v (arrays as
// "[]", their elements merged).
func jsonFields(prefix string, v any, out map[string]string) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			out[p] = typeOf(e)
			jsonFields(p, e, out)
		}
	case []any:
		for _, e := range x {
			out[prefix+"[]"] = "element"
			jsonFields(prefix+"[]", e, out)
		}
	}
}

// parentOf is the path of the object or array element holding field p.
func parentOf(p string) string {
	i := strings.LastIndexByte(p, '.')
	if i < 0 {
		return ""
	}
	return p[:i]
}

func typeOf(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "boolean"
	case []any:
		return "array"
	case nil:
		return "null"
	}
	return "object"
}

// checkJSONDoc compares the JSON values in r (one or more, as halog
// prints them) with the page at doc: every field printed is documented
// with its type, and every field documented as always there is printed.
func checkJSONDoc(doc string, r io.Reader) error {
	want, err := readJSONDoc(doc)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bufio.NewReader(r))
	got := map[string]string{}
	n := 0
	for {
		var v any
		if err := dec.Decode(&v); err == io.EOF {
			break
		} else if err != nil {
			return fmt.Errorf("output is not JSON: %w", err)
		}
		fields := map[string]string{}
		jsonFields("", v, fields)
		for p, t := range fields {
			if prev, ok := got[p]; !ok || prev == "null" {
				got[p] = t
			}
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("no JSON output to check against %s", doc)
	}
	var problems []string
	for _, p := range slices.Sorted(maps.Keys(got)) {
		if got[p] == "element" {
			continue
		}
		d, ok := want[p]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("%s (%s) is printed but not documented", p, got[p]))
		case got[p] != "null" && got[p] != d.typ:
			problems = append(problems, fmt.Sprintf("%s is documented as %s but printed as %s", p, d.typ, got[p]))
		}
	}
	for _, p := range slices.Sorted(maps.Keys(want)) {
		// A field is always there where its parent is: an element's
		// fields are checked once an array had an element.
		if parent := parentOf(p); parent != "" {
			if _, ok := got[parent]; !ok {
				continue
			}
		}
		if _, ok := got[p]; !ok && want[p].always {
			problems = append(problems, fmt.Sprintf("%s is documented as always there but not printed", p))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s:\n\t%s", doc, strings.Join(problems, "\n\t"))
	}
	return nil
}

// jsondoc PAGE: check stdout (the last command's JSON output) against
// docs/json/PAGE.
func cmdJSONDoc(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 1 || neg {
		ts.Fatalf("usage: jsondoc PAGE")
	}
	ts.Check(checkJSONDoc(filepath.Join(ts.Getenv("DOCS_JSON"), args[0]), strings.NewReader(ts.ReadFile("stdout"))))
}

// TestJSONDocCheck: the checker finds what a drifted page would hide.
func TestJSONDocCheck(t *testing.T) {
	doc := filepath.Join(t.TempDir(), "x.md")
	os.WriteFile(doc, []byte("| field | type | always | meaning |\n|---|---|---|---|\n"+
		"| `schemaVersion` | number | yes | v |\n| `items` | array | yes | i |\n| `items[].name` | string | yes | n |\n"+
		"| `items[].note` | string | no | n |\n"), 0o600)
	for _, tc := range []struct{ name, out, want string }{
		{"exact", `{"schemaVersion":1,"items":[{"name":"a"}]}`, ""},
		{"lines", "{\"schemaVersion\":1,\"items\":[]}\n{\"schemaVersion\":1,\"items\":[{\"name\":\"a\",\"note\":\"b\"}]}\n", ""},
		{"undocumented", `{"schemaVersion":1,"items":[{"name":"a","extra":2}]}`, "items[].extra (number) is printed but not documented"},
		{"missing", `{"schemaVersion":1}`, "items is documented as always there but not printed"},
		{"missing in an element", `{"schemaVersion":1,"items":[{"note":"b"}]}`, "items[].name is documented as always there but not printed"},
		{"type", `{"schemaVersion":"1","items":[]}`, "schemaVersion is documented as number but printed as string"},
		{"empty", ``, "no JSON output"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkJSONDoc(doc, bytes.NewBufferString(tc.out))
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("unexpected: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("got %v, want %q", err, tc.want)
			}
		})
	}
}
