package ha

import (
	"context"
	"fmt"

	"github.com/hagroup/hagroup/pkg/config"
)

// CompareConfigured is what a process that does not run the group (hactl
// listgroups without haagent) learns of how far each member is out of
// sync: the group opened read-only (Options.ReadOnly: nothing is recovered
// or caught up), its members logged in with their own PIN sources
// (LoginConfigured, which reads the behind marks as every login does),
// compared now by the one rule (Group.OutOfSync), and closed. It fails
// when the members cannot be compared: none logged in, none in service.
func CompareConfigured(ctx context.Context, g config.Group, s config.Settings, stateDir string) (map[string]int, error) {
	h, err := Open(ctx, g, s, Options{StateDir: stateDir, ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer h.Close()
	if err := h.g.LoginConfigured(ctx); err != nil {
		return nil, fmt.Errorf("group %s: members not compared: %w", g.Label, err)
	}
	return h.OutOfSync(ctx)
}
