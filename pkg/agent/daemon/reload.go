package daemon

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/agent/report"
	"github.com/hagroup/hagroup/pkg/config"
)

// Reload implements agent.Backend (and SIGHUP): it re-reads the config
// file and applies it. A file that does not load or validate is refused
// with the reason and the running configuration is kept. Groups added are
// opened, groups removed are closed, groups changed are updated in place
// by their engine (members added, removed, moved to or from standby)
// without touching unchanged members, or reopened when the engine cannot.
func (d *Daemon) Reload(ctx context.Context) (agent.ReloadResult, error) {
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	d.mu.RLock()
	started := d.runCtx != nil
	d.mu.RUnlock()
	if !started {
		return agent.ReloadResult{}, agent.Errorf(agent.CodeUnavailable, "haagent is still starting; reload again")
	}
	path := d.opts.ConfigPath
	cfg, err := config.Load(path)
	if err != nil {
		d.emit(agent.Event{Group: "-", Event: "reload_refused", Detail: err.Error()})
		d.log.Error("reload refused; keeping the running configuration", "config", path, "error", err)
		return agent.ReloadResult{}, agent.Errorf(agent.CodeInvalidConfig, "reload refused, the running configuration is kept: %v", err)
	}
	var changes []string
	d.mu.RLock()
	oldCfg, oldAgent := d.cfg, d.agent
	running := map[string]*groupRun{}
	for l, gr := range d.groups {
		running[l] = gr
	}
	d.mu.RUnlock()

	newAgent := cfg.Agent.WithDefaults()
	changes = append(changes, agentChanges(oldAgent, newAgent, d.opts.Socket != "")...)
	if !reflect.DeepEqual(policyOf(oldAgent), policyOf(newAgent)) {
		if d.server != nil {
			d.server.SetPolicy(policyOf(newAgent))
		}
		changes = append(changes, "socket access (allowed_uids, allowed_group, others_read_only) updated for new connections")
	}
	// The settings that cannot change live stay as they run.
	newAgent.Socket, newAgent.LogFile, newAgent.LogMaxBytes, newAgent.Metrics, newAgent.StateDir =
		oldAgent.Socket, oldAgent.LogFile, oldAgent.LogMaxBytes, oldAgent.Metrics, oldAgent.StateDir

	d.mu.Lock()
	d.cfg, d.agent = cfg, newAgent
	d.mu.Unlock()

	for _, og := range oldCfg.Groups {
		if _, ok := cfg.Group(og.Label); !ok {
			d.stopGroup(og.Label, false)
			changes = append(changes, fmt.Sprintf("group %q removed", og.Label))
		}
	}
	for i := range cfg.Groups {
		g := cfg.Groups[i]
		set := cfg.Settings(&g)
		gr, ok := running[g.Label]
		if !ok {
			d.startGroup(d.runCtx, g, set)
			changes = append(changes, fmt.Sprintf("group %q added with %d member(s)", g.Label, len(g.Members)))
			continue
		}
		if reflect.DeepEqual(gr.cfg, g) && gr.set == set {
			continue
		}
		changes = append(changes, d.updateGroup(ctx, gr, g, set)...)
	}
	d.mu.Lock()
	d.reorderLocked()
	d.mu.Unlock()
	if len(changes) == 0 {
		changes = []string{}
	}
	detail := fmt.Sprintf("%d change(s)", len(changes))
	d.emit(agent.Event{Group: "-", Event: "config_reloaded", Detail: detail})
	for _, c := range changes {
		d.log.Info("reload", "change", c)
	}
	return agent.ReloadResult{SchemaVersion: agent.SchemaVersion, ConfigPath: cfg.Path, Changes: changes}, nil
}

// updateGroup applies a changed group: in place through the engine when
// it can, else by reopening the group.
func (d *Daemon) updateGroup(ctx context.Context, gr *groupRun, g config.Group, set config.Settings) []string {
	eng := gr.engine()
	if eng != nil && g.Serial == gr.cfg.Serial {
		lines, err := eng.Update(ctx, g, set)
		if err == nil {
			// Same engine, new loops with the new settings.
			old := d.stopGroup(g.Label, true)
			ng := &groupRun{cfg: g, set: set, eng: eng, outOfSync: map[string]int{}, stall: d.loadStall(g)}
			if old != nil {
				old.mu.Lock()
				for m, n := range old.outOfSync {
					if _, still := g.Member(m); still {
						ng.outOfSync[m] = n
					}
				}
				old.mu.Unlock()
			}
			d.mu.Lock()
			d.installLocked(ng)
			d.mu.Unlock()
			for _, mc := range memberChanges(gr.cfg, g) {
				d.emit(agent.Event{Group: g.Label, Member: mc.member, Event: mc.event, Detail: mc.detail})
			}
			if len(lines) == 0 {
				lines = []string{fmt.Sprintf("group %q settings updated", g.Label)}
			}
			out := make([]string, len(lines))
			for i, l := range lines {
				out[i] = fmt.Sprintf("group %q: %s", g.Label, l)
			}
			return out
		}
		if !errors.Is(err, ErrReopen) {
			d.log.Warn("updating group in place failed; reopening it", "group", g.Label, "error", err)
		}
	}
	d.stopGroup(g.Label, false)
	d.startGroup(d.runCtx, g, set)
	out := []string{fmt.Sprintf("group %q reopened with the new configuration", g.Label)}
	for _, mc := range memberChanges(gr.cfg, g) {
		d.emit(agent.Event{Group: g.Label, Member: mc.member, Event: mc.event, Detail: mc.detail})
		out = append(out, fmt.Sprintf("group %q: %s: %s (%s)", g.Label, mc.member, mc.event, mc.detail))
	}
	return out
}

type memberChange struct{ member, event, detail string }

// memberChanges lists what changed between two versions of a group's
// members, for the HA log.
func memberChanges(old, nw config.Group) []memberChange {
	var out []memberChange
	for _, m := range nw.Members {
		om, ok := old.Member(m.Name)
		switch {
		case !ok:
			out = append(out, memberChange{m.Name, "member_added", report.TokenSelector(m)})
		case om.Standby != m.Standby && m.Standby:
			out = append(out, memberChange{m.Name, "member_standby", "designated standby"})
		case om.Standby != m.Standby:
			out = append(out, memberChange{m.Name, "member_active", "returned from standby"})
		case !reflect.DeepEqual(*om, m):
			out = append(out, memberChange{m.Name, "member_changed", report.TokenSelector(m)})
		}
	}
	for _, m := range old.Members {
		if _, ok := nw.Member(m.Name); !ok {
			out = append(out, memberChange{m.Name, "member_removed", "removed from the configuration"})
		}
	}
	return out
}

// agentChanges reports [agent] settings that changed but apply only after
// a restart.
func agentChanges(old, nw config.Agent, socketOverridden bool) []string {
	var out []string
	restart := func(key, v string) {
		out = append(out, fmt.Sprintf("agent.%s changed to %q: restart haagent to apply it", key, v))
	}
	if old.Socket != nw.Socket && !socketOverridden {
		restart("socket", nw.Socket)
	}
	if old.LogFile != nw.LogFile {
		restart("log_file", nw.LogFile)
	}
	if old.LogMaxBytes != nw.LogMaxBytes {
		restart("log_max_bytes", fmt.Sprint(nw.LogMaxBytes))
	}
	if old.Metrics != nw.Metrics {
		restart("metrics", nw.Metrics)
	}
	if old.StateDir != nw.StateDir {
		restart("state_dir", nw.StateDir)
	}
	return out
}
