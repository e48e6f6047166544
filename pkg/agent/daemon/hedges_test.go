package daemon

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/fleet"
	"github.com/hagroup/hagroup/pkg/ha"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
)

// An application's requests hedged away from a slow member show in listgroups (the group's hedges, the member's clientHedges) and
// in hagroup_hedges_total{group}.
func TestHedgesReachListgroupsAndMetrics(t *testing.T) {
	ta, _ := fleetAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*deadline)
	defer cancel()
	cfg, err := config.Load(ta.cfg)
	if err != nil {
		t.Fatal(err)
	}
	gc := cfg.Groups[0]
	set := cfg.Settings(&gc)
	set.Policy = config.PolicyPrimaryBackup // every request goes to a first
	faults := slottest.NewFaults()
	rep := fleet.Start(fleet.Options{Socket: ta.sock, Program: "hedge-test", Interval: 100 * time.Millisecond})
	defer rep.Close()
	g, err := ha.Open(ctx, gc, set, ha.Options{StateDir: cfg.Agent.StateDir, Interceptor: faults, Report: rep})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Engine().LoginConfigured(ctx); err != nil {
		t.Fatal(err)
	}
	// Enough calls for a p95 and a hedge in the budget.
	for range 60 {
		if _, err := g.Engine().GenerateRandom(ctx, 16); err != nil {
			t.Fatal(err)
		}
	}
	// a slowed far past its p95: its requests are hedged to b as often as
	// the budget allows (40 calls earn 2 hedges).
	faults.Delay("a", slot.OpGenerateRandom, 50*time.Millisecond)
	for range 40 {
		if _, err := g.Engine().GenerateRandom(ctx, 16); err != nil {
			t.Fatalf("random with a slow: %v", err)
		}
	}
	faults.Heal("a")
	hedges, aHedges := g.Engine().Hedges(), uint64(0)
	for _, m := range g.Engine().Members() {
		if m.Name == "a" {
			aHedges = m.Hedges
		}
	}
	if hedges < 1 || aHedges < 1 {
		t.Fatalf("the application hedged %d requests, %d of them a's; want a's slow ones hedged", hedges, aHedges)
	}

	waitFor(t, "the hedge in listgroups", func() (bool, string) {
		gs := groupReport(t, ta)
		return gs.Hedges == hedges && memberOf(gs, "a").ClientHedges == aHedges,
			fmt.Sprintf("group hedges %d, a %+v; want %d, a's %d", gs.Hedges, memberOf(gs, "a"), hedges, aHedges)
	})
	body := scrape(t, ta.d.MetricsAddr())
	m := regexp.MustCompile(`(?m)^hagroup_hedges_total\{group="g"\} (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no hagroup_hedges_total{group=\"g\"} in\n%s", body)
	}
	if v, _ := strconv.ParseFloat(m[1], 64); v != float64(hedges) {
		t.Errorf("hagroup_hedges_total{group=g} = %v, want the application's %d", v, hedges)
	}
}
