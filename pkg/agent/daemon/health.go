package daemon

import (
	"context"
	"fmt"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/prometheus/client_golang/prometheus"
)

// Group health, as hagroup_group_health and /readyz read it.
const (
	healthDown     = 0 // no member serves
	healthDegraded = 1 // a member serves, another is out of service
	healthOK       = 2 // every member is in service
)

// inService reports whether a member takes work now or would at once (a
// standby takes work when no active member is left).
func inService(m agent.MemberStatus) bool {
	return m.State == agent.StateActive || m.State == agent.StateStandby
}

// groupHealth is the one rule for a group's health: ok when every member
// is in service, degraded while some are, down when none is.
func groupHealth(g agent.GroupStatus) int {
	serving := 0
	for _, m := range g.Members {
		if inService(m) {
			serving++
		}
	}
	switch {
	case serving == 0:
		return healthDown
	case serving < len(g.Members):
		return healthDegraded
	default:
		return healthOK
	}
}

var (
	descGroupHealth = prometheus.NewDesc("hagroup_group_health",
		"Health of the group (2: ok, every member in service; 1: degraded, a member serves and another is out of service; 0: down, no member serves).",
		[]string{"group"}, nil)
	descGaveUp = prometheus.NewDesc("hagroup_member_recovery_gave_up",
		"Whether automatic recovery of the member ran out of attempts (1: it stays out of service until an operator runs hactl hagroup recover; 0: not given up).",
		[]string{"group", "member"}, nil)
)

// healthCollector exports the health of each group and whether a
// member's automatic recovery gave up, read at scrape time.
type healthCollector struct{ d *Daemon }

// Describe implements prometheus.Collector.
func (c healthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descGroupHealth
	ch <- descGaveUp
}

// Collect implements prometheus.Collector.
func (c healthCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rep, err := c.d.Groups(ctx, "", false)
	if err != nil {
		return
	}
	for _, g := range rep.Groups {
		ch <- prometheus.MustNewConstMetric(descGroupHealth, prometheus.GaugeValue, float64(groupHealth(g)), g.Label)
		for _, ms := range g.Members {
			ch <- prometheus.MustNewConstMetric(descGaveUp, prometheus.GaugeValue, boolValue(ms.GaveUp), g.Label, ms.Name)
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// buildVersion returns the agent's module version and the Go version it
// was built with, from the binary's build information.
func buildVersion() (version, goVersion string) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown", "unknown"
	}
	version = bi.Main.Version
	if version == "" || version == "(devel)" {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				version = s.Value
			}
		}
	}
	if version == "" {
		version = "unknown"
	}
	return version, bi.GoVersion
}

// newBuildInfo returns hagroup_build_info, constantly 1.
func newBuildInfo() prometheus.Collector {
	version, goVersion := buildVersion()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "hagroup_build_info",
		Help:        "Always 1; the labels say which haagent build runs (version: module version or VCS revision; goversion: the Go toolchain).",
		ConstLabels: prometheus.Labels{"version": version, "goversion": goVersion},
	})
	g.Set(1)
	return g
}

// probeTimeout bounds the answer of /healthz and /readyz: a prober waits
// no longer than this for the daemon.
const probeTimeout = 2 * time.Second

// serveHealthz answers liveness: 200 when the daemon's state answers
// within probeTimeout, 503 when it is wedged (a restart is the cure).
func (m *Metrics) serveHealthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), probeTimeout)
	defer cancel()
	done := make(chan struct{})
	go func() {
		m.d.Status(ctx) // takes the daemon's lock, as every request does
		close(done)
	}()
	select {
	case <-done:
		fmt.Fprintln(w, "ok")
	case <-ctx.Done():
		http.Error(w, fmt.Sprintf("haagent does not answer within %v", probeTimeout), http.StatusServiceUnavailable)
	}
}

// serveReadyz answers readiness: 200 when every group has a member in
// service, 503 naming each group that has none.
func (m *Metrics) serveReadyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), probeTimeout)
	defer cancel()
	type answer struct {
		rep agent.GroupsReport
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		rep, err := m.d.Groups(ctx, "", false)
		ch <- answer{rep, err}
	}()
	var a answer
	select {
	case a = <-ch:
	case <-ctx.Done():
		a.err = fmt.Errorf("haagent does not answer within %v", probeTimeout)
	}
	if a.err != nil {
		http.Error(w, "not ready: "+a.err.Error(), http.StatusServiceUnavailable)
		return
	}
	if down := downGroups(a.rep); len(down) > 0 {
		http.Error(w, "not ready: "+strings.Join(down, "; "), http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintf(w, "ready: %d group(s), each with a member in service\n", len(a.rep.Groups))
}

// downGroups describes each group with no member in service.
func downGroups(rep agent.GroupsReport) []string {
	var out []string
	for _, g := range rep.Groups {
		if groupHealth(g) != healthDown {
			continue
		}
		states := make([]string, 0, len(g.Members))
		for _, ms := range g.Members {
			states = append(states, ms.Name+" "+ms.State)
		}
		out = append(out, fmt.Sprintf("group %q has no member in service (%s)", g.Label, strings.Join(states, ", ")))
	}
	return out
}
