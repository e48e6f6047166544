package daemon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/agent/report"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/ha"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/recover"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/dispatch"
	hasync "github.com/hagroup/hagroup/pkg/sync"
)

// groupEngine is the real Engine: an ha.Group (pkg/group with its
// recovery and tombstone journal), plus what the last successful probe of
// each member saw.
type groupEngine struct {
	h     *ha.Group
	label string
	emit  func(agent.Event)

	mu     sync.Mutex
	cfg    config.Group         // as last applied; guarded by mu
	set    config.Settings      // guarded by mu
	tokens map[string]tokenSeen // member → what its last successful probe saw
}

type tokenSeen struct {
	label, serial string
}

// engineSettings are the settings the agent's own engine runs with. The
// agent serves no application sessions; its login comes from the
// members' own PIN sources and must survive an outage of every member, so
// that probes, recoveries and synchronize keep seeing private objects.
// Its engine therefore always runs activeEnhanced; the group's configured
// recovery_mode is for the applications' engines (libhapkcs11).
func engineSettings(s config.Settings) config.Settings {
	s.RecoveryMode = config.RecoveryActiveEnhanced
	return s
}

// OpenGroup is the production Opener: it opens the group's members (a
// member down at start-up starts failed and is recovered later), logs in
// the members that have a PIN source, and starts recovery.
func OpenGroup(ctx context.Context, g config.Group, s config.Settings, env Env, emit func(agent.Event)) (Engine, error) {
	ge := &groupEngine{label: g.Label, cfg: g, set: s, emit: emit, tokens: map[string]tokenSeen{}}
	h, err := ha.Open(ctx, g, engineSettings(s), ha.Options{
		StateDir:       env.StateDir,
		Interceptor:    env.Interceptor,
		Events:         group.EventFunc(ge.onGroupEvent),
		RecoveryEvents: ge.onRecoverEvent,
	})
	if err != nil {
		return nil, err
	}
	ge.h = h
	if err := h.TombstoneError(); err != nil {
		emit(agent.Event{Group: g.Label, Event: "tombstones_unavailable", Detail: err.Error()})
	}
	if hasPIN(g) {
		if err := h.Engine().LoginConfigured(ctx); err != nil {
			emit(agent.Event{Group: g.Label, Event: "login_failed", Detail: err.Error()})
		}
	}
	return ge, nil
}

func hasPIN(g config.Group) bool { return slices.ContainsFunc(g.Members, config.Member.HasPIN) }

func (ge *groupEngine) onGroupEvent(e group.Event) {
	if (e.Kind == group.MemberAdded || e.Kind == group.MemberRemoved) && e.Err == nil {
		return // the reload that made the change reports it
	}
	ae := agent.Event{Time: e.Time, Group: ge.label, Member: e.Member, Event: string(e.Kind)}
	var parts []string
	switch {
	case e.From != 0 && e.To != 0:
		parts = append(parts, fmt.Sprintf("%s -> %s", e.From, e.To))
	case e.To != 0:
		parts = append(parts, "now "+e.To.String())
	case e.From != 0:
		parts = append(parts, "was "+e.From.String())
	}
	if e.Object.ID != nil || e.Object.Label != "" {
		parts = append(parts, e.Object.String())
	}
	if e.Err != nil {
		parts = append(parts, e.Err.Error())
	}
	ae.Detail = strings.Join(parts, ": ")
	ge.emit(ae)
}

func (ge *groupEngine) onRecoverEvent(e recover.Event) {
	ge.emit(agent.Event{Time: e.Time, Group: ge.label, Member: e.Member, Event: string(e.Kind), Detail: e.Detail()})
}

