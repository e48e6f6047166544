package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/test/load"
)

// run of the failover chapter: what the summary and the picture need.
type failoverRun struct {
	start       time.Time // load ready
	kill        time.Time // primary's server killed
	dropped     time.Time // the load's engine took it out of rotation
	restart     time.Time // server back
	back        time.Time // the load's engine has it back in rotation
	end         time.Time
	victim      string
	result      *load.Result
	statsPath   string
	sigPath     string
	verified    int
	badSigs     int
	syncCode    int
	interval    time.Duration // recovery interval in the configuration
	loadThreads int
	rate        int // offered signatures per second; 0: flat out
	loadPeakKB  int // peak resident memory of the load process (libhapkcs11.so inside)
	agentPeakKB int // peak resident memory of haagent
}

// failover runs the signing load, kills the primary's server, shows the
// group with it down, restarts it and waits until it is back in rotation.
func (d *demo) failover(ctx context.Context) (*failoverRun, error) {
	d.title("7. A signing load through libhapkcs11.so (%d threads), and the primary HSM killed in the middle of it", d.o.threads)
	r := &failoverRun{victim: plan()[0].name, interval: time.Second, loadThreads: d.o.threads, rate: d.o.rate,
		statsPath: filepath.Join(d.o.out, "stats.jsonl"), sigPath: filepath.Join(d.o.out, "signatures.bin")}
	prog := filepath.Join(d.o.out, "haload")
	d.say("$ gcc -O2 -o %s test/load/c/haload.c -ldl -lpthread    # our load generator, in C", d.show(prog))
	if err := load.BuildHaload(ctx, d.o.src, prog); err != nil {
		return nil, err
	}
	env := append(append([]string{}, d.env...), "HAGROUP_STATS_FILE="+r.statsPath)
	rateFlag := ""
	if d.o.rate > 0 {
		rateFlag = fmt.Sprintf(" -R %d", d.o.rate)
	}
	d.say("$ HAGROUP_STATS_FILE=%s haload -m %s -s %#x -p %s -k %s -t %d%s -o %s",
		d.show(r.statsPath), d.show(filepath.Join(d.o.bin, "libhapkcs11.so")), slotID, d.show(d.userFile), keyLabel,
		d.o.threads, rateFlag, d.show(r.sigPath))
	d.say("    (HAGROUP_STATS_FILE asks libhapkcs11.so for its per-member counters every 100 ms, for the picture)")
	d.say("    (%s)", loadNote(d.o.rate))
	raw, err := os.Create(filepath.Join(d.o.out, "logs", "haload.out"))
	if err != nil {
		return nil, err
	}
	defer raw.Close()
	var rawMu sync.Mutex
	l, err := load.StartLoad(ctx, d.reg, load.LoadOptions{
		Prog: prog, Module: filepath.Join(d.o.bin, "libhapkcs11.so"), Slot: slotID, PINFile: d.userFile,
		Key: keyLabel, Threads: d.o.threads, Rate: d.o.rate, SigFile: r.sigPath, Tick: 100 * time.Millisecond,
		Seed: uint64(time.Now().UnixNano()), Env: env, Dir: d.o.out,
	}, func(line string) {
		rawMu.Lock()
		fmt.Fprintln(raw, line)
		rawMu.Unlock()
	})
	if err != nil {
		return nil, err
	}
	r.start = time.Now()
	stopProgress := d.startProgress(l, r.statsPath)
	defer stopProgress()

	if err := sleep(ctx, d.o.phase); err != nil {
		return nil, err
	}
	victim := d.servers[0]
	pid := victim.PID()
	r.kill = time.Now()
	if err := victim.Kill(); err != nil {
		return nil, err
	}
	d.say("$ kill -KILL -%d    # %s's server: the group's primary HSM dies mid-load", pid, r.victim)
	at, err := d.waitStats(ctx, r.statsPath, l.PID(), r.kill, 30*time.Second, func(m load.StatsMember) bool { return m.State != "active" })
	if err != nil {
		return nil, fmt.Errorf("the load's engine did not drop %s: %w", r.victim, err)
	}
	r.dropped = at
	d.say("libhapkcs11.so in the load dropped %s %s after the kill; the signing goes on on the other member", r.victim, ms(at.Sub(r.kill)))
	if err := d.waitAgent(ctx, 30*time.Second, func(rep agent.GroupsReport) bool { return memberState(rep, r.victim) != "active" }); err != nil {
		return nil, err
	}
	if _, _, err := d.hactl(ctx, []int{3}, "hagroup", "listgroups"); err != nil {
		return nil, err
	}
	d.say("(exit code 3: the group is degraded; the standby hsm-c stays idle while an active member is left)")

	if err := sleep(ctx, d.o.phase); err != nil {
		return nil, err
	}
	if err := victim.Start(ctx); err != nil {
		return nil, err
	}
	r.restart = time.Now()
	d.say("$ %s &    # %s's HSM is back, pid %d", d.show(victim.Command()), r.victim, victim.PID())
	// Back in rotation: active again, and serving operations.
	var opsAtRestart uint64
	if lines, err := load.ReadStats(r.statsPath); err == nil {
		if last, ok := load.Latest(lines, groupLabel, l.PID()); ok {
			m, _ := last.Member(r.victim)
			opsAtRestart = m.Ops
		}
	}
	at, err = d.waitStats(ctx, r.statsPath, l.PID(), r.restart, 60*time.Second, func(m load.StatsMember) bool {
		return m.State == "active" && m.Ops > opsAtRestart
	})
	if err != nil {
		return nil, fmt.Errorf("%s did not come back in rotation in the load: %w", r.victim, err)
	}
	r.back = at
	d.say("%s recovered: back in rotation in the load %s after its server restarted", r.victim, ms(at.Sub(r.restart)))
	// haagent recovers its own engine's member too, and re-checks the
	// group's synchronisation every interval.
	if err := d.waitAgent(ctx, 60*time.Second, func(rep agent.GroupsReport) bool {
		return memberState(rep, r.victim) == "active" && len(rep.Groups) == 1 && len(rep.Groups[0].NeedsSync) == 0
	}); err != nil {
		return nil, err
	}
	if _, _, err := d.hactl(ctx, nil, "hagroup", "listgroups"); err != nil {
		return nil, err
	}
	if err := sleep(ctx, d.o.phase); err != nil {
		return nil, err
	}
	stopProgress()
	r.loadPeakKB = peakRSS(l.PID())
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	res, err := l.Stop(sctx)
	if err != nil {
		return nil, err
	}
	r.end = time.Now()
	r.result = res
	d.say("load stopped: %d signatures, %d failed", res.Ops, res.Failed)
	return r, nil
}

