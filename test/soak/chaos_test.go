package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/test/load"
)

// chaos is the seeded fault schedule: it kills (SIGKILL), stops
// (SIGSTOP, later SIGCONT) and restarts member servers, never leaving the
// group without a member that every engine has confirmed healthy, and now
// and then kills and restarts haagent.
type chaos struct {
	w         *world
	rng       *rand.Rand
	g         *group.Group // the Go API's engine
	statsPath string
	loadPID   int

	mu         sync.Mutex
	log        []string
	killedAt   []time.Time // per member; zero when running
	restoredAt []time.Time // last restart after a kill
	contAt     []time.Time // per member; zero when not stopped
	contedAt   []time.Time // last SIGCONT
	kills      int
	stops      int
	restarts   int
	agentKills int
	maxStopped int
	agentHangs []string // restarts after which haagent did not answer
	repairs    int      // token.object files a kill left truncated (world.repairToken)
	halfMade   int      // object files a kill left half-written (world.removeHalfWritten)
}

// restart restarts member i's killed server, after putting back its token
// file if the kill truncated it.
func (c *chaos) restart(ctx context.Context, i int, why string) error {
	repaired, err := c.w.repairToken(i)
	if err != nil {
		return fmt.Errorf("%s: token file: %w", c.w.members[i], err)
	}
	half, err := c.w.removeHalfWritten(i)
	if err != nil {
		return fmt.Errorf("%s: object files: %w", c.w.members[i], err)
	}
	if half > 0 {
		c.halfMade += half
		c.note("removed %d half-written object file(s) of %s (a kill stopped SoftHSM mid-create)", half, c.w.members[i])
	}
	if err := c.keepingSchedule(func() error { return c.w.servers[i].Start(ctx) }); err != nil {
		return err
	}
	c.killedAt[i] = time.Time{}
	c.restoredAt[i] = time.Now()
	c.restarts++
	if repaired {
		c.repairs++
		c.note("restarted %s%s, its token.object restored (the kill left it truncated)", c.w.members[i], why)
		return nil
	}
	c.note("restarted %s%s", c.w.members[i], why)
	return nil
}

// keepingSchedule runs start (a server's or haagent's start, which waits
// until it answers) and, while it waits, keeps the schedule's SIGCONTs.
// The members' SoftHSM tokens share one token directory, and SoftHSM's
// C_Initialize reads every token's file under its lock: a process that
// opens the tokens while another member's process is stopped holding that
// lock cannot come up until it is continued. (Separate hardware members
// do not wait on each other so.) Without this, the stop would last as
// long as the start's deadline, not the schedule's few seconds.
func (c *chaos) keepingSchedule(start func() error) error {
	done := make(chan error, 1)
	go func() { done <- start() }()
	for {
		wait := time.Duration(-1)
		now := time.Now()
		for _, at := range c.contAt {
			if !at.IsZero() && (wait < 0 || at.Sub(now) < wait) {
				wait = max(at.Sub(now), 0)
			}
		}
		if wait < 0 {
			return <-done
		}
		t := time.NewTimer(wait)
		select {
		case err := <-done:
			t.Stop()
			return err
		case <-t.C:
			if err := c.contDue(); err != nil {
				<-done
				return err
			}
		}
	}
}

// contDue continues the stopped members whose time has come.
func (c *chaos) contDue() error {
	now := time.Now()
	for i, at := range c.contAt {
		if !at.IsZero() && !now.Before(at) {
			if err := c.w.servers[i].Cont(); err != nil {
				return err
			}
			c.contAt[i] = time.Time{}
			c.contedAt[i] = time.Now()
			c.note("SIGCONT %s", c.w.members[i])
		}
	}
	return nil
}

func newChaos(w *world, seed uint64, g *group.Group, statsPath string, loadPID int) *chaos {
	n := len(w.members)
	return &chaos{w: w, rng: rand.New(rand.NewPCG(seed, 0x5eed)), g: g, statsPath: statsPath, loadPID: loadPID,
		killedAt: make([]time.Time, n), restoredAt: make([]time.Time, n), contAt: make([]time.Time, n),
		contedAt: make([]time.Time, n)}
}

