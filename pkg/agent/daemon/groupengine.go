package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/recover"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	hasync "github.com/hagroup/hagroup/pkg/sync"
	"github.com/hagroup/hagroup/pkg/sync/tombstone"
	"github.com/miekg/pkcs11"
)

// groupEngine is the real Engine: a pkg/group Group, a pkg/recover
// Recoverer for automatic and manual recovery, the group's tombstone
// journal, and sync plans for synchronize.
type groupEngine struct {
	g     *group.Group
	cfg   config.Group
	set   config.Settings
	tombs *tombstone.Journal // nil when the state directory is unusable
	rec   atomic.Pointer[recover.Recoverer]
	emit  func(agent.Event)

	mu     sync.Mutex
	tokens map[string]tokenSeen // member → what its last successful probe saw
}

type tokenSeen struct {
	label, serial string
}

// OpenGroup is the production Opener: it opens the group's members (a
// member down at start-up starts failed and is recovered later), logs in
// the members that have a PIN source, and starts recovery.
func OpenGroup(ctx context.Context, g config.Group, s config.Settings, env Env, emit func(agent.Event)) (Engine, error) {
	ge := &groupEngine{cfg: g, set: s, emit: emit, tokens: map[string]tokenSeen{}}
	opts := group.Options{Events: group.EventFunc(ge.onGroupEvent)}
	if env.StateDir != "" {
		j, err := tombstone.Open(env.StateDir, g.Serial, tombstone.Options{Horizon: s.TombstoneHorizon})
		if err != nil {
			emit(agent.Event{Group: g.Label, Event: "tombstones_unavailable", Detail: err.Error()})
		} else {
			ge.tombs = j
			opts.Tombstones = j
		}
	}
	gr, err := group.Open(ctx, g, s, opts)
	if err != nil {
		ge.closeTombs()
		return nil, err
	}
	ge.g = gr
	hasPIN := false
	for _, m := range g.Members {
		hasPIN = hasPIN || m.HasPIN()
	}
	if hasPIN {
		if err := gr.Login(ctx, pkcs11.CKU_USER, secret.PIN{}); err != nil {
			emit(agent.Event{Group: g.Label, Event: "login_failed", Detail: err.Error()})
		}
	}
	stateDir := env.StateDir
	if ge.tombs == nil {
		stateDir = ""
	}
	ropts := recover.Options{
		Engine:   gr,
		StateDir: stateDir,
		Interval: s.Interval,
		Retries:  s.Retries,
		Events:   ge.onRecoverEvent,
	}
	if ge.tombs != nil {
		ropts.Tombstones = ge.tombs
	}
	rec, err := recover.New(ropts)
	if err != nil {
		gr.Close()
		ge.closeTombs()
		return nil, fmt.Errorf("group %q: %w", g.Label, err)
	}
	ge.rec.Store(rec)
	// Members that failed while the group opened (before the recoverer
	// existed) start their recovery episode now.
	for _, m := range gr.Members() {
		if m.State == member.Failed {
			rec.MemberFailed(m.Name)
		}
	}
	return ge, nil
}

func (ge *groupEngine) closeTombs() {
	if ge.tombs != nil {
		ge.tombs.Close()
	}
}

func (ge *groupEngine) onGroupEvent(e group.Event) {
	ae := agent.Event{Time: e.Time, Group: ge.cfg.Label, Member: e.Member, Event: string(e.Kind)}
	var parts []string
	if e.From != 0 || e.To != 0 {
		parts = append(parts, fmt.Sprintf("%s -> %s", e.From, e.To))
	}
	if e.Object.ID != nil || e.Object.Label != "" {
		parts = append(parts, e.Object.String())
	}
	if e.Err != nil {
		parts = append(parts, e.Err.Error())
	}
	ae.Detail = strings.Join(parts, ": ")
	ge.emit(ae)
	if e.Kind == group.MemberFailed {
		if rec := ge.rec.Load(); rec != nil {
			rec.MemberFailed(e.Member)
		}
	}
}

func (ge *groupEngine) onRecoverEvent(e recover.Event) {
	ae := agent.Event{Time: e.Time, Group: ge.cfg.Label, Member: e.Member, Event: string(e.Kind)}
	var parts []string
	if e.Manual {
		parts = append(parts, "manual")
	} else if e.Attempt > 0 {
		parts = append(parts, fmt.Sprintf("attempt %d", e.Attempt))
	}
	if e.Kind == recover.Recovered {
		parts = append(parts, fmt.Sprintf("copied %d, deleted %d", e.Copied, e.Deleted))
	}
	for _, c := range e.Conflicts {
		parts = append(parts, c.String())
	}
	if e.Err != nil {
		parts = append(parts, e.Err.Error())
	}
	ae.Detail = strings.Join(parts, ": ")
	ge.emit(ae)
}

