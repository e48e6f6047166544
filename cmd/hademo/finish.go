package main

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/hagroup/hagroup/test/load"
)

// finish checks the group is in sync, verifies every signature, prints
// the summary, draws the picture and stops the agent.
func (d *demo) finish(ctx context.Context, r *failoverRun) error {
	d.title("8. Checks")
	_, code, err := d.hactl(ctx, []int{0, 3}, "hagroup", "synchronize", "--group", groupLabel, "--check")
	if err != nil {
		return err
	}
	r.syncCode = code
	verified, bad, err := load.VerifySignatures(r.sigPath, r.result.Pub)
	if err != nil {
		return fmt.Errorf("verifying signatures: %w", err)
	}
	r.verified, r.badSigs = verified, bad
	d.say("every signature checked with Go's crypto/ecdsa against the public key, without any HSM: %d good, %d bad", verified-bad, bad)

	r.agentPeakKB = peakRSS(d.agentProc.PID())
	lines, err := load.ReadStats(r.statsPath)
	if err != nil {
		return fmt.Errorf("reading the module's counters: %w", err)
	}
	s := summarize(r, lines)
	d.title("Summary")
	for _, l := range s.lines() {
		d.say("%s", l)
	}
	svg := filepath.Join(d.o.out, "failover.svg")
	if err := drawFailover(svg, r, lines); err != nil {
		return fmt.Errorf("drawing %s: %w", svg, err)
	}
	d.say("")
	d.say("picture: %s (operations per second of each member, kill and recovery marked)", d.show(svg))
	d.say("HA event log: hactl hagroup halog    (or %s)", d.show(filepath.Join(d.o.out, "ha.log")))

	// haagent drains and exits 0 on SIGTERM.
	if err := d.agentProc.Signal(syscall.SIGTERM); err == nil {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err = d.agentProc.Wait(wctx)
		cancel()
		if err != nil {
			d.say("haagent did not stop cleanly on SIGTERM: %v", err)
		}
	}
	if problems := s.problems(); len(problems) > 0 {
		return fmt.Errorf("the story did not hold: %s", strings.Join(problems, "; "))
	}
	d.say("")
	d.say("The application saw no failure while its primary HSM died and came back.")
	return nil
}

// summary is what the demo reports at the end.
type summary struct {
	ops, failed, wrong int
	seconds            float64
	verified, badSigs  int
	stall, before      time.Duration // longest call around the kill / before it
	dropped            time.Duration // kill → out of rotation
	recovery           time.Duration // server restart → back in rotation
	interval           time.Duration
	share              []memberShare
	syncCode           int
	victim             string
	loadKB, agentKB    int
	threads            int
	rate               int // offered; 0: flat out
	phases             phaseRates
}

type memberShare struct {
	name, state string
	ops         uint64
}

// stallWindow is how long after the kill the load's longest call counts as
// the failover stall.
const stallWindow = 3 * time.Second

func summarize(r *failoverRun, lines []load.StatsLine) summary {
	res := r.result
	s := summary{ops: res.Ops, failed: res.Failed, wrong: res.Bad, seconds: r.end.Sub(r.start).Seconds(),
		verified: r.verified, badSigs: r.badSigs, dropped: r.dropped.Sub(r.kill), recovery: r.back.Sub(r.restart),
		interval: r.interval, syncCode: r.syncCode, victim: r.victim,
		loadKB: r.loadPeakKB, agentKB: r.agentPeakKB, threads: r.loadThreads, rate: r.rate, phases: ratesByPhase(r)}
	for _, t := range res.Ticks {
		// A tick's latency belongs to calls that ended in it.
		switch {
		case t.At.Before(r.kill):
			s.before = max(s.before, t.MaxLat)
		case t.At.Before(r.kill.Add(stallWindow)):
			s.stall = max(s.stall, t.MaxLat)
		}
	}
	var first, last load.StatsLine
	var have bool
	for _, l := range lines {
		if l.Group != groupLabel {
			continue
		}
		if !have {
			first, have = l, true
		}
		last = l
	}
	for _, m := range last.Members {
		f, _ := first.Member(m.Name)
		s.share = append(s.share, memberShare{name: m.Name, state: m.State, ops: m.Ops - f.Ops})
	}
	sort.Slice(s.share, func(i, j int) bool { return s.share[i].name < s.share[j].name })
	return s
}

// lines renders the summary.
func (s summary) lines() []string {
	var total uint64
	for _, m := range s.share {
		total += m.ops
	}
	var shares []string
	for _, m := range s.share {
		pct := 0.0
		if total > 0 {
			pct = 100 * float64(m.ops) / float64(total)
		}
		shares = append(shares, fmt.Sprintf("%s %d (%.0f%%)", m.name, m.ops, pct))
	}
	rate := 0.0
	if s.seconds > 0 {
		rate = float64(s.ops) / s.seconds
	}
	sync := "in sync (synchronize --check exit 0)"
	if s.syncCode != 0 {
		sync = fmt.Sprintf("OUT OF SYNC (synchronize --check exit %d)", s.syncCode)
	}
	return []string{
		fmt.Sprintf("  operations           %d signatures in %.1f s (%.0f/s) through libhapkcs11.so", s.ops, s.seconds, rate),
		fmt.Sprintf("  signing rate         %s", s.phases.line(s.rate, s.victim)),
		fmt.Sprintf("  failures             %d", s.failed),
		fmt.Sprintf("  signatures verified  %d of %d, independently (Go crypto/ecdsa); %d bad", s.verified-s.badSigs, s.ops, s.badSigs),
		fmt.Sprintf("  failover stall       longest C_Sign %s in the %v after the kill (longest before it: %s); %s dropped %s after the kill",
			ms(s.stall), stallWindow, ms(s.before), s.victim, ms(s.dropped)),
		fmt.Sprintf("  recovery time        %s back in rotation %s after its server restarted (retry interval %v)", s.victim, ms(s.recovery), s.interval),
		fmt.Sprintf("  work per member      %s", strings.Join(shares, ", ")),
		fmt.Sprintf("  group                %s", sync),
		fmt.Sprintf("  memory (peak RSS)    haagent %.1f MiB; the load process with libhapkcs11.so and %d threads %.1f MiB",
			float64(s.agentKB)/1024, s.threads, float64(s.loadKB)/1024),
	}
}

// problems lists what went wrong, if anything.
func (s summary) problems() []string {
	var p []string
	if s.failed != 0 {
		p = append(p, fmt.Sprintf("%d operations failed", s.failed))
	}
	if s.wrong != 0 {
		p = append(p, fmt.Sprintf("%d wrong answers", s.wrong))
	}
	if s.badSigs != 0 {
		p = append(p, fmt.Sprintf("%d signatures do not verify", s.badSigs))
	}
	if s.verified != s.ops {
		p = append(p, fmt.Sprintf("%d signatures recorded for %d operations", s.verified, s.ops))
	}
	if s.syncCode != 0 {
		p = append(p, "the group is out of sync")
	}
	if s.ops == 0 {
		p = append(p, "no signature was made")
	}
	return p
}
