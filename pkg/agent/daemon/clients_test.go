package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/fleet"
	"github.com/hagroup/hagroup/pkg/ha"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
)

func fleetAgent(t *testing.T) (*testAgent, string) {
	t.Helper()
	toks := testhsm.Take(t, 2)
	pin := pinFile(t)
	logFile := filepath.Join(t.TempDir(), "ha.log")
	ta := startAgent(t, `[agent]
socket = "$SOCK"
state_dir = "$STATE"
log_file = "`+logFile+`"
metrics = "127.0.0.1:0"

[ha]
probe_interval = "200ms"
interval = "1s"
retries = 0

[[group]]
label = "g"
serial = "1000001"
`+memberTOML("a", toks[0], pin, false)+memberTOML("b", toks[1], pin, false))
	return ta, logFile
}

func memberOf(gs agent.GroupStatus, name string) agent.MemberStatus {
	for _, m := range gs.Members {
		if m.Name == name {
			return m
		}
	}
	return agent.MemberStatus{}
}

func groupReport(t *testing.T, ta *testAgent) agent.GroupStatus {
	t.Helper()
	rep, err := ta.client.ListGroups(context.Background(), "g")
	if err != nil || len(rep.Groups) != 1 {
		t.Fatalf("listgroups: %v %+v", err, rep)
	}
	return rep.Groups[0]
}

// An application's engine (the Go API with a reporter) sees member b fail
// while the agent's own engine does not: the failure reaches listgroups,
// the metrics, hactl hagroup clients and the HA log, attributed to the
// process; when the process closes, its counts stay in the totals.
func TestFleetReportsReachTheAgent(t *testing.T) {
	ta, _ := fleetAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*deadline)
	defer cancel()
	cfg, err := config.Load(ta.cfg)
	if err != nil {
		t.Fatal(err)
	}
	gc := cfg.Groups[0]
	faults := slottest.NewFaults()
	rep := fleet.Start(fleet.Options{Socket: ta.sock, Program: "fleet-test", Interval: 100 * time.Millisecond})
	g, err := ha.Open(ctx, gc, cfg.Settings(&gc), ha.Options{StateDir: cfg.Agent.StateDir, Interceptor: faults, Report: rep})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Engine().LoginConfigured(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ {
		if _, err := g.Engine().GenerateRandom(ctx, 16); err != nil {
			t.Fatal(err)
		}
	}
	faults.Fail("b", slot.OpGenerateRandom, pkcs11.Error(pkcs11.CKR_DEVICE_ERROR))
	waitFor(t, "b failed in the application", func() (bool, string) {
		g.Engine().GenerateRandom(ctx, 16)
		for _, m := range g.Engine().Members() {
			if m.Name == "b" {
				return m.State == member.Failed, m.State.String()
			}
		}
		return false, "no member b"
	})
	appOps := uint64(0)
	for _, m := range g.Engine().Members() {
		appOps += m.Ops
	}

	waitFor(t, "the application's figures in listgroups", func() (bool, string) {
		gs := groupReport(t, ta)
		a, b := memberOf(gs, "a"), memberOf(gs, "b")
		return b.ClientFailures >= 1 && b.ClientFailovers >= 1 && a.ClientOperations+b.ClientOperations >= appOps && b.Clients == 1,
			fmt.Sprintf("a=%+v b=%+v", a, b)
	})
	gs := groupReport(t, ta)
	if b := memberOf(gs, "b"); b.State != agent.StateActive || b.Failures != 0 {
		t.Errorf("the agent's own view of b: state %s, failures %d; want active, 0 (only the application saw it fail)", b.State, b.Failures)
	}

	body := scrape(t, ta.d.MetricsAddr())
	if v, _ := metricValue(body, "hagroup_member_errors_total", "b"); v < 1 {
		t.Errorf("hagroup_member_errors_total{member=b} = %v, want the application's failure counted", v)
	}
	if v, _ := metricValue(body, "hagroup_failovers_total", "b"); v < 1 {
		t.Errorf("hagroup_failovers_total{member=b} = %v, want the application's failover counted", v)
	}
	if strings.Contains(body, `pid=`) {
		t.Errorf("a metric carries a pid label:\n%s", body)
	}

	cl, err := ta.client.Clients(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(cl.Clients) != 1 {
		t.Fatalf("clients = %+v, want this process", cl.Clients)
	}
	c := cl.Clients[0]
	if c.PID != os.Getpid() || c.UID != os.Getuid() || c.Program != "fleet-test" || len(c.Groups) != 1 || c.Groups[0].Group != "g" {
		t.Errorf("client %+v, want pid %d uid %d program fleet-test group g", c, os.Getpid(), os.Getuid())
	}
	states := map[string]string{}
	for _, m := range c.Groups[0].Members {
		states[m.Name] = m.State
	}
	if states["a"] != "active" || states["b"] != "failed" {
		t.Errorf("client's member states %v, want a active, b failed", states)
	}

	// The HA log: the application's member_failed, saying who saw it.
	var line *agent.Event
	lctx, lcancel := context.WithTimeout(ctx, deadline)
	defer lcancel()
	ta.client.HALog(lctx, agent.HALogRequest{Follow: true}, func(e agent.Event) error {
		if e.Program == "fleet-test" && e.Member == "b" && e.Event == "member_failed" {
			line = &e
			lcancel()
		}
		return nil
	})
	if line == nil {
		t.Fatal("no member_failed of b from fleet-test in the HA log")
	}
	if line.PID != os.Getpid() || line.UID == nil || *line.UID != os.Getuid() || line.Group != "g" || !strings.Contains(line.Detail, "CKR_DEVICE_ERROR") {
		t.Errorf("log line %+v, want pid %d, uid %d, group g and the CKR code", *line, os.Getpid(), os.Getuid())
	}

	// The process closes: it leaves the list, its counts stay.
	before := memberOf(groupReport(t, ta), "b").ClientFailures
	g.Close()
	rep.Close()
	cl, err = ta.client.Clients(ctx)
	if err != nil || len(cl.Clients) != 0 {
		t.Errorf("clients after the final report: %+v, %v; want none", cl.Clients, err)
	}
	if b := memberOf(groupReport(t, ta), "b"); b.ClientFailures < before || b.Clients != 0 {
		t.Errorf("after the process closed: b failures %d (were %d), clients %d; want the count kept, no client", b.ClientFailures, before, b.Clients)
	}
}

// curlAs sends body to path on the agent socket as uid 65534 (nobody),
// returning the HTTP status and the body.
func curlAs(t *testing.T, sock, method, path, body string) (int, string) {
	t.Helper()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is needed to speak to the socket as another uid")
	}
	args := []string{"--reuid=65534", "--regid=65534", "--clear-groups", "curl", "-s", "-o", "-", "-w", "\n%{http_code}",
		"--unix-socket", sock, "-X", method, "-H", "Content-Type: application/json"}
	if body != "" {
		args = append(args, "--data-binary", "@-")
	}
	cmd := exec.Command("setpriv", append(args, "http://"+agent.Host+path)...)
	cmd.Stdin = strings.NewReader(body)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("curl as nobody: %v\n%s", err, out)
	}
	s := strings.TrimSpace(string(out))
	i := strings.LastIndexByte(s, '\n')
	var code int
	fmt.Sscan(s[i+1:], &code)
	return code, s[:max(i, 0)]
}

