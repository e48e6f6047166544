package daemon

import (
	"context"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metric descriptions. Names follow Prometheus conventions (and are
// checked with promlint in the tests); every Help says the unit and what
// the values mean.
var (
	descMemberUp = prometheus.NewDesc("hagroup_member_up",
		"Whether the member is in service (1: active or standby, 0: failed, recovering or not open).",
		[]string{"group", "member"}, nil)
	descInflight = prometheus.NewDesc("hagroup_member_inflight",
		"Operations in flight on the member right now, as seen by this agent's engine.",
		[]string{"group", "member"}, nil)
	descOperations = prometheus.NewDesc("hagroup_operations_total",
		"Operations completed on the member by this agent's engine (probes, recovery, synchronisation) and by every application that reports to it (pkg/fleet; processes gone keep their share).",
		[]string{"group", "member"}, nil)
	descErrors = prometheus.NewDesc("hagroup_member_errors_total",
		"Operations on the member that failed for a health reason (charged to the member), in this agent and in every application that reports to it.",
		[]string{"group", "member"}, nil)
	descFailovers = prometheus.NewDesc("hagroup_failovers_total",
		"Times the member was dropped from rotation (failed over), in this agent and in every application that reports to it.",
		[]string{"group", "member"}, nil)
	descRecoveries = prometheus.NewDesc("hagroup_recovery_attempts_total",
		"Recovery attempts of the member, automatic and manual.",
		[]string{"group", "member"}, nil)
	descPINBlocked = prometheus.NewDesc("hagroup_member_pin_blocked",
		"Whether the member's token refused its PIN (1: no automatic login or recovery until an operator runs hactl hagroup recover, 0: not blocked).",
		[]string{"group", "member"}, nil)
	descHedges = prometheus.NewDesc("hagroup_hedges_total",
		"Single-part requests of the group sent to a second member because the first was slow to answer (hedged), in this agent and in every application that reports to it.",
		[]string{"group"}, nil)
	descOutOfSync = prometheus.NewDesc("hagroup_objects_out_of_sync",
		"Objects that differ between this member and the rest of its group, compared when scraped (0: in sync; NaN: the members could not be compared).",
		[]string{"group", "member"}, nil)
)

type memberKey struct{ group, member string }

// Metrics exports the daemon's view of every group to Prometheus. Gauges
// and engine counters are read at scrape time; failovers and recovery
// attempts are counted from the HA events; durations are observed by the
// daemon around the operations it runs.
type Metrics struct {
	d   *Daemon
	reg *prometheus.Registry

	durations      *prometheus.HistogramVec // operations on one member
	groupDurations *prometheus.HistogramVec // group-wide operations

	mu         sync.Mutex
	failovers  map[memberKey]uint64
	recoveries map[memberKey]uint64
}

// NewMetrics returns the metrics of d, registered in their own registry.
func NewMetrics(d *Daemon) *Metrics {
	m := &Metrics{
		d:   d,
		reg: prometheus.NewRegistry(),
		durations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hagroup_operation_duration_seconds",
			Help:    "Duration in seconds of the operations the agent runs on one member (op: probe, recover).",
			Buckets: durationBuckets,
		}, []string{"group", "member", "op"}),
		groupDurations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hagroup_group_operation_duration_seconds",
			Help:    "Duration in seconds of the operations the agent runs on a whole group (op: recover, synchronize, sync_check).",
			Buckets: durationBuckets,
		}, []string{"group", "op"}),
		failovers:  map[memberKey]uint64{},
		recoveries: map[memberKey]uint64{},
	}
	m.reg.MustRegister(m, m.durations, m.groupDurations, healthCollector{d}, newBuildInfo(), collectors.NewGoCollector())
	return m
}

// Handler serves /metrics, /healthz (liveness) and /readyz (every group
// has a member in service).
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", m.serveHealthz)
	mux.HandleFunc("GET /readyz", m.serveReadyz)
	return mux
}