// Status implements Engine.
func (ge *groupEngine) Status(ctx context.Context) agent.GroupStatus {
	st := ge.g.Status()
	gs := agent.GroupStatus{Label: ge.cfg.Label, Serial: ge.cfg.Serial}
	ge.mu.Lock()
	defer ge.mu.Unlock()
	for _, s := range st.Members {
		cm, _ := ge.cfg.Member(s.Name)
		ms := agent.MemberStatus{Name: s.Name, Standby: s.ConfiguredStandby, Primary: st.Primary == s.Name,
			State: s.State.String(), LastError: s.LastError, InFlight: s.InFlight, Operations: s.Ops, Failures: s.Errors}
		if cm != nil {
			ms.Module, ms.Token, ms.TokenLabel, ms.TokenSerial = cm.Module, agent.TokenSelector(*cm), cm.TokenLabel, cm.TokenSerial
		}
		if seen, ok := ge.tokens[s.Name]; ok {
			ms.TokenLabel, ms.TokenSerial = seen.label, seen.serial
		}
		if m, ok := ge.g.Member(s.Name); ok && s.State.Serving() {
			if sl := m.Slot(); sl != nil {
				id := sl.SlotID()
				ms.SlotID = &id
			}
		}
		gs.Members = append(gs.Members, ms)
	}
	return gs
}

// Probe implements Engine: a TokenInfo call on every serving member; a
// health failure fails the member (and starts its recovery).
func (ge *groupEngine) Probe(ctx context.Context) []ProbeResult {
	snaps := ge.g.Members()
	res := make([]ProbeResult, len(snaps))
	var wg sync.WaitGroup
	for i, s := range snaps {
		res[i].Member = s.Name
		if !s.State.Serving() {
			continue
		}
		m, ok := ge.g.Member(s.Name)
		if !ok {
			continue
		}
		sl := m.Slot()
		if sl == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			timeout := ge.set.CommandTimeout
			if timeout <= 0 {
				timeout = config.DefaultCommandTimeout
			}
			pctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			start := time.Now()
			info, err := sl.TokenInfo(pctx)
			res[i].Duration, res[i].Err = time.Since(start), err
			switch {
			case err == nil:
				ge.mu.Lock()
				ge.tokens[s.Name] = tokenSeen{strings.TrimRight(info.Label, " "), strings.TrimRight(info.SerialNumber, " ")}
				ge.mu.Unlock()
			case ctx.Err() == nil && slot.ClassOf(err) == slot.ClassHealth:
				ge.g.FailMember(s.Name, fmt.Errorf("health probe: %w", err))
			}
		}()
	}
	wg.Wait()
	return res
}

// Recover implements Engine.
func (ge *groupEngine) Recover(ctx context.Context, name string) ([]agent.MemberResult, error) {
	rec := ge.rec.Load()
	var names []string
	if name != "" {
		names = []string{name}
	} else {
		for _, s := range ge.g.Members() {
			if s.State == member.Failed || s.State == member.Recovering {
				names = append(names, s.Name)
			}
		}
	}
	out := []agent.MemberResult{}
	for _, n := range names {
		r, err := rec.Recover(ctx, n)
		mr := agent.MemberResult{Member: n, OK: err == nil}
		if m, ok := ge.g.Member(n); ok {
			mr.State = m.State().String()
		}
		switch {
		case errors.Is(err, recover.ErrNotFailed) && name != "" && (mr.State == "active" || mr.State == "standby"):
			mr.OK, mr.Detail = true, "in service already: nothing to recover"
		case errors.Is(err, recover.ErrInProgress):
			mr.Detail = "another recovery of this member is running: " + err.Error()
		case err != nil:
			mr.Detail = err.Error()
		default:
			mr.Detail = fmt.Sprintf("caught up: copied %d, deleted %d", r.CatchUp.Copied, r.CatchUp.Deleted)
		}
		out = append(out, mr)
	}
	return out, nil
}

