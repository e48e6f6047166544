package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/agent/report"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/fleet"
	"github.com/hagroup/hagroup/pkg/group"
)

// Options configure a Daemon.
type Options struct {
	// ConfigPath is the configuration file (already resolved).
	ConfigPath string
	// Socket overrides the config's agent.socket when set.
	Socket string
	// Version is the agent's build version.
	Version string
	// Logger receives the daemon's log; nil discards it.
	Logger *slog.Logger
	// Open opens a group's engine.
	Open Opener
	// DrainTimeout bounds the wait for in-flight requests at shutdown.
	DrainTimeout time.Duration
}

// Daemon runs every configured group and serves the agent socket. Create
// it with New, then call Run. Its Backend methods are safe for concurrent
// use.
type Daemon struct {
	opts    Options
	log     *slog.Logger
	started time.Time

	reloadMu sync.Mutex // one reload at a time

	mu     sync.RWMutex
	cfg    *config.Config
	agent  config.Agent // with defaults
	groups map[string]*groupRun
	order  []string // group labels in config order

	events  *agent.EventLog
	fold    *fleet.Folder[agent.Event] // in front of events: repeats folded
	clients *clientTable               // the processes that report (clients.go)
	facts   facts                      // what the log already says (facts.go)
	metrics *Metrics
	server  *agent.Server
	socket  string

	runCtx      context.Context // the context groups run under
	metricsAddr string          // where /metrics is served, once listening
}

// groupRun is one group's engine and its background loops.
type groupRun struct {
	cfg     config.Group
	set     config.Settings
	eng     Engine // nil while the group could not be opened
	openErr error
	cancel  context.CancelFunc
	done    chan struct{}

	mu        sync.Mutex
	outOfSync map[string]int // member → differences concerning it (last check that compared them)
	compared  comparison     // the last comparison of the members; guarded by mu
	comparing chan struct{}  // holds a token while a comparison runs (see compare)

	recheck chan struct{} // a check is wanted soon (see pokeCheck)

	stall *agent.TombstoneStall // unresolved tombstone stall; guarded by mu
}

