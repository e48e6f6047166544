package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

func TestMain(m *testing.M) { os.Exit(testhsm.Main(m, 50)) }

// deadline bounds every wait in these tests.
const deadline = 20 * time.Second

// memberTOML renders a [[group.member]] for a test token.
func memberTOML(name string, tok testhsm.Token, pinFile string, standby bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  [[group.member]]\n  name = %q\n  module = %q\n  token_label = %q\n  pin_file = %q\n", name, tok.Module, tok.Label, pinFile)
	if len(tok.ModuleEnv) > 0 {
		var kv []string
		for k, v := range tok.ModuleEnv {
			kv = append(kv, fmt.Sprintf("%s = %q", k, v))
		}
		slices.Sort(kv)
		fmt.Fprintf(&b, "  module_env = { %s }\n", strings.Join(kv, ", "))
	}
	if standby {
		b.WriteString("  standby = true\n")
	}
	return b.String()
}

type testAgent struct {
	d      *Daemon
	sock   string
	client *agent.Client
	cancel context.CancelFunc
	done   chan error
	cfg    string
}

// startAgent runs a daemon on config text (with $SOCK and $STATE
// replaced) until the test ends.
func startAgent(t *testing.T, cfgText string) *testAgent {
	t.Helper()
	short, err := os.MkdirTemp("", "hd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(short) })
	sock := filepath.Join(short, "agent.sock")
	cfgText = strings.NewReplacer("$SOCK", sock, "$STATE", filepath.Join(short, "state")).Replace(cfgText)
	cfg := filepath.Join(t.TempDir(), "hagroup.toml")
	if err := os.WriteFile(cfg, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := New(Options{ConfigPath: cfg, Version: "test", Open: OpenGroup,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ta := &testAgent{d: d, sock: sock, client: agent.NewClient(sock), cancel: cancel, done: make(chan error, 1), cfg: cfg}
	go func() { ta.done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-ta.done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(deadline):
			t.Errorf("daemon did not stop within %v", deadline)
		}
		ta.client.Close()
	})
	waitFor(t, "agent socket", func() (bool, string) {
		_, err := ta.client.Status(context.Background())
		return err == nil, fmt.Sprint(err)
	})
	return ta
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	end := time.Now().Add(deadline)
	last := ""
	for time.Now().Before(end) {
		ok, s := cond()
		if ok {
			return
		}
		last = s
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: not reached within %v; last: %s", what, deadline, last)
}

func pinFile(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "pin")
	if err := os.WriteFile(p, []byte(testhsm.UserPIN), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func metricValue(body, name, member string) (float64, bool) {
	re := regexp.MustCompile(`(?m)^` + name + `\{group="g",member="` + member + `"\} (\S+)$`)
	m := re.FindStringSubmatch(body)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(m[1], 64)
	return v, err == nil
}

// TestMetricsDuringFailover scrapes /metrics while a p11-kit-served member
// dies: hagroup_member_up drops to 0 and hagroup_failovers_total rises.
func TestMetricsDuringFailover(t *testing.T) {
	local := testhsm.Take(t, 1)[0]
	served := testhsm.Serve(t, "metrics-b")
	pin := pinFile(t)
	ta := startAgent(t, `[agent]
socket = "$SOCK"
state_dir = "$STATE"
metrics = "127.0.0.1:0"

[ha]
probe_interval = "100ms"
interval = "1s"
retries = 0

[[group]]
label = "g"
serial = "1000001"
`+memberTOML("a", local, pin, false)+memberTOML("b", served.Token(), pin, false))
	addr := ta.d.MetricsAddr()
	if addr == "" {
		t.Fatal("no metrics address")
	}
	body := scrape(t, addr)
	for _, name := range []string{"hagroup_member_up", "hagroup_member_inflight", "hagroup_operations_total",
		"hagroup_failovers_total", "hagroup_member_errors_total", "hagroup_recovery_attempts_total", "hagroup_objects_out_of_sync"} {
		if _, ok := metricValue(body, name, "b"); !ok {
			t.Errorf("%s{group=g,member=b} missing from /metrics", name)
		}
	}
	if v, _ := metricValue(body, "hagroup_member_up", "b"); v != 1 {
		t.Fatalf("member b up = %v before the kill\n%s", v, body)
	}
	if v, _ := metricValue(body, "hagroup_failovers_total", "b"); v != 0 {
		t.Fatalf("failovers of b = %v before the kill", v)
	}
	waitFor(t, "a probe duration observed", func() (bool, string) {
		b := scrape(t, addr)
		return strings.Contains(b, `hagroup_operation_duration_seconds_count{group="g",member="b",op="probe"}`), "no probe histogram"
	})

	served.Kill()
	waitFor(t, "member b down in /metrics", func() (bool, string) {
		b := scrape(t, addr)
		up, _ := metricValue(b, "hagroup_member_up", "b")
		fo, _ := metricValue(b, "hagroup_failovers_total", "b")
		return up == 0 && fo >= 1, fmt.Sprintf("up=%v failovers=%v", up, fo)
	})
	if v, _ := metricValue(scrape(t, addr), "hagroup_member_up", "a"); v != 1 {
		t.Errorf("member a up = %v after b died", v)
	}
}

// TestPromlint lints every metric the agent exports, with data in them.
func TestPromlint(t *testing.T) {
	tok := testhsm.Take(t, 1)[0]
	ta := startAgent(t, `[agent]
socket = "$SOCK"
state_dir = "$STATE"

[ha]
probe_interval = "100ms"

[[group]]
label = "g"
serial = "1000001"
`+memberTOML("a", tok, pinFile(t), false))
	waitFor(t, "a probe", func() (bool, string) {
		mfs, err := ta.d.metrics.reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == "hagroup_operation_duration_seconds" {
				return true, ""
			}
		}
		return false, fmt.Sprint(err)
	})
	mfs, err := ta.d.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

// TestReloadRefusesBadConfig: a config that does not validate is refused
// with file:line and the running groups stay; a good one adds a group.
func TestReloadRefusesBadConfig(t *testing.T) {
	toks := testhsm.Take(t, 2)
	pin := pinFile(t)
	base := `[agent]
socket = "$SOCK"
state_dir = "$STATE"

[[group]]
label = "g"
serial = "1000001"
` + memberTOML("a", toks[0], pin, false)
	ta := startAgent(t, base)
	good, _ := os.ReadFile(ta.cfg)
	if err := os.WriteFile(ta.cfg, append(append([]byte{}, good...), []byte("\n[ha]\npolicy = \"fastest\"\n")...), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := ta.d.Reload(t.Context())
	if !errors.Is(err, agent.ErrInvalidConfig) || !regexp.MustCompile(`hagroup.toml:\d+`).MatchString(err.Error()) {
		t.Fatalf("Reload of a bad file = %v, want invalid_config with file:line", err)
	}
	rep, err := ta.client.ListGroups(t.Context(), "")
	if err != nil || len(rep.Groups) != 1 || rep.Groups[0].Label != "g" {
		t.Fatalf("after refused reload: %+v, %v", rep, err)
	}
	more := string(good) + "\n[[group]]\nlabel = \"h\"\nserial = \"1000002\"\n" + memberTOML("b", toks[1], pin, false)
	if err := os.WriteFile(ta.cfg, []byte(more), 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := ta.d.Reload(t.Context())
	if err != nil || !slices.ContainsFunc(res.Changes, func(s string) bool { return strings.Contains(s, `group "h" added`) }) {
		t.Fatalf("Reload = %+v, %v", res, err)
	}
	rep, err = ta.client.ListGroups(t.Context(), "h")
	if err != nil || rep.Groups[0].Members[0].State != agent.StateActive {
		t.Fatalf("group h after reload: %+v, %v", rep, err)
	}
}

// TestConcurrentListGroupsDuringFailover: 64 clients call listgroups while
// a member dies; every call succeeds. The latency distribution is logged
// (speed is for benchmarks, not assertions).
func TestConcurrentListGroupsDuringFailover(t *testing.T) {
	local := testhsm.Take(t, 1)[0]
	served := testhsm.Serve(t, "load-b")
	ta := startAgent(t, `[agent]
socket = "$SOCK"
state_dir = "$STATE"

[ha]
probe_interval = "50ms"
retries = 0

[[group]]
label = "g"
serial = "1000001"
`+memberTOML("a", local, pinFile(t), false)+memberTOML("b", served.Token(), pinFile(t), false))
	const clients, calls = 64, 40
	var mu sync.Mutex
	var lat []time.Duration
	var errs []error
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := agent.NewClient(ta.sock)
			defer c.Close()
			<-start
			for range calls {
				t0 := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				_, err := c.ListGroups(ctx, "")
				cancel()
				d := time.Since(t0)
				mu.Lock()
				lat = append(lat, d)
				if err != nil {
					errs = append(errs, err)
				}
				mu.Unlock()
			}
		}()
	}
	close(start)
	served.Kill()
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d listgroups failed; first: %v", len(errs), clients*calls, errs[0])
	}
	waitFor(t, "member b failed", func() (bool, string) {
		rep, err := ta.client.ListGroups(t.Context(), "g")
		if err != nil {
			return false, err.Error()
		}
		return rep.Groups[0].Members[1].State == "failed", rep.Groups[0].Members[1].State
	})
	slices.Sort(lat)
	p := func(q float64) time.Duration { return lat[int(q*float64(len(lat)-1))] }
	t.Logf("listgroups under %d clients during a failover: %d calls, p50 %v, p99 %v, max %v",
		clients, len(lat), p(0.50), p(0.99), lat[len(lat)-1])
}
