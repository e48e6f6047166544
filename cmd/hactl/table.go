package main

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/agent/report"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/olekukonko/tablewriter"
	"github.com/olekukonko/tablewriter/renderer"
	"github.com/olekukonko/tablewriter/tw"
)

// renderTable writes header and rows as plain aligned columns (no
// borders, no trailing blanks), so output diffs cleanly in scripts.
func renderTable(w io.Writer, td tableData) error {
	header, rows := td.header, td.rows
	var buf bytes.Buffer
	t := tablewriter.NewTable(&buf,
		tablewriter.WithRenderer(renderer.NewBlueprint(tw.Rendition{
			Borders: tw.BorderNone,
			Symbols: tw.NewSymbols(tw.StyleASCII),
			Settings: tw.Settings{
				Separators: tw.Separators{BetweenColumns: tw.Off, BetweenRows: tw.Off},
				Lines:      tw.Lines{ShowHeaderLine: tw.Off},
			},
		})),
		tablewriter.WithHeaderAutoFormat(tw.Off),
		tablewriter.WithHeaderAlignment(tw.AlignLeft),
		tablewriter.WithRowAlignment(tw.AlignLeft),
		tablewriter.WithRowAutoWrap(tw.WrapNone),
		tablewriter.WithPadding(tw.Padding{Left: "", Right: "  ", Overwrite: true}),
	)
	t.Header(header)
	if err := t.Bulk(rows); err != nil {
		return err
	}
	if err := t.Render(); err != nil {
		return err
	}
	for _, line := range strings.Split(strings.TrimRight(buf.String(), "\n"), "\n") {
		if _, err := fmt.Fprintln(w, strings.TrimRight(line, " ")); err != nil {
			return err
		}
	}
	return nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// makeSettingsTable renders HA settings as name/value rows, Luna's
// "global settings" block.
func makeSettingsTable(s agent.Settings) ([]string, [][]string) {
	retries := strconv.Itoa(s.Retries)
	if s.Retries < 0 {
		retries = "unlimited"
	}
	return []string{"GLOBAL SETTING", "VALUE"}, [][]string{
		{"HA only", yesNo(s.Only)},
		{"recovery mode", s.RecoveryMode},
		{"recovery retries", retries},
		{"recovery interval", s.Interval},
		{"policy", s.Policy},
		{"failure threshold", strconv.Itoa(s.FailureThreshold)},
		{"command timeout", s.CommandTimeout},
		{"keygen timeout", s.KeygenTimeout},
		{"probe interval", s.ProbeInterval},
		{"hedge", yesNo(s.Hedge)},
	}
}

// makeGroupTable renders a group's header block: label, serial, policy,
// members, needs-sync and standbys, as LunaCM's listgroups does.
func makeGroupTable(g agent.GroupStatus) ([]string, [][]string) {
	names := make([]string, len(g.Members))
	for i, m := range g.Members {
		names[i] = m.Name
	}
	status := "healthy"
	if !g.Healthy {
		status = "degraded"
	}
	return []string{"GROUP", g.Label}, [][]string{
		{"serial", g.Serial},
		{"status", status},
		{"policy", g.Settings.Policy},
		{"recovery mode", g.Settings.RecoveryMode},
		{"HA only", yesNo(g.Settings.Only)},
		{"hedge", yesNo(g.Settings.Hedge)},
		{"hedged requests", strconv.FormatUint(g.Hedges, 10)},
		{"members", report.OrNone(names)},
		{"needs sync", report.OrNone(g.NeedsSync)},
		{"compared", comparedCell(g)},
		{"standby members", report.OrNone(g.Standbys)},
		{"tombstone stall", stallCell(g.TombstoneStall)},
	}
}

// comparedCell says how old the comparison behind "needs sync" is, or why
// there is none.
func comparedCell(g agent.GroupStatus) string {
	age := "never"
	if !g.ComparedAt.IsZero() {
		age = g.ComparedAgo + " ago"
	}
	if g.CompareError != "" {
		return age + ": could not compare: " + g.CompareError
	}
	return age
}

// makeMembersTable renders a group's members: the member table of
// listgroups.
func makeMembersTable(g agent.GroupStatus) ([]string, [][]string) {
	header := []string{"MEMBER", "STATE", "ROLE", "SLOT", "TOKEN", "SERIAL", "IN-FLIGHT", "OPS", "FAILURES", "APP OPS", "APP FAILURES", "CLIENTS", "ATTEMPTS LEFT", "NEEDS SYNC", "LAST ERROR"}
	rows := make([][]string, 0, len(g.Members))
	for _, m := range g.Members {
		role := "active"
		switch {
		case m.Standby:
			role = "standby"
		case m.Primary:
			role = "primary"
		}
		slotID := "-"
		if m.SlotID != nil {
			slotID = strconv.FormatUint(uint64(*m.SlotID), 10)
		}
		token := m.TokenLabel
		if token == "" {
			token = m.Token
		}
		rows = append(rows, []string{m.Name, m.State, role, slotID, dash(token), dash(m.TokenSerial),
			strconv.FormatInt(m.InFlight, 10), strconv.FormatUint(m.Operations, 10),
			strconv.FormatUint(m.Failures, 10), strconv.FormatUint(m.ClientOperations, 10),
			strconv.FormatUint(m.ClientFailures, 10), strconv.Itoa(m.Clients),
			attemptsLeft(m), needsSync(m), dash(cut(m.LastError, lastErrorWidth))})
	}
	return header, rows
}

// lastErrorWidth is how much of a member's last error the table shows, so
// a long chain does not wrap the table; --json has it whole.
const lastErrorWidth = 60

// cut shortens s to at most n characters, ending it with … when cut.
func cut(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// attemptsLeft renders the automatic recovery attempts a member has left:
// "-" when unknown (no agent), "unlimited", "0 (gave up)", or a count.
func attemptsLeft(m agent.MemberStatus) string {
	switch {
	case m.PINBlocked:
		return "0 (PIN refused)"
	case m.GaveUp:
		return "0 (gave up)"
	case m.AttemptsLeft == nil:
		return "-"
	case *m.AttemptsLeft < 0:
		return "unlimited"
	}
	return strconv.Itoa(*m.AttemptsLeft)
}

// needsSync renders whether a member differs from the group, with the
// number of objects when known.
func needsSync(m agent.MemberStatus) string {
	switch {
	case m.OutOfSync > 0:
		return fmt.Sprintf("yes (%d)", m.OutOfSync)
	case m.NeedsSync:
		return "yes"
	}
	return "no"
}

// makeRecoverTable renders a recovery's per-member outcome.
func makeRecoverTable(r agent.RecoverResult) ([]string, [][]string) {
	rows := make([][]string, 0, len(r.Members))
	for _, m := range r.Members {
		res := "ok"
		if !m.OK {
			res = "failed"
		}
		rows = append(rows, []string{m.Member, res, m.State, dash(m.Detail)})
	}
	return []string{"MEMBER", "RESULT", "STATE", "DETAIL"}, rows
}

// makeDiffTable renders a synchronisation's differences.
func makeDiffTable(r agent.SyncReport) ([]string, [][]string) {
	rows := make([][]string, 0, len(r.Differences))
	for _, d := range r.Differences {
		rows = append(rows, []string{d.Object, d.Kind, strings.Join(d.Members, ","), d.Action, dash(d.Detail)})
	}
	return []string{"OBJECT", "DIFFERENCE", "MEMBERS", "ACTION", "DETAIL"}, rows
}

// makeEventRow renders one HA log event: when (RFC 3339, seconds), who,
// where, what.
func makeEventRow(e agent.Event) []string {
	return []string{e.Time.UTC().Format(time.RFC3339), eventWho(e), dash(e.Group), dash(e.Member), e.Event, dash(e.Detail)}
}

// eventHeader names makeEventRow's columns.
var eventHeader = []string{"TIME", "WHO", "GROUP", "MEMBER", "EVENT", "DETAIL"}

// eventWho renders who saw an event: program[pid]@host, plus the uid of a
// reporting process; the source of lines from older versions.
func eventWho(e agent.Event) string {
	if e.Program == "" {
		return dash(e.Source)
	}
	s := e.Program
	if e.PID != 0 {
		s += "[" + strconv.Itoa(e.PID) + "]"
	}
	if e.Host != "" {
		s += "@" + e.Host
	}
	if e.UID != nil {
		s += " uid " + strconv.Itoa(*e.UID)
	}
	return s
}

// makeEventsTable renders HA log events.
func makeEventsTable(es []agent.Event) ([]string, [][]string) {
	rows := make([][]string, len(es))
	for i, e := range es {
		rows[i] = makeEventRow(e)
	}
	return eventHeader, rows
}

// makeClientsTable renders the processes reporting to the agent: one row
// per process and group, its members' states in one cell.
func makeClientsTable(r agent.ClientsReport, now time.Time) ([]string, [][]string) {
	header := []string{"PID", "PROGRAM", "HOST", "UID", "GROUP", "MEMBERS", "OPS", "FAILOVERS", "ERRORS", "LAST SEEN"}
	var rows [][]string
	for _, c := range r.Clients {
		seen := now.Sub(c.LastSeen).Round(time.Second).String() + " ago"
		base := []string{strconv.Itoa(c.PID), dash(c.Program), dash(c.Host), strconv.Itoa(c.UID)}
		if len(c.Groups) == 0 {
			rows = append(rows, append(base, "-", "-", "0", "0", "0", seen))
			continue
		}
		for _, g := range c.Groups {
			var states []string
			var ops, failovers, errs uint64
			for _, m := range g.Members {
				states = append(states, m.Name+"="+m.State)
				ops, failovers, errs = ops+m.Operations, failovers+m.Failovers, errs+m.Errors
			}
			rows = append(rows, append(slices.Clone(base), g.Group, dash(strings.Join(states, ",")),
				strconv.FormatUint(ops, 10), strconv.FormatUint(failovers, 10), strconv.FormatUint(errs, 10), seen))
		}
	}
	return header, rows
}

// makeTokensTable renders the tokens a module offers.
func makeTokensTable(ts []slot.TokenSummary) ([]string, [][]string) {
	rows := make([][]string, len(ts))
	for i, t := range ts {
		rows[i] = []string{strconv.FormatUint(uint64(t.SlotID), 10), dash(t.Label), dash(t.Serial),
			dash(t.Model), dash(t.Manufacturer), yesNo(t.Initialized), fmt.Sprintf("0x%x", t.Flags)}
	}
	return []string{"SLOT", "LABEL", "SERIAL", "MODEL", "MANUFACTURER", "INITIALIZED", "FLAGS"}, rows
}

// makeStatusTable renders the agent's status.
func makeStatusTable(s agent.Status, clientVersion string) ([]string, [][]string) {
	v := s.Version
	if clientVersion != "" && clientVersion != s.Version {
		v += " (hactl is " + clientVersion + ")"
	}
	return []string{"AGENT", "VALUE"}, [][]string{
		{"version", v},
		{"api version", s.APIVersion},
		{"pid", strconv.Itoa(s.PID)},
		{"started", s.Started.UTC().Format(time.RFC3339)},
		{"uptime", s.Uptime},
		{"socket", s.Socket},
		{"config", s.ConfigPath},
		{"groups", report.OrNone(s.Groups)},
		{"your access", s.Access},
	}
}

// tableData carries a header and rows from a make*Table function to
// renderTable in one expression.
type tableData struct {
	header []string
	rows   [][]string
}

func table(header []string, rows [][]string) tableData { return tableData{header, rows} }

// stallCell is a group's unresolved tombstone stall in its table: when and
// on which member, or none.
func stallCell(s *agent.TombstoneStall) string {
	if s == nil {
		return "none"
	}
	return fmt.Sprintf("%s on %s (unresolved: run synchronize)", s.Time.Format(time.RFC3339), dash(s.Member))
}