// New loads the configuration and prepares the daemon; nothing is opened
// or listened on until Run.
func New(opts Options) (*Daemon, error) {
	if opts.Open == nil {
		return nil, errors.New("daemon: no engine opener")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// The path is reported in status and compared by hactl with the file
	// it was given: make it absolute, as the agent's cwd is not hactl's.
	if abs, err := filepath.Abs(opts.ConfigPath); err == nil && opts.ConfigPath != "" {
		opts.ConfigPath = abs
	}
	cfg, err := config.Load(opts.ConfigPath)
	if err != nil {
		return nil, err
	}
	d := &Daemon{opts: opts, log: log, cfg: cfg, agent: cfg.Agent.WithDefaults(), groups: map[string]*groupRun{}}
	d.socket = d.agent.Socket
	if opts.Socket != "" {
		d.socket = opts.Socket
	}
	d.metrics = NewMetrics(d)
	d.clients = newClientTable()
	return d, nil
}

// policy builds the socket access policy from the [agent] table.
func policyOf(a config.Agent) agent.Policy {
	return agent.Policy{
		AgentUID:       os.Getuid(),
		AllowedUIDs:    a.AllowedUIDs,
		AllowedGroup:   a.AllowedGroup,
		OthersReadOnly: a.OthersReadOnly != nil && *a.OthersReadOnly,
	}
}

// Run opens the event log and every group, listens on the socket (never
// replacing a live one), serves metrics when configured, and runs until
// ctx ends; then it drains requests, closes every group and returns nil.
func (d *Daemon) Run(ctx context.Context) error {
	d.started = time.Now()
	ev, err := agent.OpenEventLog(d.agent.LogFile, d.agent.LogMaxBytes)
	if err != nil {
		return err
	}
	d.events = ev
	defer ev.Close()
	d.fold = d.newEventFolder()
	foldCtx, stopFold := context.WithCancel(context.Background())
	foldDone := make(chan struct{})
	go func() { d.foldLoop(foldCtx); close(foldDone) }()
	defer func() { stopFold(); <-foldDone }() // before ev.Close: the last summaries

	pol := policyOf(d.agent)
	// Every local user reaches the socket: its applications report there
	// (pkg/fleet); what a connection may do is decided from SO_PEERCRED.
	mode := os.FileMode(0o666)
	gid := -1
	if d.agent.AllowedGroup != "" {
		g, err := agent.LookupGroupID(d.agent.AllowedGroup)
		if err != nil {
			return fmt.Errorf("%s: agent.allowed_group %q: %w", d.cfg.Path, d.agent.AllowedGroup, err)
		}
		gid = g
	}
	ln, err := agent.Listen(d.socket, agent.ListenOptions{Mode: mode, GID: gid})
	if err != nil {
		return err
	}
	d.server = agent.NewServer(d, pol, d.opts.Version, d.log)
	d.server.DrainTimeout = d.opts.DrainTimeout

	var metricsSrv *http.Server
	var metricsDone chan error
	if d.agent.Metrics != "" {
		mln, err := net.Listen("tcp", d.agent.Metrics)
		if err != nil {
			ln.Close()
			return fmt.Errorf("metrics endpoint %s: %w", d.agent.Metrics, err)
		}
		metricsSrv = &http.Server{Handler: d.metrics.Handler(), ReadHeaderTimeout: 10 * time.Second}
		metricsDone = make(chan error, 1)
		d.mu.Lock()
		d.metricsAddr = mln.Addr().String()
		d.mu.Unlock()
		go func() { metricsDone <- metricsSrv.Serve(mln) }()
		d.log.Info("metrics endpoint", "addr", mln.Addr().String())
	}

	runCtx, cancelGroups := context.WithCancel(context.WithoutCancel(ctx))
	d.reloadMu.Lock() // a reload (SIGHUP) waits until the groups are started
	d.mu.Lock()
	d.runCtx = runCtx
	d.mu.Unlock()
	for _, g := range d.cfg.Groups {
		d.startGroup(ctx, g, d.cfg.Settings(&g))
	}
	d.reloadMu.Unlock()
	d.log.Info("haagent running", "socket", d.socket, "config", d.cfg.Path, "groups", len(d.cfg.Groups), "pid", os.Getpid())

	err = d.server.Run(ctx, ln)
	d.log.Info("haagent stopping: closing groups")
	cancelGroups()
	d.mu.RLock()
	labels := slices.Clone(d.order)
	d.mu.RUnlock()
	for _, label := range labels {
		d.stopGroup(label, false)
	}
	if metricsSrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		metricsSrv.Shutdown(sctx)
		cancel()
		<-metricsDone
	}
	return err
}

// startGroup opens a group (without holding d.mu: opening tokens can take
// a while and listgroups must not wait for it), registers it and starts
// its loops.
func (d *Daemon) startGroup(ctx context.Context, g config.Group, s config.Settings) {
	gr := &groupRun{cfg: g, set: s, outOfSync: map[string]int{}}
	d.openGroup(ctx, gr)
	d.mu.Lock()
	d.installLocked(gr)
	d.mu.Unlock()
}

// installLocked registers gr and starts its loops. d.mu is held.
func (d *Daemon) installLocked(gr *groupRun) {
	label := gr.cfg.Label
	loopCtx, cancel := context.WithCancel(d.runCtx)
	gr.cancel, gr.done = cancel, make(chan struct{})
	if gr.recheck == nil {
		gr.recheck, gr.comparing = make(chan struct{}, 1), make(chan struct{}, 1)
	}
	if gr.stall == nil {
		gr.stall = d.keptStall(label) // from before a restart or reload
	}
	d.groups[label] = gr
	if !slices.Contains(d.order, label) {
		d.order = append(d.order, label)
	}
	d.reorderLocked()
	go d.loop(loopCtx, gr)
}

// reorderLocked keeps d.order in config order.
func (d *Daemon) reorderLocked() {
	pos := map[string]int{}
	for i, g := range d.cfg.Groups {
		pos[g.Label] = i
	}
	sort.SliceStable(d.order, func(i, j int) bool { return pos[d.order[i]] < pos[d.order[j]] })
}