// Status implements Engine.
func (ge *groupEngine) Status(ctx context.Context) agent.GroupStatus {
	st := ge.h.Snapshot()
	ge.mu.Lock()
	defer ge.mu.Unlock()
	gs := agent.GroupStatus{Label: ge.label, Serial: ge.cfg.Serial}
	for _, s := range st.Members {
		cm, _ := ge.cfg.Member(s.Name)
		ms := agent.MemberStatus{Name: s.Name, Standby: s.ConfiguredStandby, Primary: s.Primary,
			State: s.State.String(), LastError: s.LastError, InFlight: s.InFlight, Operations: s.Ops, Failures: s.Errors,
			Hedges: s.Hedges}
		switch {
		case !s.State.Serving() && s.LastAttemptError != "":
			// Why it is still out, rather than why it first failed.
			ms.LastError = s.LastAttemptError
		case s.State.Serving() && s.LastErrorTime.Before(s.Since):
			// The error that took it out before it came back is history
			// (the event log keeps it), not the state of a serving member.
			ms.LastError = ""
		}
		ms.Since, ms.Recovering, ms.AutoRecovery, ms.GaveUp = s.Since, s.Recovering, s.AutoRecovery, s.GaveUp
		ms.PINBlocked, ms.PINBlockedReason = s.PINBlocked, s.PINBlockedReason
		ms.Attempts, ms.LastAttempt, ms.NextAttempt, ms.LastAttemptError = s.Attempts, s.LastAttempt, s.NextAttempt, s.LastAttemptError
		left := s.AttemptsLeft
		ms.AttemptsLeft = &left
		// OutOfSync and NeedsSync come from a comparison made now
		// (Daemon.markSync), not from the recovery's last plan.
		ms.CheckedAt, ms.MissingMechanisms = s.CheckedAt, s.MissingMechanisms
		ms.CannotHold = ge.h.Engine().CannotHold(s.Name)
		for _, c := range s.Conflicts {
			ms.Conflicts = append(ms.Conflicts, c.Identity.String())
		}
		for _, u := range s.Unreplicated {
			ms.Unreplicated = append(ms.Unreplicated, agent.UnreplicatedKey{Object: u.Object.String(), Time: u.Time})
		}
		if cm != nil {
			ms.Module, ms.Token, ms.TokenLabel, ms.TokenSerial = cm.Module, report.TokenSelector(*cm), cm.TokenLabel, cm.TokenSerial
		}
		if seen, ok := ge.tokens[s.Name]; ok {
			ms.TokenLabel, ms.TokenSerial = seen.label, seen.serial
		}
		if m, ok := ge.h.Engine().Member(s.Name); ok && s.State.Serving() {
			if sl := m.Slot(); sl != nil {
				id := sl.SlotID()
				ms.SlotID = &id
			}
		}
		gs.Members = append(gs.Members, ms)
	}
	return gs
}

// Probe implements Engine: a TokenInfo call on every serving member,
// charged by the engine's rule (group.Probe); a member it fails is then
// recovered.
func (ge *groupEngine) Probe(ctx context.Context) []ProbeResult {
	snaps := ge.h.Engine().Members()
	res := make([]ProbeResult, len(snaps))
	var wg sync.WaitGroup
	for i, s := range snaps {
		res[i].Member = s.Name
		if !s.State.Serving() {
			continue
		}
		ge.mu.Lock()
		timeout := dispatch.CommandTimeout(ge.set.CommandTimeout)
		ge.mu.Unlock()
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			start := time.Now()
			info, err := ge.h.Engine().Probe(pctx, s.Name)
			res[i].Duration, res[i].Err = time.Since(start), err
			if err == nil {
				ge.mu.Lock()
				ge.tokens[s.Name] = tokenSeen{strings.TrimRight(info.Label, " "), strings.TrimRight(info.SerialNumber, " ")}
				ge.mu.Unlock()
			}
		})
	}
	wg.Wait()
	return res
}

// Recover implements Engine.
func (ge *groupEngine) Recover(ctx context.Context, name string) ([]agent.MemberResult, error) {
	ctx = bridgeProgress(ctx)
	var names []string
	if name != "" {
		names = []string{name}
	} else {
		for _, s := range ge.h.Engine().Members() {
			if s.State == member.Failed || s.State == member.Recovering {
				names = append(names, s.Name)
			}
		}
	}
	out := []agent.MemberResult{}
	for _, n := range names {
		r, err := ge.h.Recover(ctx, n)
		mr := agent.MemberResult{Member: n, OK: err == nil}
		if m, ok := ge.h.Engine().Member(n); ok {
			mr.State = m.State().String()
		}
		switch {
		case errors.Is(err, group.ErrUnknownMember):
			return out, agent.Errorf(agent.CodeNotFound, "group %q has no member %q", ge.label, n)
		case errors.Is(err, recover.ErrNotFailed) && name != "" && (mr.State == "active" || mr.State == "standby"):
			mr.OK, mr.Detail = true, "in service already: nothing to recover"
		case errors.Is(err, recover.ErrInProgress):
			mr.Detail = "another recovery of this member is running: " + err.Error()
		case err != nil:
			mr.Detail = err.Error()
		default:
			mr.Detail = fmt.Sprintf("caught up: copied %d, deleted %d", r.CatchUp.Copied, r.CatchUp.Deleted)
			if u := len(r.CatchUp.Unreplicable); u > 0 {
				mr.Detail += fmt.Sprintf("; %d key(s) cannot be replicated to or from it (CKM_AES_KEY_WRAP_PAD missing)", u)
			}
		}
		out = append(out, mr)
	}
	return out, nil
}