func (c *chaos) note(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.log = append(c.log, time.Now().Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
}

// confirmed reports which members are up and known healthy by both the Go
// engine and the C module's engine: server running and not stopped, not
// continued within the last command_timeout (calls it held while stopped
// may still time out and fail it), and, if it was ever killed, seen
// serving again by both engines since its restart (a restarted member that
// an engine has not re-opened yet would fail there).
func (c *chaos) confirmed() []bool {
	out := make([]bool, len(c.w.members))
	goStates := map[string]struct {
		serving bool
		since   time.Time
	}{}
	for _, m := range c.g.Members() {
		goStates[m.Name] = struct {
			serving bool
			since   time.Time
		}{m.State.Serving(), m.Since}
	}
	lines, _ := load.ReadStats(c.statsPath)
	modLine, haveMod := load.Latest(lines, groupLabel, c.loadPID)
	for i, name := range c.w.members {
		if !c.killedAt[i].IsZero() || !c.contAt[i].IsZero() {
			continue
		}
		if time.Since(c.contedAt[i]) < commandTimeout+500*time.Millisecond {
			continue
		}
		gs := goStates[name]
		if !gs.serving {
			continue
		}
		if !haveMod {
			continue
		}
		mm, ok := modLine.Member(name)
		if !ok || (mm.State != "active" && mm.State != "standby") {
			continue
		}
		if r := c.restoredAt[i]; !r.IsZero() && (gs.since.Before(r) || mm.Since.Before(r) || modLine.Time.Before(r)) {
			continue
		}
		out[i] = true
	}
	return out
}

// run applies faults until ctx ends, then restores every member.
func (c *chaos) run(ctx context.Context) error {
	lastAgentKill := time.Now()
	for {
		wait := time.Duration(400+c.rng.IntN(1100)) * time.Millisecond
		// Wake early for a pending SIGCONT.
		now := time.Now()
		for _, at := range c.contAt {
			if !at.IsZero() && at.Sub(now) < wait {
				wait = max(at.Sub(now), 0)
			}
		}
		select {
		case <-ctx.Done():
			return c.restoreAll(context.Background())
		case <-time.After(wait):
		}
		if err := c.contDue(); err != nil {
			return err
		}
		if err := c.step(ctx, &lastAgentKill); err != nil {
			return err
		}
	}
}

// step picks one action. ctx is the chaos's own context, which ends with
// the schedule: restarts use one that does not.
func (c *chaos) step(ctx context.Context, lastAgentKill *time.Time) error {
	ctx = context.WithoutCancel(ctx)
	if time.Since(*lastAgentKill) > 8*time.Second && c.rng.IntN(100) < 8 {
		*lastAgentKill = time.Now()
		if err := c.w.killAgent(); err != nil {
			return err
		}
		c.note("SIGKILL haagent")
		c.agentKills++
		if err := c.keepingSchedule(func() error { return c.w.startAgent(ctx) }); err != nil {
			// A finding, not the end of the soak: note it, and try once more.
			c.agentHangs = append(c.agentHangs, err.Error())
			c.note("haagent did not answer after its restart: %v", err)
			_ = c.w.killAgent()
			if err := c.keepingSchedule(func() error { return c.w.startAgent(ctx) }); err != nil {
				return fmt.Errorf("restarting haagent a second time: %w", err)
			}
		}
		c.note("haagent restarted")
		return nil
	}
	// Restart a member killed at least a second ago, half the time.
	var killed []int
	for i, at := range c.killedAt {
		if !at.IsZero() && time.Since(at) > time.Second {
			killed = append(killed, i)
		}
	}
	if len(killed) > 0 && c.rng.IntN(2) == 0 {
		i := killed[c.rng.IntN(len(killed))]
		return c.restart(ctx, i, "")
	}
	// Fault a running member, if another confirmed one stays.
	ok := c.confirmed()
	var victims []int
	for i := range c.w.members {
		if c.killedAt[i].IsZero() && c.contAt[i].IsZero() {
			victims = append(victims, i)
		}
	}
	if len(victims) == 0 {
		return nil
	}
	v := victims[c.rng.IntN(len(victims))]
	others := 0
	for i, good := range ok {
		if good && i != v {
			others++
		}
	}
	if others == 0 {
		c.note("no fault on %s: it would leave no confirmed member", c.w.members[v])
		return nil
	}
	if c.rng.IntN(3) == 0 {
		d := time.Duration(300+c.rng.IntN(2700)) * time.Millisecond
		if err := c.w.servers[v].Stop(); err != nil {
			return err
		}
		c.contAt[v] = time.Now().Add(d)
		c.stops++
		c.note("SIGSTOP %s for %v", c.w.members[v], d)
	} else {
		if err := c.w.servers[v].Kill(); err != nil {
			return err
		}
		c.killedAt[v] = time.Now()
		c.kills++
		c.note("SIGKILL %s", c.w.members[v])
	}
	stopped := 0
	for _, at := range c.contAt {
		if !at.IsZero() {
			stopped++
		}
	}
	c.maxStopped = max(c.maxStopped, stopped)
	return nil
}

// restoreAll continues stopped members, then restarts killed ones (a
// restart can wait on a stopped member: keepingSchedule).
func (c *chaos) restoreAll(ctx context.Context) error {
	for i := range c.w.members {
		if !c.contAt[i].IsZero() {
			if err := c.w.servers[i].Cont(); err != nil {
				return err
			}
			c.contAt[i] = time.Time{}
			c.note("SIGCONT %s (end)", c.w.members[i])
		}
	}
	for i := range c.w.members {
		if !c.killedAt[i].IsZero() {
			if err := c.restart(ctx, i, " (end)"); err != nil {
				return err
			}
		}
	}
	return nil
}

func (c *chaos) summary() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("%d kills, %d stops (at most %d at once), %d restarts, %d haagent kills; token.object files restored after a kill truncated them: %d; half-written object files removed: %d",
		c.kills, c.stops, c.maxStopped, c.restarts, c.agentKills, c.repairs, c.halfMade)
}

func (c *chaos) history() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := append([]string(nil), c.log...)
	sort.Strings(h)
	return strings.Join(h, "\n")
}