func (d *Daemon) openGroup(ctx context.Context, gr *groupRun) {
	label := gr.cfg.Label
	eng, err := d.opts.Open(ctx, gr.cfg, gr.set, Env{StateDir: d.agent.StateDir}, func(e agent.Event) { d.emit(e) })
	gr.mu.Lock()
	gr.eng, gr.openErr = eng, err
	gr.mu.Unlock()
	if err != nil {
		d.log.Error("opening group", "group", label, "error", err)
		d.emit(agent.Event{Group: label, Event: "group_open_failed", Detail: err.Error()})
		return
	}
	d.emit(agent.Event{Group: label, Event: "group_opened", Detail: fmt.Sprintf("%d member(s)", len(gr.cfg.Members))})
}

// stopGroup unregisters a group, stops its loops and, unless keepEngine,
// closes its engine (letting operations in flight end).
func (d *Daemon) stopGroup(label string, keepEngine bool) *groupRun {
	d.mu.Lock()
	gr, ok := d.groups[label]
	if ok {
		delete(d.groups, label)
		d.order = slices.DeleteFunc(d.order, func(s string) bool { return s == label })
	}
	d.mu.Unlock()
	if !ok {
		return nil
	}
	gr.cancel()
	<-gr.done
	if !keepEngine {
		if e := gr.engine(); e != nil {
			if err := e.Close(); err != nil {
				d.log.Warn("closing group", "group", label, "error", err)
			}
		}
		d.metrics.forgetGroup(label)
		d.clients.forgetGroup(label)
	}
	return gr
}

func (gr *groupRun) engine() Engine {
	gr.mu.Lock()
	defer gr.mu.Unlock()
	return gr.eng
}

// minSyncCheckEvery is the shortest period of the periodic
// synchronisation check. The check is what listgroups and the out-of-sync
// metric show (markSync) and what raises the out_of_sync and in_sync
// events; what changes the answer (an event of the agent's engine or of a
// reporting process, a synchronize) asks for a check of its own.
const minSyncCheckEvery = 10 * time.Second

// syncCheckEvery is the period of a group's synchronisation check: its
// interval, but not less than minSyncCheckEvery. The interval is the
// recovery retry period, which can be as short as a second; a check every
// second lists every object of every member every second, for an answer
// nobody reads that often.
func syncCheckEvery(s config.Settings) time.Duration {
	every := s.Interval
	if every <= 0 {
		every = config.DefaultInterval
	}
	return max(every, minSyncCheckEvery)
}

// loop probes the group every probe_interval and retries opening a group
// that could not be opened every interval; checkLoop, on a goroutine of
// its own so a long listing never delays a probe, checks its
// synchronisation.
func (d *Daemon) loop(ctx context.Context, gr *groupRun) {
	defer close(gr.done)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { d.checkLoop(ctx, gr) })
	probeEvery := gr.set.ProbeInterval
	if probeEvery <= 0 {
		probeEvery = config.DefaultProbeInterval
	}
	openEvery := gr.set.Interval
	if openEvery <= 0 {
		openEvery = config.DefaultInterval
	}
	probe := time.NewTicker(probeEvery)
	defer probe.Stop()
	if eng := gr.engine(); eng != nil {
		// A first probe at once, so listgroups shows token details and
		// a member that is already down without waiting a whole interval.
		d.probe(ctx, gr, eng, probeEvery)
	}
	reopen := time.NewTicker(openEvery)
	defer reopen.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-probe.C:
			eng := gr.engine()
			if eng == nil {
				continue
			}
			d.probe(ctx, gr, eng, probeEvery)
		case <-reopen.C:
			if gr.engine() == nil {
				d.openGroup(ctx, gr)
			}
		}
	}
}

// compareTTL is how old the last comparison may be when listgroups or a
// scrape shows it; an older one is made again for the request, so no
// answer rests on a comparison older than this. Three check periods: at
// many objects a check lasts a good part of one.
func compareTTL(s config.Settings) time.Duration { return 3 * syncCheckEvery(s) }