// Synchronize implements Engine: the serving members are compared (a
// member that is failed, or does not answer, is reported as a difference:
// it cannot be compared), then made equal unless req.Check. With
// req.Check, a failed member whose token answers again is listed too (see
// peek), so the keys it will receive on recovery are named; a member
// being recovered now is not (its catch-up is that comparison). A check
// takes no member's recovery lock. Copies that
// cannot work (a member lacks CKM_AES_KEY_WRAP_PAD) are reported, not
// attempted.
func (ge *groupEngine) Synchronize(ctx context.Context, req agent.SyncRequest) (agent.SyncReport, error) {
	ctx = bridgeProgress(ctx)
	rep := agent.SyncReport{Group: ge.label, Checked: req.Check, Differences: []agent.Difference{}}
	serving := 0
	for _, s := range ge.h.Engine().Members() {
		if s.State.Serving() {
			serving++
		}
	}
	if serving == 0 {
		return rep, agent.Errorf(agent.CodeMemberUnreachable, "group %q: no member in service to synchronise", ge.label)
	}
	sr, err := ge.h.Synchronize(ctx, recover.SyncOptions{Check: req.Check, Prune: req.Prune})
	if sr == nil || sr.Plan == nil {
		if err == nil {
			err = errors.New("no plan")
		}
		return rep, fmt.Errorf("group %q: %w", ge.label, err)
	}
	notServing := map[string]bool{}
	for _, name := range sr.NotServing {
		if notServing[name] {
			continue
		}
		notServing[name] = true
		st := "not in service"
		recovering := false
		if m, ok := ge.h.Engine().Member(name); ok {
			st = "member is " + m.State().String()
			recovering = m.State() == member.Recovering
		}
		if req.Check && recovering {
			// Its recovery, running now, is catching it up: opening and
			// listing its token a second time would only slow that down.
			rep.Differences = append(rep.Differences, agent.Difference{Object: "*", Kind: "unreachable",
				Members: []string{name}, Action: "none: its recovery is catching it up", Detail: st})
			continue
		}
		if req.Check {
			if missing, err := ge.peek(ctx, name); err == nil {
				for _, a := range missing {
					rep.Differences = append(rep.Differences, agent.Difference{Object: a.Identity.String(), Kind: string(a.Reason),
						Members: []string{name}, Action: "none: " + a.String() + " when it recovers", Detail: st + "; its token answers"})
				}
				if len(missing) > 0 {
					continue
				}
			} else {
				st += "; " + err.Error()
			}
		}
		rep.Differences = append(rep.Differences, agent.Difference{Object: "*", Kind: "unreachable",
			Members: []string{name}, Action: "none: caught up when it recovers", Detail: st})
	}
	for name, err := range sr.Plan.Skipped {
		rep.Differences = append(rep.Differences, agent.Difference{Object: "*", Kind: "unreachable",
			Members: []string{name}, Action: "none: not listed", Detail: err.Error()})
	}
	unreplicable := map[string]bool{}
	for _, a := range sr.Unreplicable {
		unreplicable[actionKey(a)] = true
		rep.Differences = append(rep.Differences, agent.Difference{Object: a.Identity.String(), Kind: "unreplicable",
			Members: []string{a.Member}, Action: "none: " + a.String() + " needs CKM_AES_KEY_WRAP_PAD, which " + lackingOf(ge.h, a) + " lacks",
			Detail: "the member stays in service without this key"})
	}
	for _, a := range sr.Plan.Actions {
		if unreplicable[actionKey(a)] {
			continue
		}
		rep.Differences = append(rep.Differences, agent.Difference{Object: a.Identity.String(), Kind: string(a.Reason),
			Members: []string{a.Member}, Action: a.String()})
	}
	for _, c := range sr.Plan.Conflicts {
		var holders []string
		for _, v := range c.Versions {
			holders = append(holders, v.Members...)
		}
		rep.Differences = append(rep.Differences, agent.Difference{Object: c.Identity.String(), Kind: "conflict",
			Members: holders, Action: "none: an operator must resolve it", Detail: c.String()})
	}
	for _, u := range sr.Plan.Unreadable {
		obj := fmt.Sprintf("object %d", u.Handle)
		if u.Identity != nil {
			obj = u.Identity.String()
		}
		rep.Differences = append(rep.Differences, agent.Difference{Object: obj, Kind: "unreadable",
			Members: []string{u.Member}, Action: "none: the member will not describe it; inspect or destroy it there",
			Detail: u.String()})
	}
	rep.Conflicts = len(sr.Plan.Conflicts)
	rep.InSync = sr.InSync()
	if sr.Applied != nil {
		rep.Applied = len(sr.Applied.Done)
		rep.Failed = len(sr.Applied.Failed)
		for _, f := range sr.Applied.Failed {
			// The action is in its own column: the detail is the cause.
			rep.Differences = append(rep.Differences, agent.Difference{Object: f.Action.Identity.String(), Kind: "failed",
				Members: []string{f.Action.Member}, Action: f.Action.String(), Detail: f.Err.Error()})
		}
	}
	if err != nil && sr.Applied == nil {
		return rep, fmt.Errorf("group %q: %w", ge.label, err)
	}
	return rep, nil
}

