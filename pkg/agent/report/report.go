// Package report builds the agent's wire reports (pkg/agent) from a
// configuration and the members' tokens: for haagent, and for hactl when
// no agent runs. It is kept out of pkg/agent so that the typed client and
// its wire types need nothing of the engine.
package report

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/dispatch"
)

// WireSettings converts effective config settings to their wire form.
func WireSettings(s config.Settings) agent.Settings {
	return agent.Settings{
		Only:             s.Only,
		RecoveryMode:     s.RecoveryMode,
		Retries:          s.Retries,
		Interval:         s.Interval.String(),
		CommandTimeout:   s.CommandTimeout.String(),
		KeygenTimeout:    s.KeygenTimeout.String(),
		ProbeInterval:    s.ProbeInterval.String(),
		Policy:           s.Policy,
		FailureThreshold: s.FailureThreshold,
		Hedge:            s.Hedge,
	}
}

// TokenSelector describes how a member's token is chosen, for display.
func TokenSelector(m config.Member) string {
	switch {
	case m.TokenLabel != "":
		return "label=" + m.TokenLabel
	case m.TokenSerial != "":
		return "serial=" + m.TokenSerial
	default:
		return slot.RedactURI(m.URI)
	}
}

// MemberSpec builds the slot.Spec of a member with the given PIN (empty:
// Open does not log in).
func MemberSpec(m config.Member, s config.Settings, pin secret.PIN) slot.Spec {
	spec := member.SlotSpec(m, s)
	spec.PIN = pin
	return spec
}

// ConfigReport lists the configured groups (or one, when group is set)
// with every member's state unknown.
func ConfigReport(c *config.Config, group string) (agent.GroupsReport, error) {
	r := agent.GroupsReport{SchemaVersion: agent.SchemaVersion, Source: agent.SourceConfig, ConfigPath: c.Path,
		Global: WireSettings(c.Settings(nil)), Groups: []agent.GroupStatus{}}
	for i := range c.Groups {
		g := &c.Groups[i]
		if group != "" && g.Label != group {
			continue
		}
		gs := agent.GroupStatus{Label: g.Label, Serial: g.Serial, Settings: WireSettings(c.Settings(g)),
			NeedsSync: []string{}, Standbys: []string{}}
		primary := true
		for _, m := range g.Members {
			ms := agent.MemberStatus{Name: m.Name, Module: m.Module, Token: TokenSelector(m), TokenLabel: m.TokenLabel,
				TokenSerial: m.TokenSerial, Standby: m.Standby, State: agent.StateUnknown}
			if !m.Standby && primary {
				ms.Primary, primary = true, false
			}
			if m.Standby {
				gs.Standbys = append(gs.Standbys, m.Name)
			}
			gs.Members = append(gs.Members, ms)
		}
		r.Groups = append(r.Groups, gs)
	}
	if group != "" && len(r.Groups) == 0 {
		return r, agent.Errorf(agent.CodeNotFound, "group %q is not in %s (groups there: %s)", group, c.Path, groupLabels(c))
	}
	return r, nil
}

func groupLabels(c *config.Config) string {
	var ls []string
	for _, g := range c.Groups {
		ls = append(ls, g.Label)
	}
	return OrNone(ls)
}

// OrNone lists names for a message or a table cell: "a, b", or "none".
func OrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// OpenFunc opens a token; slot.Open in production.
type OpenFunc func(ctx context.Context, spec slot.Spec) (*slot.Slot, error)

