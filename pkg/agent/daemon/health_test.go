package daemon

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/agent"
)

// get returns the status and body of GET http://addr/path.
func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// groupHealthOf reads hagroup_group_health{group="g"} from a scrape.
func groupHealthOf(body string) string {
	m := regexp.MustCompile(`(?m)^hagroup_group_health\{group="g"\} (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		return "absent"
	}
	return m[1]
}

// gaveUpOf reads hagroup_member_recovery_gave_up of member in group g.
func gaveUpOf(body, member string) string {
	v, ok := metricValue(body, "hagroup_member_recovery_gave_up", member)
	if !ok {
		return "absent"
	}
	return fmt.Sprint(v)
}

// TestHealthAndReadiness runs a group of two p11-kit-served members and
// kills them one after the other: /readyz stays 200 while one serves and
// answers 503 naming the group when none does; hagroup_group_health goes
// 2, 1, 0; hagroup_member_recovery_gave_up turns 1 once a member's one
// automatic attempt failed; /healthz stays 200 throughout (the agent
// itself is alive).
func TestHealthAndReadiness(t *testing.T) {
	a, b := testhsm.Serve(t, "ready-a"), testhsm.Serve(t, "ready-b")
	pin := pinFile(t)
	ta := startAgent(t, `[agent]
socket = "$SOCK"
state_dir = "$STATE"
metrics = "127.0.0.1:0"

[ha]
probe_interval = "100ms"
interval = "1s"
retries = 1

[[group]]
label = "g"
serial = "1000001"
`+memberTOML("a", a.Token(), pin, false)+memberTOML("b", b.Token(), pin, false))
	addr := ta.d.MetricsAddr()

	waitFor(t, "group health 2", func() (bool, string) {
		h := groupHealthOf(scrape(t, addr))
		return h == "2", h
	})
	if g := gaveUpOf(scrape(t, addr), "a"); g != "0" {
		t.Fatalf("hagroup_member_recovery_gave_up of a = %s before the kill, want 0", g)
	}
	if code, body := get(t, addr, "/readyz"); code != http.StatusOK || !strings.HasPrefix(body, "ready: 1 group(s)") {
		t.Fatalf("/readyz with both members = %d %q, want 200 ready", code, body)
	}
	if code, body := get(t, addr, "/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/healthz = %d %q, want 200 ok", code, body)
	}

	a.Kill()
	waitFor(t, "group health 1 after a dies", func() (bool, string) {
		h := groupHealthOf(scrape(t, addr))
		return h == "1", h
	})
	if code, body := get(t, addr, "/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz while b serves = %d %q, want 200", code, body)
	}
	waitFor(t, "recovery of a given up", func() (bool, string) {
		body := scrape(t, addr)
		return gaveUpOf(body, "a") == "1" && gaveUpOf(body, "b") == "0", grepLines(body, "gave_up{")
	})

	b.Kill()
	waitFor(t, "group health 0 after b dies", func() (bool, string) {
		h := groupHealthOf(scrape(t, addr))
		return h == "0", h
	})
	code, body := get(t, addr, "/readyz")
	want := regexp.MustCompile(`^not ready: group "g" has no member in service \(a failed, b (failed|recovering)\)\n$`)
	if code != http.StatusServiceUnavailable || !want.MatchString(body) {
		t.Fatalf("/readyz with no member = %d %q, want 503 matching %s", code, body, want)
	}
	if code, body := get(t, addr, "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz with every member down = %d %q, want 200: the agent is alive", code, body)
	}
}

// TestHealthzWedged: while the daemon's state lock is held (a wedged
// agent), /healthz answers 503 within its timeout; once released, 200.
func TestHealthzWedged(t *testing.T) {
	tok := testhsm.Take(t, 1)[0]
	ta := startAgent(t, `[agent]
socket = "$SOCK"
state_dir = "$STATE"
metrics = "127.0.0.1:0"

[[group]]
label = "g"
serial = "1000001"
`+memberTOML("a", tok, pinFile(t), false))
	addr := ta.d.MetricsAddr()
	ta.d.mu.Lock()
	code, body := get(t, addr, "/healthz")
	ta.d.mu.Unlock()
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "haagent does not answer within 2s") {
		t.Fatalf("/healthz of a wedged agent = %d %q, want 503", code, body)
	}
	if code, body := get(t, addr, "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz after = %d %q, want 200", code, body)
	}
}

// TestMetricsBuildInfoAndNoEmptyMember: hagroup_build_info names the Go
// version; group-wide operations (sync check, synchronize, a recover of
// the whole group) are timed without a member label, and no series
// anywhere carries member="".
func TestMetricsBuildInfoAndNoEmptyMember(t *testing.T) {
	ta := metricsAgent(t)
	ctx := t.Context()
	if _, err := ta.client.Synchronize(ctx, agent.SyncRequest{Group: "g", Check: true}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ta.client.Synchronize(ctx, agent.SyncRequest{Group: "g"}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ta.client.Recover(ctx, agent.RecoverRequest{Group: "g"}, nil); err != nil {
		t.Fatal(err)
	}
	addr := ta.d.MetricsAddr()
	waitFor(t, "a probe timed", func() (bool, string) {
		return strings.Contains(scrape(t, addr), `hagroup_operation_duration_seconds_count{group="g",member="a",op="probe"}`), "no probe"
	})
	body := scrape(t, addr)
	for _, op := range []string{"sync_check", "synchronize", "recover"} {
		if s := fmt.Sprintf(`hagroup_group_operation_duration_seconds_count{group="g",op=%q}`, op); !strings.Contains(body, s) {
			t.Errorf("%s missing from /metrics", s)
		}
	}
	if strings.Contains(body, `member=""`) {
		t.Errorf("a series carries member=\"\":\n%s", grepLines(body, `member=""`))
	}
	want := fmt.Sprintf(`(?m)^hagroup_build_info\{goversion=%q,version="[^"]+"\} 1$`, runtime.Version())
	if !regexp.MustCompile(want).MatchString(body) {
		t.Errorf("no line matching %s in /metrics:\n%s", want, grepLines(body, "build_info"))
	}
}

func grepLines(body, s string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// metricsAgent runs an agent with a metrics listener and one group "g" of
// one in-process member "a", probed every 100 ms.
func metricsAgent(t *testing.T) *testAgent {
	t.Helper()
	tok := testhsm.Take(t, 1)[0]
	return startAgent(t, `[agent]
socket = "$SOCK"
state_dir = "$STATE"
metrics = "127.0.0.1:0"

[ha]
probe_interval = "100ms"

[[group]]
label = "g"
serial = "1000001"
`+memberTOML("a", tok, pinFile(t), false))
}