// A plain local user (nobody) may report — attributed to its own uid and
// pid whatever it claims — and may do nothing else; what it reports about
// groups the agent does not run is not kept (no new metric labels), and a
// report past the bounds is refused.
func TestReportFromAnotherUser(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run a process as another uid")
	}
	ta, logFile := fleetAgent(t)
	if err := os.Chmod(filepath.Dir(ta.sock), 0o711); err != nil {
		t.Fatal(err)
	}
	lie := agent.FleetReport{Program: "liar", PID: 1, Host: "h", Started: time.Now().UTC(), Groups: []agent.FleetGroup{
		{Group: "g", Members: []agent.FleetMember{{Name: "b", State: "failed", Operations: 7, Errors: 3}, {Name: "zz", State: "active", Operations: 1}}},
		{Group: "evil", Members: []agent.FleetMember{{Name: "x", State: "active", Operations: 1}}},
	}, Events: []agent.FleetEvent{{Group: "g", Member: "b", Event: "member_failed", Detail: "from nobody"}, {Group: "evil", Event: "member_failed"}}}
	b, _ := json.Marshal(lie)
	if code, out := curlAs(t, ta.sock, "POST", agent.ReportPath, string(b)); code != 200 {
		t.Fatalf("report as nobody: %d %s, want 200", code, out)
	}
	cl, err := ta.client.Clients(context.Background())
	if err != nil || len(cl.Clients) != 1 {
		t.Fatalf("clients: %+v %v", cl.Clients, err)
	}
	c := cl.Clients[0]
	if c.UID != 65534 || c.PID == 1 || c.PID == 0 {
		t.Errorf("report attributed to uid %d pid %d, want uid 65534 and curl's pid (not the claimed 1)", c.UID, c.PID)
	}
	if len(c.Groups) != 1 || c.Groups[0].Group != "g" || len(c.Groups[0].Members) != 1 {
		t.Errorf("kept %+v, want group g with member b only", c.Groups)
	}
	if body := scrape(t, ta.d.MetricsAddr()); strings.Contains(body, `"evil"`) || strings.Contains(body, `member="zz"`) {
		t.Errorf("a reported unknown group or member became a metric label")
	}
	waitFor(t, "nobody's line in the log file", func() (bool, string) {
		data, _ := os.ReadFile(logFile)
		return bytes.Contains(data, []byte(`"detail":"from nobody","program":"liar","pid":`)) && bytes.Contains(data, []byte(`"uid":65534`)), string(data)
	})
	if data, _ := os.ReadFile(logFile); bytes.Contains(data, []byte(`"group":"evil"`)) {
		t.Errorf("an event of a group the agent does not run was logged:\n%s", data)
	}

	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/v1/recover", `{"group":"g"}`},
		{"POST", "/v1/synchronize", `{"group":"g"}`},
		{"POST", "/v1/reload", `{}`},
		{"GET", "/v1/clients", ""},
		{"GET", "/v1/groups", ""},
		{"GET", "/v1/halog", ""},
	} {
		code, out := curlAs(t, ta.sock, tc.method, tc.path, tc.body)
		if code != 403 || !strings.Contains(out, `"code":"permission_denied"`) || !strings.Contains(out, "uid 65534 may not") {
			t.Errorf("%s %s as nobody: %d %s, want 403 permission_denied", tc.method, tc.path, code, out)
		}
	}

	big := agent.FleetReport{Program: "p", Started: time.Now().UTC()}
	for i := 0; i <= agent.MaxGroups; i++ {
		big.Groups = append(big.Groups, agent.FleetGroup{Group: fmt.Sprint("g", i)})
	}
	b, _ = json.Marshal(big)
	if code, out := curlAs(t, ta.sock, "POST", agent.ReportPath, string(b)); code != 400 || !strings.Contains(out, "at most 64") {
		t.Errorf("a report of %d groups: %d %s, want 400 naming the bound", len(big.Groups), code, out)
	}
	huge := strings.Repeat("x", 600<<10)
	if code, out := curlAs(t, ta.sock, "POST", agent.ReportPath, `{"program":"`+huge+`"}`); code != 400 {
		t.Errorf("a %d KiB report: %d %s, want 400", len(huge)>>10, code, out)
	}
}