// checkLoop checks the group's synchronisation at once, then every
// syncCheckEvery and soon after pokeCheck (something changed what the
// members hold or who serves). A poked check waits as long as the last
// one took, so a burst of changes keeps the agent comparing at most half
// its time.
func (d *Daemon) checkLoop(ctx context.Context, gr *groupRun) {
	every := syncCheckEvery(gr.set)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-gr.recheck:
		}
		start := time.Now()
		if eng := gr.engine(); eng != nil {
			if c := d.compare(ctx, gr, eng, start); c.err != nil {
				d.log.Debug("sync check", "group", gr.cfg.Label, "error", c.err)
			}
		}
		t.Reset(every)
		rest := time.NewTimer(time.Since(start))
		select {
		case <-ctx.Done():
			rest.Stop()
			return
		case <-rest.C:
		}
	}
}

// pokeCheck asks the group's check loop for a check now (without
// blocking; pokes while one is pending are one).
func (gr *groupRun) pokeCheck() {
	select {
	case gr.recheck <- struct{}{}:
	default:
	}
}

// comparison is one comparison of a group's members (Engine.OutOfSync).
type comparison struct {
	at     time.Time      // when it started; zero: none yet
	counts map[string]int // member → differences concerning it
	err    error          // the members could not be compared
}

// compare returns a comparison of gr's members that started at notBefore
// or later: the last one if it did, else a new one, recorded. One runs at
// a time per group, and a caller that waits for it takes its result if it
// is recent enough. A comparison only lists: it takes no member's recovery
// lock (see recover.Recoverer.Synchronize), so it never keeps a member's
// recovery, in this process or another, waiting.
func (d *Daemon) compare(ctx context.Context, gr *groupRun, eng Engine, notBefore time.Time) comparison {
	recent := func() (comparison, bool) {
		gr.mu.Lock()
		defer gr.mu.Unlock()
		return gr.compared, !gr.compared.at.IsZero() && !gr.compared.at.Before(notBefore)
	}
	c, ok := recent()
	if ok {
		return c
	}
	select {
	case gr.comparing <- struct{}{}:
		defer func() { <-gr.comparing }()
	case <-ctx.Done():
		last := "none yet"
		if !c.at.IsZero() {
			last = time.Since(c.at).Round(time.Second).String() + " ago"
		}
		return comparison{err: fmt.Errorf("a comparison of the members did not finish (the last: %s): %w", last, ctx.Err())}
	}
	if c, ok = recent(); ok {
		return c
	}
	c = comparison{at: time.Now()}
	c.counts, c.err = eng.OutOfSync(ctx)
	d.metrics.observe(gr.cfg.Label, "", "sync_check", time.Since(c.at))
	if ctx.Err() == nil {
		d.recordSync(gr, c)
	}
	return c
}

// recordSync keeps a comparison and, when it compared the members, emits
// out_of_sync / in_sync as the group moves out of or back into sync.
func (d *Daemon) recordSync(gr *groupRun, c comparison) {
	gr.mu.Lock()
	gr.compared = c
	wasInSync := len(gr.outOfSync) == 0
	if c.err == nil {
		gr.outOfSync = c.counts
	}
	gr.mu.Unlock()
	switch {
	case c.err != nil:
	case wasInSync && len(c.counts) > 0:
		n := 0
		for _, k := range c.counts {
			n += k
		}
		d.emit(agent.Event{Group: gr.cfg.Label, Event: "out_of_sync", Detail: fmt.Sprintf("%d difference(s)", n)})
	case !wasInSync && len(c.counts) == 0:
		d.emit(agent.Event{Group: gr.cfg.Label, Event: "in_sync"})
	}
}

// emit records an event: the HA log, the daemon's log and the counters.
func (d *Daemon) emit(e agent.Event) {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	d.pokeOn(e)
	if e.Event == string(group.KeysUnholdable) {
		d.facts.noteUnholdable(e.Group, e.Member, e.Detail) // the agent's own is always news
	}
	d.noteStall(e)
	d.metrics.countEvent(e)
	d.log.Info("ha event", "group", e.Group, "member", e.Member, "event", e.Event, "detail", e.Detail)
	d.logEvent(e)
}

