package daemon

import (
	"context"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/fleet"
)

// What one reporting process can make the agent keep: a bounded number of
// processes (per uid and in all), forgotten when silent, each with at most
// fleet's bounds of groups, members and events, and a budget of log lines.
const (
	maxClients     = 1024
	maxPerUID      = 64
	clientExpiry   = 6 * agent.DefaultReportInterval
	eventBudget    = 120 // lines a process may add to the HA log per eventWindow
	eventWindow    = time.Minute
	agentProgram   = "haagent"
	tooManyClients = http.StatusTooManyRequests
)

type clientKey struct{ uid, pid int }

// counts are one member's cumulative counters in one process.
type counts struct{ ops, errs, failovers, hedges uint64 }

func (c counts) add(o counts) counts {
	return counts{c.ops + o.ops, c.errs + o.errs, c.failovers + o.failovers, c.hedges + o.hedges}
}

// maxed keeps counters monotonic whatever a process reports.
func (c counts) maxed(o counts) counts {
	return counts{max(c.ops, o.ops), max(c.errs, o.errs), max(c.failovers, o.failovers), max(c.hedges, o.hedges)}
}

type clientEntry struct {
	st          agent.ClientStatus
	counts      map[memberKey]counts
	budget      int
	budgetStart time.Time
	refused     uint64 // events past the budget
}

// clientTable is what the agent knows of the processes that report. Safe
// for concurrent use.
type clientTable struct {
	now func() time.Time

	mu      sync.Mutex
	clients map[clientKey]*clientEntry
	// retired holds the counters of processes gone (closed or silent), so
	// that the fleet's totals never go down.
	retired map[memberKey]counts
}

func newClientTable() *clientTable {
	return &clientTable{now: time.Now, clients: map[clientKey]*clientEntry{}, retired: map[memberKey]counts{}}
}

// validReport checks a report against fleet's bounds, naming what is over.
func validReport(rep agent.FleetReport) error {
	bad := func(format string, a ...any) error {
		return agent.Errorf(agent.CodeBadRequest, "report: "+format, a...)
	}
	switch {
	case len(rep.Groups) > agent.MaxGroups:
		return bad("%d groups, at most %d", len(rep.Groups), agent.MaxGroups)
	case len(rep.Events) > agent.MaxEvents:
		return bad("%d events, at most %d", len(rep.Events), agent.MaxEvents)
	case len(rep.Program) > agent.MaxProgramLen || len(rep.Host) > agent.MaxHostLen:
		return bad("program or host name too long")
	}
	for _, g := range rep.Groups {
		if len(g.Members) > agent.MaxMembers {
			return bad("group %.64q: %d members, at most %d", g.Group, len(g.Members), agent.MaxMembers)
		}
	}
	for _, e := range rep.Events {
		if len(e.Event) > agent.MaxNameLen || len(e.Group) > agent.MaxNameLen || len(e.Member) > agent.MaxNameLen || len(e.Detail) > agent.MaxDetailLen {
			return bad("an event's name, group, member or detail is too long")
		}
	}
	return nil
}

