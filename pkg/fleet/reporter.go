// Package fleet is how every process that runs a group's engine — an
// application through libhapkcs11.so, a Go program through pkg/ha — tells
// haagent what it sees: its identity, each member's state and counters,
// and the HA events that happened in it. The agent sums the fleet's
// counters beside its own (listgroups, metrics), lists the processes
// (hactl hagroup clients) and writes their events to the HA event log, in
// order and folded.
//
// Reporting is best effort and never blocks the application: events go
// into a bounded queue (dropped, and counted, when it is full), a
// background goroutine sends a snapshot every few seconds and at once
// after an event, each send has a short timeout, and without an agent
// nothing happens per call (the events go to the Fallback, folded).
//
// The wire types are pkg/agent's (FleetReport …), beside the typed client.
package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/recover"
)

// Source is what the reporter reads of a group; *group.Group (and so
// *ha.Group) has it.
type Source interface {
	Label() string
	Members() []member.Snapshot
}

// Options configure a Reporter.
type Options struct {
	// Socket is the agent's socket ("" : report nowhere; events go to
	// Fallback).
	Socket string
	// Program names the process; "" : the base name of os.Args[0].
	Program string
	// Interval between snapshots; 0: agent.DefaultReportInterval; at most
	// agent.MaxReportInterval.
	Interval time.Duration
	// Timeout bounds one send; 0: one second.
	Timeout time.Duration
	// Fallback receives, from the reporter's goroutine, the events that
	// could not be delivered (no agent), already folded: a first
	// occurrence at once, repeats as one summary per FoldWindow. nil
	// drops them.
	Fallback func(e agent.FleetEvent)
}

// queueSize bounds the events waiting to be sent; minGap is the least
// time between two reports.
const (
	queueSize    = 256
	minGap       = 100 * time.Millisecond
	finalTimeout = 250 * time.Millisecond
)

// Reporter reports one process's groups and events to the agent. Every
// method is safe for concurrent use, never blocks on the agent, and does
// nothing on a nil *Reporter.
type Reporter struct {
	opts    Options
	hc      *http.Client
	started time.Time
	pid     int
	host    string

	queue   chan agent.FleetEvent
	kick    chan struct{}
	dropped atomic.Uint64

	mu      sync.Mutex
	sources []Source

	fold      *Folder[agent.FleetEvent]
	done      chan struct{}
	stopped   chan struct{}
	closeOnce sync.Once
	// delivered counts reports the agent accepted (for tests).
	delivered atomic.Uint64
}

// Start starts a reporter's goroutine; Close stops it.
func Start(opts Options) *Reporter {
	if opts.Program == "" {
		opts.Program = filepath.Base(os.Args[0])
	}
	if opts.Interval <= 0 {
		opts.Interval = agent.DefaultReportInterval
	}
	// The agent forgets a process silent for 6 default intervals.
	opts.Interval = min(opts.Interval, agent.MaxReportInterval)
	if opts.Timeout <= 0 {
		opts.Timeout = time.Second
	}
	host, _ := os.Hostname()
	r := &Reporter{
		opts: opts, started: time.Now().UTC(), pid: os.Getpid(), host: host,
		queue: make(chan agent.FleetEvent, queueSize), kick: make(chan struct{}, 1),
		done: make(chan struct{}), stopped: make(chan struct{}),
	}
	r.fold = NewFolder(FoldWindow, func(e agent.FleetEvent, n int, w time.Duration) {
		if n > 0 {
			e.Detail = FoldedDetail(e.Detail, n, w)
		}
		if r.opts.Fallback != nil {
			r.opts.Fallback(e)
		}
	})
	sock := opts.Socket
	r.hc = &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			},
			MaxIdleConnsPerHost: 1,
			IdleConnTimeout:     3 * opts.Interval,
			DisableCompression:  true,
		},
	}
	go r.run()
	return r
}

// Watch adds a group to the snapshots; the returned function removes it.
func (r *Reporter) Watch(s Source) (unwatch func()) {
	if r == nil {
		return func() {}
	}
	r.mu.Lock()
	r.sources = append(r.sources, s)
	r.mu.Unlock()
	r.poke()
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		for i, x := range r.sources {
			if x == s {
				r.sources = append(r.sources[:i], r.sources[i+1:]...)
				return
			}
		}
	}
}

