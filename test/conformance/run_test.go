package conformance

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// answer is one step's answer: the driver's line, and the fields compared.
type answer struct {
	step   step
	line   string
	fields []field
}

type field struct{ key, value string }

// norm renders the compared fields, without those in drop.
func (a answer) norm(drop ...string) string {
	var b []string
	for _, f := range a.fields {
		if f.key == "h" || f.key == "h2" || slices.Contains(a.step.skip, f.key) || slices.Contains(drop, f.key) {
			continue
		}
		b = append(b, f.key+"="+f.value)
	}
	return strings.Join(b, " ")
}

func (a answer) get(key string) (string, bool) {
	for _, f := range a.fields {
		if f.key == key {
			return f.value, true
		}
	}
	return "", false
}

func (a answer) rv() string { v, _ := a.get("rv"); return v }

func parse(s step, line string) answer {
	a := answer{step: s, line: line}
	for _, kv := range strings.Fields(line) {
		k, v, _ := strings.Cut(kv, "=")
		a.fields = append(a.fields, field{k, v})
	}
	return a
}

var varRef = regexp.MustCompile(`\$(\w+)`)

// play runs steps on a fresh driver of w. before, when set, is called
// before each step with its index (the kill test's faults).
func play(t *testing.T, w *world, steps []step, before func(i int)) []answer {
	t.Helper()
	d, err := startDriver(w)
	if err != nil {
		t.Fatalf("%s: %v", w.name, err)
	}
	defer d.close()
	vars := map[string]string{}
	out := make([]answer, 0, len(steps))
	for i, s := range steps {
		if before != nil {
			before(i)
		}
		line := varRef.ReplaceAllStringFunc(s.call, func(ref string) string {
			if v, ok := vars[ref[1:]]; ok {
				return v
			}
			return "0" // an earlier step failed; this one shows it
		})
		got, err := d.call(line)
		if err != nil {
			t.Fatalf("%s: step %q (%s): %v\nHA log:\n%s", w.name, s.name, s.call, err, w.haLog())
		}
		a := parse(s, got)
		for v, f := range s.save {
			if x, ok := a.get(f); ok {
				vars[v] = x
			} else {
				delete(vars, v)
			}
		}
		out = append(out, a)
	}
	return out
}

// difference is one step whose answer differs from the bare token's.
type difference struct {
	step      string
	call      string
	got, want string
}

func (d difference) String() string {
	return fmt.Sprintf("step %q (%s):\n      got  %s\n      want %s (bare token)", d.step, d.call, d.got, d.want)
}

// report is what compare found.
type report struct {
	diffs []difference // undocumented: the test fails
}

// compare compares got with want, the bare token's answers to the same
// steps. A difference is allowed where allowances document it; after one
// that ends the operation, the operation's later steps are not compared.
func compare(config string, want, got []answer, allow []allowance) report {
	var r report
	ended := ""
	for i := range want {
		w, g := want[i], got[i]
		if ended != "" && w.step.op == ended {
			continue
		}
		ended = ""
		if w.norm() == g.norm() {
			continue
		}
		if j, ok := allowed(allow, config, want, i, g); ok {
			if allow[j].endsOp {
				ended = w.step.op
			}
			continue
		}
		r.diffs = append(r.diffs, difference{step: w.step.name, call: w.step.call, got: g.norm(), want: w.norm()})
	}
	return r
}