var durationBuckets = []float64{.0005, .001, .005, .01, .05, .1, .5, 1, 5, 20, 60}

// observe records an operation's duration: on one member, or on the whole
// group when member is "" (never a member="" series).
func (m *Metrics) observe(group, member, op string, d time.Duration) {
	if member == "" {
		m.groupDurations.WithLabelValues(group, op).Observe(d.Seconds())
		return
	}
	m.durations.WithLabelValues(group, member, op).Observe(d.Seconds())
}

func (m *Metrics) countEvent(e agent.Event) {
	if e.Member == "" {
		return
	}
	k := memberKey{e.Group, e.Member}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch e.Event {
	case "member_failed":
		m.failovers[k]++
	case "member_recovering":
		m.recoveries[k]++
	}
}

func (m *Metrics) forgetGroup(group string) {
	m.mu.Lock()
	for k := range m.failovers {
		if k.group == group {
			delete(m.failovers, k)
		}
	}
	for k := range m.recoveries {
		if k.group == group {
			delete(m.recoveries, k)
		}
	}
	m.mu.Unlock()
	m.durations.DeletePartialMatch(prometheus.Labels{"group": group})
	m.groupDurations.DeletePartialMatch(prometheus.Labels{"group": group})
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descMemberUp, descInflight, descOperations, descErrors, descFailovers, descRecoveries, descOutOfSync, descPINBlocked, descHedges} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rep, err := m.d.Groups(ctx, "", false)
	if err != nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, g := range rep.Groups {
		ch <- prometheus.MustNewConstMetric(descHedges, prometheus.CounterValue, float64(g.Hedges), g.Label)
		for _, ms := range g.Members {
			up := 0.0
			if ms.State == agent.StateActive || ms.State == agent.StateStandby {
				up = 1
			}
			k := memberKey{g.Label, ms.Name}
			ch <- prometheus.MustNewConstMetric(descMemberUp, prometheus.GaugeValue, up, g.Label, ms.Name)
			ch <- prometheus.MustNewConstMetric(descInflight, prometheus.GaugeValue, float64(ms.InFlight), g.Label, ms.Name)
			ch <- prometheus.MustNewConstMetric(descOperations, prometheus.CounterValue, fleetOps(ms), g.Label, ms.Name)
			ch <- prometheus.MustNewConstMetric(descErrors, prometheus.CounterValue, fleetErrors(ms), g.Label, ms.Name)
			ch <- prometheus.MustNewConstMetric(descFailovers, prometheus.CounterValue, float64(m.failovers[k]+ms.ClientFailovers), g.Label, ms.Name)
			ch <- prometheus.MustNewConstMetric(descRecoveries, prometheus.CounterValue, float64(m.recoveries[k]), g.Label, ms.Name)
			blocked := 0.0
			if ms.PINBlocked {
				blocked = 1
			}
			ch <- prometheus.MustNewConstMetric(descPINBlocked, prometheus.GaugeValue, blocked, g.Label, ms.Name)
			ch <- prometheus.MustNewConstMetric(descOutOfSync, prometheus.GaugeValue, outOfSyncValue(ms), g.Label, ms.Name)
		}
	}
}

// The fleet's share of the member counters: the agent's own figures plus
// what the reporting applications saw (clients.go sums them).
func fleetOps(ms agent.MemberStatus) float64    { return float64(ms.Operations + ms.ClientOperations) }
func fleetErrors(ms agent.MemberStatus) float64 { return float64(ms.Failures + ms.ClientFailures) }

// outOfSyncValue is a member's hagroup_objects_out_of_sync: its
// differences, or NaN when it needs synchronisation by no count (its group
// could not be compared: see markSync), which must not read as 0, in sync.
func outOfSyncValue(ms agent.MemberStatus) float64 {
	if ms.NeedsSync && ms.OutOfSync == 0 {
		return math.NaN()
	}
	return float64(ms.OutOfSync)
}