// waitStats polls the module's stats file until cond holds for the
// victim in a line of pid's written at or after since.
func (d *demo) waitStats(ctx context.Context, path string, pid int, since time.Time, limit time.Duration, cond func(load.StatsMember) bool) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	victim := plan()[0].name
	for {
		lines, err := load.ReadStats(path)
		if err == nil {
			for _, l := range lines {
				if l.PID != pid || l.Group != groupLabel || l.Time.Before(since) {
					continue
				}
				if m, ok := l.Member(victim); ok && cond(m) {
					return l.Time, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("not within %v (%v)", limit, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// startProgress shows a progress line (on a terminal, rewritten in place;
// otherwise a line every few seconds) until the returned func is called.
func (d *demo) startProgress(l *load.Load, statsPath string) func() {
	if d.o.quiet {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		every := 250 * time.Millisecond
		if !d.tty {
			every = 3 * time.Second
		}
		t := time.NewTicker(every)
		defer t.Stop()
		var lastOK int
		lastAt := time.Now()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			ok, failed := l.Progress()
			now := time.Now()
			rate := float64(ok-lastOK) / now.Sub(lastAt).Seconds()
			lastOK, lastAt = ok, now
			var members []string
			if lines, err := load.ReadStats(statsPath); err == nil {
				rates := load.Rates(lines[max(0, len(lines)-12):], groupLabel, 500*time.Millisecond)
				if last, ok := load.Latest(lines, groupLabel, l.PID()); ok {
					for _, m := range last.Members {
						pts := rates[m.Name]
						v := 0.0
						if len(pts) > 0 {
							v = pts[len(pts)-1].Value
						}
						members = append(members, fmt.Sprintf("%s %s %4.0f/s", m.Name, m.State, v))
					}
				}
			}
			line := fmt.Sprintf("  signing: %7d signatures  %5.0f/s  failed %d  |  %s", ok, rate, failed, strings.Join(members, "  "))
			d.outMu.Lock()
			if d.tty {
				fmt.Fprint(d.w, "\r\033[K"+line)
				d.progress = true
			} else {
				fmt.Fprintln(d.w, line)
			}
			d.outMu.Unlock()
		}
	}()
	var once bool
	return func() {
		if once {
			return
		}
		once = true
		close(done)
		<-finished
		d.outMu.Lock()
		d.clearProgress()
		d.outMu.Unlock()
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func ms(d time.Duration) string {
	if d < 10*time.Second {
		return fmt.Sprintf("%d ms", d.Milliseconds())
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

// peakRSS returns a process's peak resident memory in KiB (VmHWM), 0 when
// it cannot be read.
func peakRSS(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kb int
			fmt.Sscanf(strings.TrimSpace(v), "%d", &kb)
			return kb
		}
	}
	return 0
}