// lookup returns a running group or a not_found error naming the groups.
func (d *Daemon) lookup(label string) (*groupRun, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	gr, ok := d.groups[label]
	if !ok {
		return nil, agent.Errorf(agent.CodeNotFound, "group %q is not running in haagent (groups: %s)", label, report.OrNone(d.order))
	}
	return gr, nil
}

// Status implements agent.Backend.
func (d *Daemon) Status(ctx context.Context) (agent.Status, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return agent.Status{
		PID:        os.Getpid(),
		Started:    d.started.UTC(),
		Uptime:     time.Since(d.started).Round(time.Second).String(),
		Socket:     d.socket,
		ConfigPath: d.cfg.Path,
		Groups:     slices.Clone(d.order),
	}, nil
}

// Groups implements agent.Backend.
func (d *Daemon) Groups(ctx context.Context, label string, compareNow bool) (agent.GroupsReport, error) {
	d.mu.RLock()
	cfg := d.cfg
	var runs []*groupRun
	for _, l := range d.order {
		if label == "" || l == label {
			runs = append(runs, d.groups[l])
		}
	}
	d.mu.RUnlock()
	if label != "" && len(runs) == 0 {
		_, err := d.lookup(label)
		return agent.GroupsReport{}, err
	}
	rep := agent.GroupsReport{SchemaVersion: agent.SchemaVersion, Source: agent.SourceAgent, ConfigPath: cfg.Path,
		Global: report.WireSettings(cfg.Settings(nil)), Groups: make([]agent.GroupStatus, 0, len(runs))}
	for _, gr := range runs {
		rep.Groups = append(rep.Groups, d.groupStatus(ctx, gr, compareNow))
	}
	return rep, nil
}

// groupStatus is the engine's status completed with what the daemon knows.
func (d *Daemon) groupStatus(ctx context.Context, gr *groupRun, compareNow bool) agent.GroupStatus {
	eng := gr.engine()
	var gs agent.GroupStatus
	if eng == nil {
		// Not open: list the configured members as down with the reason.
		cfg := &config.Config{Groups: []config.Group{gr.cfg}}
		r, _ := report.ConfigReport(cfg, gr.cfg.Label)
		gs = r.Groups[0]
		gr.mu.Lock()
		reason := "group not open"
		if gr.openErr != nil {
			reason = gr.openErr.Error()
		}
		gr.mu.Unlock()
		for i := range gs.Members {
			gs.Members[i].State, gs.Members[i].LastError = agent.StateDown, reason
		}
	} else {
		gs = eng.Status(ctx)
	}
	if gs.Label == "" {
		gs.Label = gr.cfg.Label
	}
	if gs.Serial == "" {
		gs.Serial = gr.cfg.Serial
	}
	gs.Settings = report.WireSettings(gr.set)
	d.markSync(ctx, gr, eng, &gs, compareNow)
	gs.Standbys = []string{}
	gs.Healthy = true
	for _, m := range gs.Members {
		if m.Standby {
			gs.Standbys = append(gs.Standbys, m.Name)
		}
		if !m.Standby && m.State != agent.StateActive {
			gs.Healthy = false
		}
	}
	if gs.Members == nil {
		gs.Members = []agent.MemberStatus{}
	}
	d.clients.view().addFleet(&gs)
	gr.mu.Lock()
	if gr.stall != nil {
		st := *gr.stall
		gs.TombstoneStall = &st
	}
	gr.mu.Unlock()
	return gs
}

// noteStall keeps a tombstone_stalled event as its group's unresolved
// stall, shown by listgroups and failing synchronize --check until a
// synchronisation resolves it.
func (d *Daemon) noteStall(e agent.Event) {
	if e.Event != string(group.TombstoneStalled) {
		return
	}
	d.mu.RLock()
	gr := d.groups[e.Group]
	d.mu.RUnlock()
	if gr == nil {
		return
	}
	gr.mu.Lock()
	defer gr.mu.Unlock()
	gr.stall = &agent.TombstoneStall{Time: e.Time, Member: e.Member, Detail: e.Detail, Program: e.Program, PID: e.PID, Host: e.Host}
	if err := d.keepStall(e.Group, gr.stall); err != nil {
		d.log.Error("tombstone stall kept in memory only", "group", e.Group, "err", err)
	}
}