// OutOfSync implements Engine (ha.Group.OutOfSync).
func (ge *groupEngine) OutOfSync(ctx context.Context) (map[string]int, error) {
	return ge.h.OutOfSync(ctx)
}

// Serving implements Engine.
func (ge *groupEngine) Serving(name string) bool {
	m, ok := ge.h.Engine().Member(name)
	return ok && m.State().Serving()
}

// bridgeProgress hands the progress the engine reports (pkg/sync's) to
// the socket's caller, when it asked for progress.
func bridgeProgress(ctx context.Context) context.Context {
	fn := agent.ProgressFrom(ctx)
	if fn == nil {
		return ctx
	}
	return hasync.WithProgress(ctx, func(p hasync.Progress) {
		fn(agent.Progress{Done: p.Done, Total: p.Total, Member: p.Member})
	})
}

func actionKey(a hasync.Action) string {
	return a.Identity.Key() + "\x00" + a.Member + "\x00" + a.Kind.String()
}

// lackingOf names the member of a that lacks the wrap mechanism.
func lackingOf(h *ha.Group, a hasync.Action) string {
	for _, name := range []string{a.Member, a.Source} {
		if m, ok := h.Engine().Member(name); ok && m.Lacks(group.MechWrapPad) {
			return name
		}
	}
	return a.Member
}

// Update implements Engine: members added (caught up before they take
// work), removed (after their work in flight), changed, moved to or from
// standby, reordered, and the policy and recovery settings, all without
// disturbing the members that did not change. Other changes (serial,
// timeouts, failure threshold, tombstone horizon) need the group
// reopened (ErrReopen).
func (ge *groupEngine) Update(ctx context.Context, g config.Group, s config.Settings) ([]string, error) {
	lines, err := ge.h.Update(ctx, g, engineSettings(s))
	if errors.Is(err, ha.ErrReopen) {
		return nil, ErrReopen
	}
	ge.mu.Lock()
	ge.cfg, ge.set = g, s
	for name := range ge.tokens {
		if _, ok := g.Member(name); !ok {
			delete(ge.tokens, name)
		}
	}
	ge.mu.Unlock()
	return lines, err
}

// Close implements Engine.
func (ge *groupEngine) Close() error { return ge.h.Close() }

// peek compares a member out of service with the serving members for a
// check: its token is opened on a connection of its own (logged in with
// its PIN source, within command_timeout) and listed, and the copies it
// would receive are returned. Nothing is changed on any member. An error
// means the token does not answer (or the member has no configuration);
// the caller then reports the member as unreachable.
func (ge *groupEngine) peek(ctx context.Context, name string) ([]hasync.Action, error) {
	ge.mu.Lock()
	cm, ok := ge.cfg.Member(name)
	var mc config.Member
	if ok {
		mc = *cm
	}
	set := ge.set
	ge.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("member %s is not configured", name)
	}
	timeout := dispatch.CommandTimeout(set.CommandTimeout)
	if st := ge.h.Recoverer().Status(name); st.PINBlocked {
		// Its token refused the PIN: a check offers it no PIN again.
		return nil, fmt.Errorf("member %s: not opened: %w (%s)", name, recover.ErrPINBlocked, st.PINBlock.Reason)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pin, err := mc.ReadPIN()
	if err != nil {
		return nil, report.NameMember(name, err)
	}
	s, err := slot.Open(ctx, report.MemberSpec(mc, set, pin))
	pin.Zero()
	if err != nil {
		return nil, report.NameMember(name, err)
	}
	defer s.Close()
	members := []hasync.PlanMember{{Name: name, Slot: s}}
	for _, sn := range ge.h.Engine().Members() {
		if !sn.State.Serving() || sn.Name == name {
			continue
		}
		if m, ok := ge.h.Engine().Member(sn.Name); ok {
			if sl := m.Slot(); sl != nil {
				members = append(members, hasync.PlanMember{Name: sn.Name, Slot: sl})
			}
		}
	}
	plan, err := hasync.MakePlan(ctx, members, nil, hasync.PlanOptions{SkipUnreachable: true})
	if err != nil {
		return nil, report.NameMember(name, err)
	}
	if err, ok := plan.Skipped[name]; ok {
		return nil, report.NameMember(name, err)
	}
	var out []hasync.Action
	for _, a := range plan.Actions {
		// Without the tombstones, only what the member lacks is certain.
		if a.Member == name && a.Kind == hasync.Copy && a.Reason == hasync.ReasonMissing {
			out = append(out, a)
		}
	}
	return out, nil
}
