package soak

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/hagroup/hagroup/test/load"
	"github.com/miekg/pkcs11"
)

// otherHost is a host besides the first (issue 15): a configuration with
// the same members and its own state directory, socket and HA log, its
// own haagent (recovering the members the chaos kills, at the same time
// as the first host's), and its own load process through libhapkcs11.so.
// The hosts meet only on the members. Its load shares the first host's
// life-cycle lock file: that lock works around SoftHSM's refusal of
// concurrent creations on one token (see goLoad.lifecycle), which a real
// HSM does not need, not anything another host would share.
type otherHost struct {
	name                                 string // "B", "C"
	conf, sock, stateDir, logFile, stats string
	agent                                *load.Proc
	load                                 *load.Load
}

// hostName names the i-th host: "A" (the first, with the Go engine), "B",
// "C".
func hostName(i int) string { return string(rune('A' + i)) }

// startOtherHost writes host name's configuration and starts its agent.
func (w *world) startOtherHost(ctx context.Context, name string) (*otherHost, error) {
	n := strings.ToLower(name)
	h := &otherHost{
		name:     name,
		conf:     filepath.Join(w.dir, "hagroup-"+n+".toml"),
		sock:     filepath.Join(w.dir, "agent-"+n+".sock"),
		stateDir: filepath.Join(w.dir, "state-"+n),
		logFile:  filepath.Join(w.dir, "ha-"+n+".log"),
		stats:    filepath.Join(w.dir, "stats-"+n+".jsonl"),
	}
	var labels []string
	for i := range w.members {
		labels = append(labels, fmt.Sprintf("soak-%d", i))
	}
	if err := os.WriteFile(h.logFile, nil, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(h.conf, []byte(w.configAt(h.sock, h.stateDir, h.logFile, labels, false)), 0o600); err != nil {
		return nil, err
	}
	p, err := w.startAgentAt(ctx, "haagent-"+n, h.conf, h.sock)
	h.agent = p
	return h, err
}

// mergeResults adds another host's load b to a, for the report.
func mergeResults(a, b *load.Result) *load.Result {
	m := *a
	m.Ops, m.Failed, m.Bad, m.Reopens = a.Ops+b.Ops, a.Failed+b.Failed, a.Bad+b.Bad, a.Reopens+b.Reopens
	m.PerOp = map[string][2]int{}
	for _, r := range []*load.Result{a, b} {
		for k, v := range r.PerOp {
			m.PerOp[k] = [2]int{m.PerOp[k][0] + v[0], m.PerOp[k][1] + v[1]}
		}
	}
	if b.MaxLat > m.MaxLat {
		m.MaxLat, m.MaxLatAt = b.MaxLat, b.MaxLatAt
	}
	m.Errors = append(append([]string(nil), a.Errors...), b.Errors...)
	m.Created = append(append([]string(nil), a.Created...), b.Created...)
	m.Destroyed = append(append([]string(nil), a.Destroyed...), b.Destroyed...)
	m.CreateFailed, m.DestroyFailed = map[string]string{}, map[string]string{}
	for _, r := range []*load.Result{a, b} {
		for k, v := range r.CreateFailed {
			m.CreateFailed[k] = v
		}
		for k, v := range r.DestroyFailed {
			m.DestroyFailed[k] = v
		}
	}
	return &m
}

// holdingsDiffer reports whether the members hold different objects (by
// label, counting copies) and describes the first differences: the truth
// an "in sync" answer is judged by.
func holdingsDiffer(members []string, holdings []map[string]int) (bool, string) {
	labels := map[string]bool{}
	for _, h := range holdings {
		for l := range h {
			labels[l] = true
		}
	}
	var diffs []string
	for l := range labels {
		for i, h := range holdings[1:] {
			if h[l] != holdings[0][l] {
				diffs = append(diffs, fmt.Sprintf("%s: %d on %s, %d on %s", l, holdings[0][l], members[0], h[l], members[i+1]))
				break
			}
		}
	}
	sort.Strings(diffs)
	return len(diffs) > 0, strings.Join(first(diffs, 5), "; ")
}

// duplicates lists the objects made by the loads (created) that a member
// holds more than want times: two hosts' copies of one object.
func duplicates(members []string, holdings []map[string]int, created []string, want int) []string {
	var out []string
	for _, l := range created {
		for i, h := range holdings {
			if h[l] > want {
				out = append(out, fmt.Sprintf("%s ×%d on %s", l, h[l], members[i]))
			}
		}
	}
	sort.Strings(out)
	return out
}

// falseInSync counts the agents' answers that the group is in sync
// (synchronize --check, and listgroups with no member needing
// synchronisation) while the members hold different objects.
func falseInSync(differ bool, checks []agent.SyncReport, lists []agent.GroupsReport) int {
	if !differ {
		return 0
	}
	n := 0
	for _, c := range checks {
		if c.InSync {
			n++
		}
	}
	for _, l := range lists {
		if len(l.Groups) == 1 && len(l.Groups[0].NeedsSync) == 0 {
			n++
		}
	}
	return n
}

// holdings lists what every member holds, directly through its server,
// one label at a time: an object that cannot be read is counted, not
// fatal.
func (w *world) holdings(ctx context.Context) ([]map[string]int, []string) {
	holdings := make([]map[string]int, len(w.members))
	var listErrs []string
	for i := range w.members {
		holdings[i] = map[string]int{}
		labels, errs := listLabels(ctx, w.memberSpec(i))
		for _, l := range labels {
			// The group's own state (behind marks, tombstones) differs
			// between members by design and is not what "in sync" compares
			// (DESIGN.md, "Group state on the members").
			if object.Hidden(pkcs11.CKO_DATA, l) {
				continue
			}
			holdings[i][l]++
		}
		for _, e := range errs {
			listErrs = append(listErrs, fmt.Sprintf("member %s: %v", w.members[i], e))
		}
	}
	return holdings, listErrs
}

// changedBetween reports whether a member's holdings changed from a to b,
// and describes the first changes.
func changedBetween(members []string, a, b []map[string]int) (bool, string) {
	var diffs []string
	for i := range members {
		for _, m := range []map[string]int{a[i], b[i]} {
			for l := range m {
				if a[i][l] != b[i][l] {
					diffs = append(diffs, fmt.Sprintf("%q on %s: %d then %d", l, members[i], a[i][l], b[i][l]))
				}
			}
		}
	}
	sort.Strings(diffs)
	diffs = slices.Compact(diffs)
	return len(diffs) > 0, strings.Join(first(diffs, 5), "; ")
}
