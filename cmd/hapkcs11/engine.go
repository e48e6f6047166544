package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/ha"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/miekg/pkcs11"
)

// virtual is one HA group as a slot: the engine (pkg/group) with its
// recovery (pkg/ha) running in the application's process. The engine keeps
// the login and the sessions, and what an outage does to them.
type virtual struct {
	g *group.Group
	h *ha.Group // g with its recovery; it follows the configuration (reload.go)
}

// openGroups starts every configured group with ha.Open: the engine, the
// automatic recovery of failed members running in this process (as Luna's
// client does), and the tombstone journal in the state directory when this
// process may write it (so that a member that was away cannot bring a
// deleted key back, and recoveries by the agent and by applications exclude
// each other through its lock files); otherwise tombstones are kept in
// memory, which the HA event log then says.
func openGroups(ctx context.Context, cfg *config.Config, log *eventLog) ([]token, func() error, error) {
	stateDir := cfg.Agent.WithDefaults().StateDir
	var groups []*ha.Group
	closeAll := func() error {
		var errs []error
		for _, g := range groups {
			errs = append(errs, g.Close())
		}
		return errors.Join(errs...)
	}
	out := make([]token, 0, len(cfg.Groups))
	for i := range cfg.Groups {
		gc := cfg.Groups[i]
		set := cfg.Settings(&gc)
		g, err := ha.Open(ctx, gc, set, ha.Options{
			StateDir: stateDir,
			// The engine's and the recoverer's events and the members'
			// figures go to haagent (or, without one, to the HA log).
			Report: log.rep,
			// The calls come from the application's threads.
			ThreadCallers: true,
		})
		if err != nil {
			_ = closeAll() // the start failed; the error below says why
			return nil, nil, fmt.Errorf("group %s: %w", gc.Label, err)
		}
		if terr := g.TombstoneError(); terr != nil {
			log.event(gc.Label, "", "tombstones_in_memory", terr.Error())
		}
		groups = append(groups, g)
		out = append(out, &virtual{g: g.Engine(), h: g})
	}
	// Per-member counters for the application, when it asks (stats.go).
	sources := make([]statsSource, len(groups))
	for i, g := range groups {
		sources[i] = g.Engine()
	}
	stats, err := startStats(os.Getenv, sources)
	if err != nil {
		log.event("", "", "stats_off", err.Error())
	}
	return out, func() error { return errors.Join(stats.stop(), closeAll()) }, nil
}

func (v *virtual) SlotInfo() slotInfo {
	return slotInfo{
		Description:  "hagroup virtual slot " + v.g.Label(),
		Manufacturer: manufacturer,
		Present:      true, // a group with every member down still exists: calls fail, the slot stays
	}
}

func (v *virtual) TokenInfo(ctx context.Context) (pkcs11.TokenInfo, error) {
	ti, err := v.g.TokenInfo(ctx)
	if err != nil {
		return ti, err
	}
	ti.Label, ti.SerialNumber = v.g.Label(), v.g.Serial()
	return ti, nil
}

func (v *virtual) Mechanisms(ctx context.Context) ([]uint, error) { return v.g.Mechanisms(ctx) }

func (v *virtual) Withholds(ctx context.Context, mech uint) (bool, error) {
	return v.g.Withholds(ctx, mech)
}

func (v *virtual) MechanismInfo(ctx context.Context, mech uint) (pkcs11.MechanismInfo, error) {
	return v.g.MechanismInfo(ctx, mech)
}

func (v *virtual) Login(ctx context.Context, userType uint, pin secret.PIN) error {
	return v.g.Login(ctx, userType, pin)
}

func (v *virtual) Logout(ctx context.Context) error { return v.g.Logout(ctx) }

func (v *virtual) LoggedIn() (uint, bool) { return v.g.LoggedIn() }

func (v *virtual) OpenSession(ctx context.Context) (session, error) {
	s, err := v.g.OpenSession(ctx, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		return nil, err
	}
	// Every call goes to the engine's session, which alone knows whether
	// it is still valid (in activeBasic a session opened before every
	// member failed answers CKR_SESSION_HANDLE_INVALID) and what
	// operations it has active.
	return &handleSession[group.ObjectHandle]{opCalls: s, objs: s, find: s.Find, check: s.Check, ident: v.g.Identity}, nil
}

func (v *virtual) Close() error { return nil } // the groups close in openGroups' closer
