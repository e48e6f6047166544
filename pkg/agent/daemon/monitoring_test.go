package daemon

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
	"go.yaml.in/yaml/v3"
)

// The monitoring files shipped in configs/.
var (
	rulesFile     = filepath.Join("..", "..", "..", "configs", "prometheus", "hagroup-rules.yml")
	rulesTestFile = filepath.Join("..", "..", "..", "configs", "prometheus", "hagroup-rules.test.yml")
	dashboardFile = filepath.Join("..", "..", "..", "configs", "grafana", "hagroup-dashboard.json")
)

// ruleExprs returns each alert's name and expression from the rules file.
func ruleExprs(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	out := map[string]string{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out[r.Alert] = r.Expr
		}
	}
	return out
}

// dashboardExprs returns each panel's title and its query expressions.
func dashboardExprs(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	out := map[string][]string{}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out[p.Title] = append(out[p.Title], tg.Expr)
		}
	}
	return out
}

// exportedNames returns every sample name in a text scrape (a
// histogram's _bucket, _sum and _count included).
func exportedNames(body string) map[string]bool {
	names := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]`).FindAllStringSubmatch(body, -1) {
		names[m[1]] = true
	}
	return names
}

var metricName = regexp.MustCompile(`\bhagroup_[a-z0-9_]+`)

// TestMonitoringConfigsNameExportedMetrics: every metric named by an alert
// rule or a dashboard panel is one a real agent exports, checked against
// a scrape of an agent running a group; and the rules cover what an
// operator must be paged for.
func TestMonitoringConfigsNameExportedMetrics(t *testing.T) {
	rules, panels := ruleExprs(t), dashboardExprs(t)
	for _, want := range []string{"HagroupMemberDown", "HagroupGroupDegraded", "HagroupGroupDown", "HagroupOutOfSync",
		"HagroupRecoveryGaveUp", "HagroupMemberPINBlocked"} {
		if rules[want] == "" {
			t.Errorf("%s has no alert %s", rulesFile, want)
		}
	}

	ta := metricsAgent(t)
	addr := ta.d.MetricsAddr()
	// Histograms appear once observed: a probe, and a group-wide check.
	if _, err := ta.d.Synchronize(t.Context(), agent.SyncRequest{Group: "g", Check: true}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a probe timed", func() (bool, string) {
		return strings.Contains(scrape(t, addr), `hagroup_operation_duration_seconds_count{group="g",member="a",op="probe"}`), "no probe"
	})
	exported := exportedNames(scrape(t, addr))

	check := func(where, expr string) {
		names := metricName.FindAllString(expr, -1)
		if len(names) == 0 {
			t.Errorf("%s: expression %q names no hagroup metric", where, expr)
		}
		for _, n := range names {
			if exported[n] {
				continue
			}
			t.Errorf("%s: %s is not a metric haagent exports", where, n)
		}
	}
	for alert, expr := range rules {
		check(rulesFile+": alert "+alert, expr)
	}
	for title, exprs := range panels {
		for _, e := range exprs {
			check(dashboardFile+": panel "+title, e)
		}
	}
	if len(panels) < 8 {
		t.Errorf("%s has %d panels with queries, want the dashboard's 8 or more", dashboardFile, len(panels))
	}
}

// TestAlertRulesPromtool: promtool accepts the rules and their unit tests
// (each alert fires when, and only when, it should) pass.
func TestAlertRulesPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed: it comes with the Debian package prometheus (scripts/deps.sh installs it)")
	}
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestFile}} {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		out, err := exec.CommandContext(ctx, promtool, args...).CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
