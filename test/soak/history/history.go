// Package history records what the soak's processes did to objects, each
// call with its invoke and return, and checks the record against the
// group's specification (Check):
//
//   - an object whose destroy returned OK is never served again, by any
//     member to any process: no search invoked after that return finds
//     it, no signature invoked after it is made with it, and no member
//     holds it once recovery has settled;
//   - an object whose creation returned OK and whose destroy was never
//     invoked is found by every search invoked after the creation
//     returned, and is on every member once recovery has settled;
//   - an object whose creation returned an error is on no member once
//     recovery has settled.
//
// Labels name objects: every creation in a soak uses a label of its own.
package history

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Kind is what a call did.
type Kind string

// The calls recorded.
const (
	Create  Kind = "create"  // make the object(s) labelled Label
	Destroy Kind = "destroy" // find the object(s) labelled Label and destroy them
	Find    Kind = "find"    // search for the object labelled Label
	Sign    Kind = "sign"    // sign with the private key labelled Label
)

// Op is one call: who made it, on what, when it was invoked and when it
// returned, and what it returned.
type Op struct {
	Host    string // the state directory and agent the process belongs to
	Process string // the process (and thread) that made the call
	Kind    Kind
	Label   string
	Invoke  time.Time
	Return  time.Time
	OK      bool   // the call returned CKR_OK
	Result  string // the error, when not OK
	Found   int    // Find and Destroy: the objects the search found
}

func (o Op) String() string {
	res := "ok"
	if !o.OK {
		res = o.Result
	}
	s := fmt.Sprintf("%s/%s %s %s [%s, %s] %s", o.Host, o.Process, o.Kind, o.Label,
		o.Invoke.Format("15:04:05.000000"), o.Return.Format("15:04:05.000000"), res)
	if o.Kind == Find || o.Kind == Destroy {
		s += fmt.Sprintf(" found %d", o.Found)
	}
	return s
}

// Log is a history being recorded. Safe for concurrent use.
type Log struct {
	mu  sync.Mutex
	ops []Op
}

// Add records one call.
func (l *Log) Add(op Op) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ops = append(l.ops, op)
}

// Ops returns the calls recorded so far, in the order they were added.
func (l *Log) Ops() []Op {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Op(nil), l.ops...)
}

// Destroyed returns the labels whose destroy has returned OK so far, and
// Live those created OK whose destroy has not been invoked: what a
// process probes to see whether another's destroy holds.
func (l *Log) Destroyed() []string {
	return l.labels(func(o Op) bool { return o.Kind == Destroy && o.OK })
}

// Live returns the labels whose creation returned OK and whose destroy
// was not recorded yet.
func (l *Log) Live() []string {
	l.mu.Lock()
	gone := map[string]bool{}
	for _, o := range l.ops {
		if o.Kind == Destroy {
			gone[o.Label] = true
		}
	}
	l.mu.Unlock()
	return l.labels(func(o Op) bool { return o.Kind == Create && o.OK && !gone[o.Label] })
}

func (l *Log) labels(keep func(Op) bool) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, o := range l.ops {
		if keep(o) {
			out = append(out, o.Label)
		}
	}
	return out
}

// ParseHaload reads one "hist" line of haload (test/load/c/haload.c):
//
//	hist KIND LABEL THREAD INVOKE_MS RETURN_MS RV FOUND
//
// as made by host's process proc. ok is false for any other line.
func ParseHaload(host, proc, line string) (op Op, ok bool, err error) {
	f := strings.Fields(line)
	if len(f) == 0 || f[0] != "hist" {
		return Op{}, false, nil
	}
	if len(f) != 8 {
		return Op{}, true, fmt.Errorf("haload history line %q: want 8 fields, got %d", line, len(f))
	}
	kind := Kind(f[1])
	if kind != Create && kind != Destroy {
		return Op{}, true, fmt.Errorf("haload history line %q: unknown call %q", line, f[1])
	}
	at := func(s string) (time.Time, error) {
		ms, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return time.Time{}, err
		}
		return time.UnixMicro(int64(math.Round(ms * 1e3))), nil
	}
	inv, err1 := at(f[4])
	ret, err2 := at(f[5])
	rv, err3 := strconv.ParseUint(strings.TrimPrefix(f[6], "0x"), 16, 64)
	found, err4 := strconv.Atoi(f[7])
	for _, e := range []error{err1, err2, err3, err4} {
		if e != nil {
			return Op{}, true, fmt.Errorf("haload history line %q: %w", line, e)
		}
	}
	op = Op{Host: host, Process: proc + "/t" + f[3], Kind: kind, Label: f[2], Invoke: inv, Return: ret, OK: rv == 0, Found: found}
	if rv != 0 {
		op.Result = fmt.Sprintf("CKR 0x%x", rv)
	}
	return op, true, nil
}

// sortByInvoke orders ops by invoke time.
func sortByInvoke(ops []Op) {
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Invoke.Before(ops[j].Invoke) })
}