// Event queues e and asks for a report at once; a full queue drops it.
func (r *Reporter) Event(e agent.FleetEvent) {
	if r == nil {
		return
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	e.Time = e.Time.UTC()
	select {
	case r.queue <- e:
	default:
		r.dropped.Add(1)
	}
	r.poke()
}

// GroupEvent reports an engine event (a group.EventSink's agent.FleetEvent).
func (r *Reporter) GroupEvent(e group.Event) {
	if r == nil {
		return
	}
	detail := ""
	switch {
	case e.Err != nil:
		detail = e.Err.Error()
	case e.Object.Label != "" || len(e.Object.ID) > 0:
		detail = e.Object.String()
	case e.From != e.To:
		detail = fmt.Sprintf("%s -> %s", e.From, e.To)
	}
	r.Event(agent.FleetEvent{Time: e.Time, Group: e.Group, Member: e.Member, Event: string(e.Kind), Detail: detail})
}

// RecoveryEvent reports a recoverer's event of group label.
func (r *Reporter) RecoveryEvent(label string, e recover.Event) {
	if r == nil {
		return
	}
	r.Event(agent.FleetEvent{Group: label, Member: e.Member, Event: string(e.Kind), Detail: e.Detail()})
}

// Close sends a last report (bounded by the send timeout), writes the
// pending fallback summaries and stops the goroutine; it waits for it.
func (r *Reporter) Close() {
	if r == nil {
		return
	}
	r.closeOnce.Do(func() { close(r.done) })
	<-r.stopped
}

// closing reports whether Close was called.
func (r *Reporter) closing() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

func (r *Reporter) poke() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

func (r *Reporter) run() {
	defer close(r.stopped)
	defer r.hc.CloseIdleConnections()
	t := time.NewTicker(r.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-r.done:
		case <-t.C:
		case <-r.kick:
		}
		// Checked apart: select picks at random among ready cases, and
		// send pokes kick while events wait, so a closing reporter could
		// otherwise make several more sends before its final one.
		if r.closing() {
			r.send(true)
			r.fold.FlushAll()
			return
		}
		r.send(false)
		r.fold.Flush()
		// A burst of events is sent in reports minGap apart, not one each.
		select {
		case <-r.done:
		case <-time.After(minGap):
		}
	}
}

// send sends one report with the queued events (at most agent.MaxEvents; the
// rest go in the next, which is asked for at once).
func (r *Reporter) send(final bool) {
	rep := r.snapshot(final)
	if r.opts.Socket == "" {
		r.fallback(rep.Events)
		return
	}
	if len(r.queue) > 0 {
		r.poke()
	}
	err := r.post(rep)
	if err != nil {
		r.fallback(rep.Events)
		return
	}
	r.delivered.Add(1)
}

func (r *Reporter) fallback(es []agent.FleetEvent) {
	for _, e := range es {
		r.fold.Add(e.Group+"\x00"+e.Member+"\x00"+e.Event, e)
	}
}

func (r *Reporter) snapshot(final bool) agent.FleetReport {
	rep := agent.FleetReport{Program: trim(r.opts.Program, agent.MaxProgramLen), PID: r.pid, Host: trim(r.host, agent.MaxHostLen),
		Started: r.started, Dropped: r.dropped.Load(), Final: final, Groups: []agent.FleetGroup{}}
	r.mu.Lock()
	srcs := append([]Source(nil), r.sources...)
	r.mu.Unlock()
	for _, s := range srcs {
		if len(rep.Groups) == agent.MaxGroups {
			break
		}
		g := agent.FleetGroup{Group: s.Label(), Members: []agent.FleetMember{}}
		for _, m := range s.Members() {
			if len(g.Members) == agent.MaxMembers {
				break
			}
			g.Members = append(g.Members, agent.FleetMember{Name: m.Name, State: m.State.String(),
				Operations: m.Ops, Errors: m.Errors, Failovers: m.Failovers, InFlight: m.InFlight, Hedges: m.Hedges})
		}
		rep.Groups = append(rep.Groups, g)
	}
	for len(rep.Events) < agent.MaxEvents {
		select {
		case e := <-r.queue:
			e.Detail = trim(e.Detail, agent.MaxDetailLen)
			rep.Events = append(rep.Events, e)
			continue
		default:
		}
		break
	}
	return rep
}

// errRefused is an answer other than 2xx from the agent.
var errRefused = errors.New("agent refused the report")

func (r *Reporter) post(rep agent.FleetReport) error {
	b, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	timeout := r.opts.Timeout
	if rep.Final {
		timeout = min(timeout, finalTimeout) // the application is waiting in its close
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+agent.Host+agent.ReportPath, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%w: %s", errRefused, resp.Status)
	}
	return nil
}

// trim cuts s to at most n bytes, on a rune boundary.
func trim(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}