// Recover implements agent.Backend.
func (d *Daemon) Recover(ctx context.Context, req agent.RecoverRequest) (agent.RecoverResult, error) {
	gr, err := d.lookup(req.Group)
	if err != nil {
		return agent.RecoverResult{}, err
	}
	if req.Member != "" {
		if _, ok := gr.cfg.Member(req.Member); !ok {
			return agent.RecoverResult{}, agent.Errorf(agent.CodeNotFound, "group %q has no member %q", req.Group, req.Member)
		}
	}
	eng, openErr := gr.state()
	if eng == nil {
		return agent.RecoverResult{}, agent.Errorf(agent.CodeUnavailable, "group %q is not open: %v", req.Group, openErr)
	}
	start := time.Now()
	res, err := eng.Recover(ctx, req.Member)
	d.metrics.observe(req.Group, req.Member, "recover", time.Since(start))
	if err != nil {
		return agent.RecoverResult{}, err
	}
	if res == nil {
		res = []agent.MemberResult{}
	}
	d.compare(ctx, gr, eng, time.Now()) // so listgroups shows what the recovery left
	return agent.RecoverResult{SchemaVersion: agent.SchemaVersion, Group: req.Group, Members: res}, nil
}

// Synchronize implements agent.Backend.
func (d *Daemon) Synchronize(ctx context.Context, req agent.SyncRequest) (agent.SyncReport, error) {
	gr, err := d.lookup(req.Group)
	if err != nil {
		return agent.SyncReport{}, err
	}
	eng, openErr := gr.state()
	if eng == nil {
		return agent.SyncReport{}, agent.Errorf(agent.CodeUnavailable, "group %q is not open: %v", req.Group, openErr)
	}
	start := time.Now()
	rep, err := eng.Synchronize(ctx, req)
	op := "synchronize"
	if req.Check {
		op = "sync_check"
	}
	d.metrics.observe(req.Group, "", op, time.Since(start))
	if err != nil {
		return agent.SyncReport{}, err
	}
	if rep.Differences == nil {
		rep.Differences = []agent.Difference{}
	}
	rep.Group = req.Group
	gr.mu.Lock()
	switch {
	case req.Check && gr.stall != nil:
		st := *gr.stall
		rep.TombstoneStall = &st
	case !req.Check && rep.Failed == 0 && rep.Conflicts == 0:
		// Every member now holds the union of the tombstones and no longer
		// holds what they name: a stall's lost write, if any, is repaired.
		if err := d.keepStall(req.Group, nil); err != nil {
			d.log.Error("tombstone stall resolved but its record stays", "group", req.Group, "err", err)
		} else {
			gr.stall = nil
		}
	}
	gr.mu.Unlock()
	// Compare again (the rule's counts are not on the wire), so listgroups
	// and the in_sync / out_of_sync events reflect what is left.
	d.compare(ctx, gr, eng, time.Now())
	return rep, nil
}

// HALog implements agent.Backend.
func (d *Daemon) HALog(ctx context.Context, req agent.HALogRequest, emit func(agent.Event) error) error {
	return d.events.Read(ctx, req, emit)
}

// state returns the engine and the open error together.
func (gr *groupRun) state() (Engine, error) {
	gr.mu.Lock()
	defer gr.mu.Unlock()
	return gr.eng, gr.openErr
}

// probe runs one health probe of a group and records its durations.
func (d *Daemon) probe(ctx context.Context, gr *groupRun, eng Engine, every time.Duration) {
	pctx, cancel := context.WithTimeout(ctx, every+gr.set.CommandTimeout)
	defer cancel()
	for _, r := range eng.Probe(pctx) {
		if r.Duration == 0 && r.Err == nil {
			continue // not probed (failed or recovering)
		}
		d.metrics.observe(gr.cfg.Label, r.Member, "probe", r.Duration)
		if r.Err != nil {
			d.log.Debug("probe failed", "group", gr.cfg.Label, "member", r.Member, "error", r.Err)
		}
	}
}