// record stores rep from peer and returns the events to log (those of
// groups and members the agent runs, within the process's budget).
// known says whether the agent runs a group ("" member) or a member of it.
func (t *clientTable) record(peer agent.Peer, rep agent.FleetReport, known func(group, member string) bool) ([]agent.FleetEvent, error) {
	if err := validReport(rep); err != nil {
		return nil, err
	}
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(now)
	k := clientKey{peer.UID, peer.PID}
	c, ok := t.clients[k]
	if ok && !c.st.Started.Equal(rep.Started) {
		t.retireLocked(k) // a new life of the engine in this process
		ok = false
	}
	if !ok {
		if err := t.roomLocked(peer.UID); err != nil {
			return nil, err
		}
		c = &clientEntry{counts: map[memberKey]counts{}, budgetStart: now}
		c.st = agent.ClientStatus{PID: peer.PID, UID: peer.UID, Started: rep.Started}
		t.clients[k] = c
	}
	c.st.Program, c.st.Host, c.st.LastSeen = rep.Program, rep.Host, now
	c.st.Groups = c.st.Groups[:0]
	for _, g := range rep.Groups {
		if !known(g.Group, "") {
			continue
		}
		kept := agent.FleetGroup{Group: g.Group, Members: []agent.FleetMember{}}
		for _, m := range g.Members {
			if !known(g.Group, m.Name) {
				continue
			}
			mk := memberKey{g.Group, m.Name}
			c.counts[mk] = c.counts[mk].maxed(counts{m.Operations, m.Errors, m.Failovers, m.Hedges})
			cur := c.counts[mk]
			m.Operations, m.Errors, m.Failovers, m.Hedges = cur.ops, cur.errs, cur.failovers, cur.hedges
			kept.Members = append(kept.Members, m)
		}
		c.st.Groups = append(c.st.Groups, kept)
	}
	events := t.budgetLocked(c, rep.Events, now, known)
	c.st.DroppedEvents = rep.Dropped + c.refused
	if rep.Final {
		t.retireLocked(k)
	}
	return events, nil
}

func (t *clientTable) roomLocked(uid int) error {
	n := 0
	for k := range t.clients {
		if k.uid == uid {
			n++
		}
	}
	if n >= maxPerUID {
		e := agent.Errorf(agent.CodeUnavailable, "uid %d already has %d reporting processes (at most %d)", uid, n, maxPerUID)
		e.Status = tooManyClients
		return e
	}
	if len(t.clients) >= maxClients {
		e := agent.Errorf(agent.CodeUnavailable, "the agent already keeps %d reporting processes (at most %d)", len(t.clients), maxClients)
		e.Status = tooManyClients
		return e
	}
	return nil
}

func (t *clientTable) budgetLocked(c *clientEntry, es []agent.FleetEvent, now time.Time, known func(string, string) bool) []agent.FleetEvent {
	if now.Sub(c.budgetStart) >= eventWindow {
		c.budget, c.budgetStart = 0, now
	}
	var out []agent.FleetEvent
	for _, e := range es {
		// Process-level events (no group) are kept; group events only for
		// groups and members the agent runs.
		if e.Event == "" || (e.Group != "" && !known(e.Group, e.Member)) {
			continue
		}
		if c.budget >= eventBudget {
			c.refused++
			continue
		}
		c.budget++
		out = append(out, e)
	}
	return out
}

// retireLocked moves a process's counters to the totals of the gone and
// forgets it.
func (t *clientTable) retireLocked(k clientKey) {
	c := t.clients[k]
	for mk, n := range c.counts {
		t.retired[mk] = t.retired[mk].add(n)
	}
	delete(t.clients, k)
}

func (t *clientTable) expireLocked(now time.Time) {
	for k, c := range t.clients {
		if now.Sub(c.st.LastSeen) > clientExpiry {
			t.retireLocked(k)
		}
	}
}

// list returns the live processes, by program then pid.
func (t *clientTable) list() []agent.ClientStatus {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(t.now())
	out := make([]agent.ClientStatus, 0, len(t.clients))
	for _, c := range t.clients {
		st := c.st
		st.Groups = slices.Clone(c.st.Groups)
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Program != out[j].Program {
			return out[i].Program < out[j].Program
		}
		return out[i].PID < out[j].PID
	})
	return out
}

// fleetView sums, per member, the counters of every process that reported
// it (gone ones included) and counts the live ones.
type fleetView struct {
	totals  map[memberKey]counts
	clients map[memberKey]int
}

func (t *clientTable) view() fleetView {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(t.now())
	v := fleetView{totals: map[memberKey]counts{}, clients: map[memberKey]int{}}
	for mk, n := range t.retired {
		v.totals[mk] = n
	}
	for _, c := range t.clients {
		for mk, n := range c.counts {
			v.totals[mk] = v.totals[mk].add(n)
		}
		for _, g := range c.st.Groups {
			for _, m := range g.Members {
				v.clients[memberKey{g.Group, m.Name}]++
			}
		}
	}
	return v
}

