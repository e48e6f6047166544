package main

import (
	"context"
	"os"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/ha"
)

// compareLocal is listgroups' NEEDS SYNC without haagent: each group's
// members compared now by the rule haagent applies (ha.CompareConfigured:
// opened read-only, logged in with the members' own PIN sources). A group
// that cannot be compared (no PIN source, no member up) needs
// synchronisation, as through haagent.
func compareLocal(ctx context.Context, cfg *config.Config, rep *agent.GroupsReport) {
	stateDir := cfg.Agent.StateDir
	if _, err := os.Stat(stateDir); err != nil {
		stateDir = "" // no journal to read; a look creates none
	}
	for i := range rep.Groups {
		gs := &rep.Groups[i]
		if g, ok := cfg.Group(gs.Label); ok {
			at := time.Now()
			counts, err := ha.CompareConfigured(ctx, *g, cfg.Settings(g), stateDir)
			gs.SetSync(at, counts, err)
		}
	}
}