// ProbeReport is ConfigReport with every member probed: its token opened
// (without logging in) concurrently, each within its group's
// command_timeout, and its state set to up or down with the error. It is
// what listgroups shows when no agent runs.
func ProbeReport(ctx context.Context, c *config.Config, group string, open OpenFunc) (agent.GroupsReport, error) {
	r, err := ConfigReport(c, group)
	if err != nil {
		return r, err
	}
	var wg sync.WaitGroup
	for gi := range r.Groups {
		gs := &r.Groups[gi]
		cg, _ := c.Group(gs.Label)
		set := c.Settings(cg)
		for mi := range gs.Members {
			ms := &gs.Members[mi]
			cm, _ := cg.Member(ms.Name)
			wg.Add(1)
			go func() {
				defer wg.Done()
				probeMember(ctx, open, MemberSpec(*cm, set, secret.PIN{}), set.CommandTimeout, ms)
			}()
		}
	}
	wg.Wait()
	for gi := range r.Groups {
		gs := &r.Groups[gi]
		gs.Healthy = true
		for _, m := range gs.Members {
			if !m.Standby && m.State != agent.StateUp {
				gs.Healthy = false
			}
		}
	}
	return r, nil
}

func probeMember(ctx context.Context, open OpenFunc, spec slot.Spec, timeout time.Duration, ms *agent.MemberStatus) {
	ctx, cancel := context.WithTimeout(ctx, dispatch.CommandTimeout(timeout))
	defer cancel()
	s, err := open(ctx, spec)
	if err != nil {
		ms.State, ms.LastError = agent.StateDown, err.Error()
		return
	}
	defer s.Close()
	info, err := s.TokenInfo(ctx)
	if err != nil {
		ms.State, ms.LastError = agent.StateDown, err.Error()
		return
	}
	id := s.SlotID()
	ms.SlotID = &id
	ms.TokenLabel = strings.TrimRight(info.Label, " ")
	ms.TokenSerial = strings.TrimRight(info.SerialNumber, " ")
	ms.State = agent.StateUp
}

// TokenNotFound explains a token that a module does not offer, naming the
// tokens it does offer, e.g. `member "hsm-b": token label "ha-b" not found
// in /usr/lib/softhsm/libsofthsm2.so; tokens there: ha-a, ha-c`.
func TokenNotFound(m config.Member, tokens []slot.TokenSummary) error {
	var there []string
	for _, t := range tokens {
		if t.Initialized {
			there = append(there, t.Label)
		}
	}
	slices.Sort(there)
	var what string
	switch {
	case m.TokenLabel != "":
		what = fmt.Sprintf("token label %q", m.TokenLabel)
	case m.TokenSerial != "":
		what = fmt.Sprintf("token serial %q", m.TokenSerial)
	default:
		what = fmt.Sprintf("token URI %q", slot.RedactURI(m.URI))
	}
	return fmt.Errorf("member %q: %s not found in %s; tokens there: %s", m.Name, what, m.Module, OrNone(there))
}

// CheckToken opens a member's token as a group would (logging in with its
// PIN when it has one) and closes it again. A token that is not found is
// explained by listing the tokens the module offers.
func CheckToken(ctx context.Context, m config.Member, s config.Settings, open OpenFunc,
	list func(ctx context.Context, module string, env map[string]string) ([]slot.TokenSummary, error)) error {
	pin, err := m.ReadPIN()
	if err != nil {
		return NameMember(m.Name, err)
	}
	defer pin.Zero()
	ctx, cancel := context.WithTimeout(ctx, dispatch.CommandTimeout(s.CommandTimeout))
	defer cancel()
	sl, err := open(ctx, MemberSpec(m, s, pin))
	if err != nil {
		if errors.Is(err, slot.ErrTokenNotFound) {
			if ts, lerr := list(ctx, m.Module, m.ModuleEnv); lerr == nil {
				return TokenNotFound(m, ts)
			}
		}
		return NameMember(m.Name, err)
	}
	return sl.Close()
}

// NameMember prefixes err with the member's name unless its message
// already names it.
func NameMember(name string, err error) error {
	if slot.NamesMember(err, name) || strings.Contains(err.Error(), fmt.Sprintf("%q", name)) {
		return err
	}
	return fmt.Errorf("member %q: %w", name, err)
}