// Synchronize implements Engine: plan over the serving members (a member
// that is failed, or does not answer, is reported as a difference: it
// cannot be compared), then apply unless req.Check.
func (ge *groupEngine) Synchronize(ctx context.Context, req agent.SyncRequest) (agent.SyncReport, error) {
	rep := agent.SyncReport{Group: ge.cfg.Label, Checked: req.Check, Differences: []agent.Difference{}}
	var peers []hasync.PlanMember
	for _, s := range ge.g.Members() {
		m, ok := ge.g.Member(s.Name)
		if ok && s.State.Serving() && m.Slot() != nil {
			peers = append(peers, hasync.PlanMember{Name: s.Name, Slot: m.Slot()})
			continue
		}
		if s.State == member.Removed {
			continue
		}
		rep.Differences = append(rep.Differences, agent.Difference{Object: "*", Kind: "unreachable",
			Members: []string{s.Name}, Action: "none: caught up when it recovers", Detail: "member is " + s.State.String()})
	}
	if len(peers) == 0 {
		return rep, agent.Errorf(agent.CodeMemberUnreachable, "group %q: no member in service to synchronise", ge.cfg.Label)
	}
	var tombs hasync.Tombstones
	if ge.tombs != nil {
		set, err := ge.tombs.Snapshot(ctx)
		if err != nil {
			return rep, fmt.Errorf("group %q: reading tombstones: %w", ge.cfg.Label, err)
		}
		tombs = set
	}
	plan, err := hasync.MakePlan(ctx, peers, tombs, hasync.PlanOptions{Prune: req.Prune, SkipUnreachable: true})
	if err != nil {
		return rep, fmt.Errorf("group %q: %w", ge.cfg.Label, err)
	}
	for name, err := range plan.Skipped {
		rep.Differences = append(rep.Differences, agent.Difference{Object: "*", Kind: "unreachable",
			Members: []string{name}, Action: "none: not listed", Detail: err.Error()})
	}
	for _, a := range plan.Actions {
		rep.Differences = append(rep.Differences, agent.Difference{Object: a.Identity.String(), Kind: string(a.Reason),
			Members: []string{a.Member}, Action: a.String()})
	}
	for _, c := range plan.Conflicts {
		var holders []string
		for _, v := range c.Versions {
			holders = append(holders, v.Members...)
		}
		rep.Differences = append(rep.Differences, agent.Difference{Object: c.Identity.String(), Kind: "conflict",
			Members: holders, Action: "none: an operator must resolve it", Detail: c.String()})
	}
	rep.Conflicts = len(plan.Conflicts)
	rep.InSync = len(rep.Differences) == 0
	if req.Check || len(plan.Actions) == 0 {
		return rep, nil
	}
	r := hasync.Replicator{GroupSerial: ge.cfg.Serial}
	res, err := r.Apply(ctx, plan)
	if res != nil {
		rep.Applied = len(res.Done)
		for _, f := range res.Failed {
			rep.Differences = append(rep.Differences, agent.Difference{Object: f.Action.Identity.String(), Kind: "failed",
				Members: []string{f.Action.Member}, Action: f.Action.String(), Detail: f.Error()})
		}
	}
	if err != nil && res == nil {
		return rep, fmt.Errorf("group %q: %w", ge.cfg.Label, err)
	}
	return rep, nil
}

// Update implements Engine. pkg/group cannot add or remove members of an
// open group yet, so every change reopens the group.
func (ge *groupEngine) Update(ctx context.Context, g config.Group, s config.Settings) ([]string, error) {
	return nil, ErrReopen
}

// Close implements Engine.
func (ge *groupEngine) Close() error {
	if rec := ge.rec.Load(); rec != nil {
		rec.Close()
	}
	err := ge.g.Close()
	ge.closeTombs()
	return err
}

// recoverEngine adapts a Group to recover.Engine with the group's
// exported methods.
type recoverEngine struct{ g *group.Group }

func (e recoverEngine) GroupSerial() string { return e.g.Serial() }

func (e recoverEngine) BeginRecovery(name string) error {
	m, ok := e.g.Member(name)
	if !ok {
		return fmt.Errorf("group %q has no member %q", e.g.Label(), name)
	}
	if !m.CompareAndTransition(member.Failed, member.Recovering, nil) {
		return fmt.Errorf("member %q is %s: %w", name, m.State(), recover.ErrNotFailed)
	}
	return nil
}

func (e recoverEngine) ReopenMember(ctx context.Context, name string) (*slot.Slot, error) {
	return e.g.Reconnect(ctx, name)
}

func (e recoverEngine) SyncPeers(name string) []hasync.PlanMember {
	var out []hasync.PlanMember
	for _, s := range e.g.Members() {
		if s.Name == name || !s.State.Serving() {
			continue
		}
		if m, ok := e.g.Member(s.Name); ok && m.Slot() != nil {
			out = append(out, hasync.PlanMember{Name: s.Name, Slot: m.Slot()})
		}
	}
	return out
}

func (e recoverEngine) ActivateMember(ctx context.Context, name string) error {
	return e.g.ActivateMember(ctx, name)
}

func (e recoverEngine) FailMember(name string, cause error) {
	if m, ok := e.g.Member(name); ok {
		m.CompareAndTransition(member.Recovering, member.Failed, cause)
	}
}