func TestClientTableBounds(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	ct := newClientTable()
	ct.now = func() time.Time { return now }
	known := func(g, m string) bool { return g == "g" && (m == "" || m == "a") }
	started := now
	report := func(ops uint64) agent.FleetReport {
		return agent.FleetReport{Program: "p", Started: started, Groups: []agent.FleetGroup{{Group: "g", Members: []agent.FleetMember{{Name: "a", Operations: ops}}}}}
	}
	for pid := 1; pid <= maxPerUID; pid++ {
		if _, err := ct.record(agent.Peer{UID: 1000, PID: pid, Known: true}, report(10), known); err != nil {
			t.Fatalf("pid %d: %v", pid, err)
		}
	}
	_, err := ct.record(agent.Peer{UID: 1000, PID: maxPerUID + 1, Known: true}, report(10), known)
	if e, ok := err.(*agent.Error); !ok || e.Status != tooManyClients || !strings.Contains(e.Message, "uid 1000") {
		t.Fatalf("process %d of uid 1000: %v, want 429 naming the uid", maxPerUID+1, err)
	}
	// Another uid still has room: one user cannot crowd the others out.
	if _, err := ct.record(agent.Peer{UID: 1001, PID: 1, Known: true}, report(5), known); err != nil {
		t.Fatalf("uid 1001: %v", err)
	}
	v := ct.view()
	if got := v.totals[memberKey{"g", "a"}].ops; got != maxPerUID*10+5 {
		t.Errorf("ops total %d, want %d", got, maxPerUID*10+5)
	}
	// A report that goes down (a lie, or a bug) does not lower the totals.
	ct.record(agent.Peer{UID: 1001, PID: 1, Known: true}, report(1), known)
	if got := ct.view().totals[memberKey{"g", "a"}].ops; got != maxPerUID*10+5 {
		t.Errorf("ops total %d after a lower report, want it kept at %d", got, maxPerUID*10+5)
	}
	// Silent processes expire; their counts stay.
	now = now.Add(clientExpiry + time.Second)
	if l := ct.list(); len(l) != 0 {
		t.Errorf("%d clients after the expiry, want none", len(l))
	}
	if got := ct.view().totals[memberKey{"g", "a"}].ops; got != maxPerUID*10+5 {
		t.Errorf("ops total %d after expiry, want %d kept", got, maxPerUID*10+5)
	}
	// A new life under the same pid starts its counts again.
	started = now
	ct.record(agent.Peer{UID: 1001, PID: 1, Known: true}, report(3), known)
	if got := ct.view().totals[memberKey{"g", "a"}].ops; got != maxPerUID*10+5+3 {
		t.Errorf("ops total %d after a restart, want %d", got, maxPerUID*10+5+3)
	}
	// The event budget.
	c := ct.clients[clientKey{1001, 1}]
	es := make([]agent.FleetEvent, agent.MaxEvents)
	for i := range es {
		es[i] = agent.FleetEvent{Group: "g", Member: "a", Event: "member_failed"}
	}
	logged := 0
	for i := 0; i < 3; i++ {
		logged += len(ct.budgetLocked(c, es, now, known))
	}
	if logged != eventBudget || c.refused != uint64(3*agent.MaxEvents-eventBudget) {
		t.Errorf("logged %d of %d events in a minute (refused %d), want %d", logged, 3*agent.MaxEvents, c.refused, eventBudget)
	}
}