// forgetGroup drops what is kept of a group that is no longer configured.
func (t *clientTable) forgetGroup(group string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for mk := range t.retired {
		if mk.group == group {
			delete(t.retired, mk)
		}
	}
	for _, c := range t.clients {
		for mk := range c.counts {
			if mk.group == group {
				delete(c.counts, mk)
			}
		}
	}
}

// addFleet completes a group's status with the fleet's figures.
func (v fleetView) addFleet(gs *agent.GroupStatus) {
	for i := range gs.Members {
		m := &gs.Members[i]
		mk := memberKey{gs.Label, m.Name}
		n := v.totals[mk]
		m.ClientOperations, m.ClientFailures, m.ClientFailovers, m.ClientHedges = n.ops, n.errs, n.failovers, n.hedges
		m.Clients = v.clients[mk]
	}
	gs.Hedges = 0
	for _, m := range gs.Members {
		gs.Hedges += m.Hedges + m.ClientHedges
	}
}

// Report implements agent.FleetBackend.
func (d *Daemon) Report(ctx context.Context, peer agent.Peer, rep agent.FleetReport) error {
	events, err := d.clients.record(peer, rep, d.knows)
	if err != nil {
		return err
	}
	uid := peer.UID
	for _, e := range events {
		if !d.newsOf(e) {
			continue // the log holds it already (facts.go)
		}
		// The agent's clock orders the log; the report came within a
		// fraction of a second of the event.
		ae := agent.Event{Time: time.Now(), Group: e.Group, Member: e.Member, Event: e.Event, Detail: e.Detail,
			Program: rep.Program, PID: peer.PID, UID: &uid, Host: rep.Host}
		d.noteStall(ae)
		d.pokeOn(ae)
		d.logEvent(ae)
	}
	return nil
}

// Clients implements agent.FleetBackend.
func (d *Daemon) Clients(ctx context.Context) (agent.ClientsReport, error) {
	return agent.ClientsReport{SchemaVersion: agent.SchemaVersion, Clients: d.clients.list(),
		MaxClients: maxClients, MaxPerUID: maxPerUID, Expiry: clientExpiry.String()}, nil
}

// knows reports whether the agent runs group (and, when member is not
// empty, that member of it): a report about anything else is not kept, so
// no process can add a group or member label to the metrics.
func (d *Daemon) knows(group, member string) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	g, ok := d.cfg.Group(group)
	if ok && member != "" {
		_, ok = g.Member(member)
	}
	return ok
}

// newEventFolder folds repeated HA events into one line per FoldWindow;
// first occurrences are written at once.
func (d *Daemon) newEventFolder() *fleet.Folder[agent.Event] {
	host, _ := os.Hostname()
	return fleet.NewFolder(fleet.FoldWindow, func(e agent.Event, n int, w time.Duration) {
		if e.Program == "" {
			e.Program, e.PID, e.Host = agentProgram, os.Getpid(), host
		}
		if n > 0 {
			e.Repeats = n
			e.Detail = fleet.FoldedDetail(e.Detail, n, w)
			e.Time = time.Time{} // the summary is written now
		}
		if d.events == nil {
			return
		}
		if err := d.events.Append(e); err != nil {
			d.log.Error("HA event log", "error", err)
		}
	})
}

// logEvent writes e to the HA log through the folder: what counts as a
// repeat is the same event on the same group and member, whoever saw it.
func (d *Daemon) logEvent(e agent.Event) {
	if d.fold == nil {
		return
	}
	d.fold.Add(strings.Join([]string{e.Group, e.Member, e.Event}, "\x00"), e)
}

// foldLoop writes the folded summaries as their windows end.
func (d *Daemon) foldLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			d.fold.FlushAll()
			return
		case <-t.C:
			d.fold.Flush()
		}
	}
}
