package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/spf13/cobra"
)

func TestExitCodesUnique(t *testing.T) {
	seen := map[int]string{}
	for _, c := range exitCodes {
		if prev, dup := seen[c.Code]; dup {
			t.Errorf("exit code %d used for both %q and %q", c.Code, prev, c.Name)
		}
		seen[c.Code] = c.Name
	}
	want := map[int]bool{ExitOK: true, ExitError: true, ExitUsage: true, ExitProblem: true, ExitUnreachable: true, ExitPermission: true,
		ExitFailed: true, ExitDeclined: true, ExitInterrupted: true}
	if len(seen) != len(want) {
		t.Errorf("exitCodes lists %d codes, want %d", len(seen), len(want))
	}
}

func TestExitCodeOf(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want int
	}{
		{"nil", nil, ExitOK},
		{"cobra parse error", errors.New("unknown flag: --x"), ExitUsage},
		{"usage from a command", &runError{&usageError{"pass --yes"}}, ExitUsage},
		{"plain failure", &runError{errors.New("boom")}, ExitError},
		{"problem", &runError{&problemError{msg: "out of sync"}}, ExitProblem},
		{"failed actions", &runError{&failedError{msg: "3 copies failed"}}, ExitFailed},
		{"declined", &runError{fmt.Errorf("delete: %w", errDeclined)}, ExitDeclined},
		{"interrupted at a prompt", &runError{fmt.Errorf("prompt: %w", errInterrupted)}, ExitInterrupted},
		{"interrupted in cobra", errInterrupted, ExitInterrupted},
		{"unreachable", &runError{fmt.Errorf("x: %w", &agent.UnreachableError{Path: "/s", Err: errors.New("ENOENT")})}, ExitUnreachable},
		{"agent permission", &runError{agent.Errorf(agent.CodePermissionDenied, "no")}, ExitPermission},
		{"socket permission", &runError{&agent.SocketPermissionError{Path: "/s", Err: errors.New("EACCES")}}, ExitPermission},
		{"file permission", &runError{&fs.PathError{Op: "open", Path: "/etc/x", Err: fs.ErrPermission}}, ExitPermission},
		{"agent not found", &runError{agent.Errorf(agent.CodeNotFound, "no group")}, ExitError},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := exitCodeOf(tc.err); got != tc.want {
				t.Errorf("exitCodeOf(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
}

// walk visits every command of the tree.
func walk(c *cobra.Command, f func(*cobra.Command)) {
	f(c)
	for _, s := range c.Commands() {
		walk(s, f)
	}
}

func TestCommandTree(t *testing.T) {
	root := newRootCmd(newApp(strings.NewReader(""), &bytes.Buffer{}, &bytes.Buffer{}))
	walk(root, func(c *cobra.Command) {
		path := c.CommandPath()
		if c.Short == "" || !unicode.IsUpper([]rune(c.Short)[0]) {
			t.Errorf("%s: Short %q must start with a capital letter", path, c.Short)
		}
		if strings.HasSuffix(c.Short, ".") {
			t.Errorf("%s: Short %q ends with a period", path, c.Short)
		}
		if c.Example == "" {
			t.Errorf("%s: no Example", path)
		}
		if c.RunE == nil && c.Run == nil {
			t.Errorf("%s: no RunE", path)
		}
		if c.Args == nil {
			t.Errorf("%s: no Args validator", path)
		}
		names := map[string]bool{}
		for _, s := range c.Commands() {
			for _, n := range append([]string{s.Name()}, s.Aliases...) {
				if names[n] {
					t.Errorf("%s: two subcommands named %q", path, n)
				}
				names[n] = true
			}
		}
		if c.Flags().Lookup("json") == nil && printsSomething(c) {
			t.Errorf("%s prints but has no --json", path)
		}
		for _, f := range []string{"config", "socket"} {
			if c.Flag(f) == nil {
				t.Errorf("%s: no --%s", path, f)
			}
		}
	})
}

// printsSomething reports whether a leaf command prints a result (every
// leaf except the script generators).
func printsSomething(c *cobra.Command) bool {
	if c.HasSubCommands() || c.Hidden {
		return false
	}
	return c.Parent() == nil || c.Parent().Name() != "completion"
}

// TestManPagesFresh regenerates the man pages and compares them with the
// committed man/ directory: run `make man` when it fails.
func TestManPagesFresh(t *testing.T) {
	dir := t.TempDir()
	root := newRootCmd(newApp(strings.NewReader(""), &bytes.Buffer{}, &bytes.Buffer{}))
	if err := genMan(root, dir); err != nil {
		t.Fatal(err)
	}
	committed := filepath.Join("..", "..", "man")
	want, _ := filepath.Glob(filepath.Join(dir, "*.1"))
	got, _ := filepath.Glob(filepath.Join(committed, "*.1"))
	base := func(ps []string) []string {
		out := make([]string, len(ps))
		for i, p := range ps {
			out[i] = filepath.Base(p)
		}
		return out
	}
	if !slices.Equal(base(want), base(got)) {
		t.Fatalf("man/ holds %v, the commands make %v: run `make man` and commit", base(got), base(want))
	}
	for _, p := range want {
		a, _ := os.ReadFile(p)
		b, _ := os.ReadFile(filepath.Join(committed, filepath.Base(p)))
		if !bytes.Equal(a, b) {
			t.Errorf("man/%s is stale: run `make man` and commit", filepath.Base(p))
		}
	}
}

func TestPrinters(t *testing.T) {
	id := uint(7)
	unlimited, four := -1, 4
	g := agent.GroupStatus{Label: "signing", Serial: "1000001", Healthy: false,
		Settings:  agent.Settings{Policy: "least-busy", RecoveryMode: "activeBasic"},
		NeedsSync: []string{"hsm-b"}, Standbys: []string{"hsm-c"},
		Members: []agent.MemberStatus{
			{Name: "hsm-a", State: "active", Primary: true, SlotID: &id, TokenLabel: "ha-a", TokenSerial: "abc", Operations: 12, AttemptsLeft: &unlimited},
			{Name: "hsm-b", State: "failed", Token: "label=ha-b", LastError: "CKR_DEVICE_ERROR", Failures: 3,
				AttemptsLeft: &four, OutOfSync: 2, NeedsSync: true, ClientOperations: 40, ClientFailures: 2, Clients: 1},
			{Name: "hsm-c", State: "standby", Standby: true, InFlight: 2},
		}}
	h, rows := makeMembersTable(g)
	if h[0] != "MEMBER" || len(h) != len(rows[0]) {
		t.Fatalf("header %v vs row %v", h, rows[0])
	}
	want := [][]string{
		{"hsm-a", "active", "primary", "7", "ha-a", "abc", "0", "12", "0", "0", "0", "0", "unlimited", "no", "-"},
		{"hsm-b", "failed", "active", "-", "label=ha-b", "-", "0", "0", "3", "40", "2", "1", "4", "yes (2)", "CKR_DEVICE_ERROR"},
		{"hsm-c", "standby", "standby", "-", "-", "-", "2", "0", "0", "0", "0", "0", "-", "no", "-"},
	}
	if got := attemptsLeft(agent.MemberStatus{GaveUp: true, AttemptsLeft: &four}); got != "0 (gave up)" {
		t.Errorf("attempts left of a member that gave up = %q", got)
	}
	if got := attemptsLeft(agent.MemberStatus{PINBlocked: true, AttemptsLeft: &four}); got != "0 (PIN refused)" {
		t.Errorf("attempts left of a PIN-blocked member = %q", got)
	}
	if got := needsSync(agent.MemberStatus{NeedsSync: true}); got != "yes" {
		t.Errorf("needs sync without a count = %q", got)
	}
	for i := range want {
		if !slices.Equal(rows[i], want[i]) {
			t.Errorf("row %d = %v, want %v", i, rows[i], want[i])
		}
	}
	_, grows := makeGroupTable(g)
	gm := map[string]string{}
	for _, r := range grows {
		gm[r[0]] = r[1]
	}
	if gm["status"] != "degraded" || gm["needs sync"] != "hsm-b" || gm["standby members"] != "hsm-c" || gm["members"] != "hsm-a, hsm-b, hsm-c" {
		t.Errorf("group table %v", gm)
	}
	_, srows := makeSettingsTable(agent.Settings{Retries: -1, Only: true})
	if srows[0][1] != "yes" || srows[2][1] != "unlimited" {
		t.Errorf("settings rows %v", srows)
	}
	_, drows := makeDiffTable(agent.SyncReport{Differences: []agent.Difference{{Object: "k1", Kind: "missing", Members: []string{"b", "c"}, Action: "copy"}}})
	if !slices.Equal(drows[0], []string{"k1", "missing", "b,c", "copy", "-"}) {
		t.Errorf("diff row %v", drows[0])
	}
	ts := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	uid := 1000
	_, erows := makeEventsTable([]agent.Event{{Time: ts.Add(123456789), Event: "member_failed"},
		{Time: ts, Group: "g", Member: "b", Event: "member_failed", Program: "pkcs11-tool", PID: 42, Host: "h1", UID: &uid}})
	if !slices.Equal(erows[0], []string{"2025-03-04T05:06:07Z", "-", "-", "-", "member_failed", "-"}) {
		t.Errorf("event row %v, want RFC 3339 to the second and dashes for what is empty", erows[0])
	}
	if !slices.Equal(erows[1], []string{"2025-03-04T05:06:07Z", "pkcs11-tool[42]@h1 uid 1000", "g", "b", "member_failed", "-"}) {
		t.Errorf("event row %v, want who saw it", erows[1])
	}
	if l := followLine(agent.Event{Time: ts, Event: "member_failed"}); !strings.HasPrefix(l, "2025-03-04T05:06:07Z  -    ") {
		t.Errorf("follow line %q: an empty column must keep its width", l)
	}
	ch, crows := makeClientsTable(agent.ClientsReport{Clients: []agent.ClientStatus{{PID: 42, UID: 1000, Program: "signload", Host: "h1",
		LastSeen: ts, Groups: []agent.FleetGroup{{Group: "signing", Members: []agent.FleetMember{
			{Name: "a", State: "active", Operations: 10, Errors: 0, Failovers: 0},
			{Name: "b", State: "failed", Operations: 5, Errors: 2, Failovers: 1}}}}}}}, ts.Add(3*time.Second))
	if len(ch) != len(crows[0]) || !slices.Equal(crows[0], []string{"42", "signload", "h1", "1000", "signing", "a=active,b=failed", "15", "1", "2", "3s ago"}) {
		t.Errorf("clients table %v %v", ch, crows)
	}
	_, rrows := makeRecoverTable(agent.RecoverResult{Members: []agent.MemberResult{{Member: "b", OK: false, State: "failed", Detail: "x"}}})
	if !slices.Equal(rrows[0], []string{"b", "failed", "failed", "x"}) {
		t.Errorf("recover row %v", rrows[0])
	}
	_, trows := makeTokensTable([]slot.TokenSummary{{SlotID: 3, Label: "ha-a", Serial: "s", Model: "SoftHSM v2", Flags: 0x40d, Initialized: true}})
	if !slices.Equal(trows[0], []string{"3", "ha-a", "s", "SoftHSM v2", "-", "yes", "0x40d"}) {
		t.Errorf("token row %v", trows[0])
	}
	var buf bytes.Buffer
	if err := renderTable(&buf, table(makeMembersTable(g))); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(buf.String(), "\n") {
		if strings.HasSuffix(line, " ") {
			t.Errorf("trailing blank in %q", line)
		}
	}
	if !strings.HasPrefix(buf.String(), "MEMBER  STATE    ROLE") {
		t.Errorf("table:\n%s", buf.String())
	}
}

// TestNeverPromptsWithoutTerminal: with no terminal, a confirmation is a
// usage error naming --yes, and nothing is read from stdin.
func TestNeverPromptsWithoutTerminal(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "h.toml")
	os.WriteFile(cfg, []byte("[[group]]\nlabel = \"g\"\nserial = \"1000001\"\n  [[group.member]]\n  name = \"a\"\n  module = \"/m.so\"\n  token_label = \"t\"\n"), 0o600)
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"--config", cfg, "--socket", filepath.Join(dir, "none.sock"), "hagroup", "deletegroup", "--label", "g"},
		strings.NewReader("y\n"), &out, &errb)
	if code != ExitUsage || !strings.Contains(errb.String(), "pass --yes") {
		t.Fatalf("code %d, stderr %q", code, errb.String())
	}
	code = run(context.Background(), []string{"--config", cfg, "--socket", filepath.Join(dir, "none.sock"), "hagroup", "deletegroup", "--label", "g", "--yes"},
		strings.NewReader(""), &out, &errb)
	if code != ExitOK {
		t.Fatalf("with --yes: code %d, stderr %q", code, errb.String())
	}
}
