package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/hagroup/hagroup/pkg/member"
)

// Per-member counters on request. An application (a load generator, the
// demo, the soak test) that wants to see how the engine in its own process
// spreads work over the members sets HAGROUP_STATS_FILE to a file the module
// appends one JSON line per group to every HAGROUP_STATS_INTERVAL (a Go
// duration, default 100ms), plus a last line at C_Finalize. Unset, nothing
// runs. The lines hold names, states and counters only: never a PIN, a key
// or data.
const (
	statsFileEnv     = "HAGROUP_STATS_FILE"
	statsIntervalEnv = "HAGROUP_STATS_INTERVAL"
	statsDefault     = 100 * time.Millisecond
	statsMin         = 10 * time.Millisecond
)

// statsSource is what the stats writer reads of a group; *group.Group has it.
type statsSource interface {
	Label() string
	Members() []member.Snapshot
}

// statsLine is one line of the stats file.
type statsLine struct {
	Time    time.Time     `json:"time"`
	PID     int           `json:"pid"`
	Group   string        `json:"group"`
	Members []statsMember `json:"members"`
}

// statsMember is one member's counters: cumulative since the module was
// initialised, so a reader takes differences for rates.
type statsMember struct {
	Name      string    `json:"name"`
	State     string    `json:"state"` // member.State by name
	Since     time.Time `json:"since"` // when it entered State
	Ops       uint64    `json:"ops"`
	Errors    uint64    `json:"errors"`
	Failovers uint64    `json:"failovers"`
	InFlight  int64     `json:"in_flight"`
}

// statsWriter appends counters to the stats file until stopped.
type statsWriter struct {
	f        *os.File
	pid      int
	interval time.Duration
	sources  []statsSource
	done     chan struct{}
	wg       sync.WaitGroup
	once     sync.Once
}

// startStats starts a writer when HAGROUP_STATS_FILE is set; it returns
// nil, nil when it is not. getenv is os.Getenv outside tests.
func startStats(getenv func(string) string, sources []statsSource) (*statsWriter, error) {
	path := getenv(statsFileEnv)
	if path == "" {
		return nil, nil
	}
	interval := statsDefault
	if v := getenv(statsIntervalEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < statsMin {
			return nil, fmt.Errorf("%s=%q: want a duration of at least %v", statsIntervalEnv, v, statsMin)
		}
		interval = d
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", statsFileEnv, err)
	}
	w := &statsWriter{f: f, pid: os.Getpid(), interval: interval, sources: sources, done: make(chan struct{})}
	w.write() // a first line at once: the reader knows when counting began
	w.wg.Add(1)
	go w.run()
	return w, nil
}

func (w *statsWriter) run() {
	defer w.wg.Done()
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-w.done:
			return
		case <-t.C:
			w.write()
		}
	}
}

// write appends one line per group, each in one write (O_APPEND keeps lines
// whole). A failed write is dropped: counters must never fail the
// application.
func (w *statsWriter) write() {
	now := time.Now().UTC()
	for _, s := range w.sources {
		snaps := s.Members()
		line := statsLine{Time: now, PID: w.pid, Group: s.Label(), Members: make([]statsMember, len(snaps))}
		for i, m := range snaps {
			line.Members[i] = statsMember{Name: m.Name, State: m.State.String(), Since: m.Since, Ops: m.Ops, Errors: m.Errors,
				Failovers: m.Failovers, InFlight: m.InFlight}
		}
		b, err := json.Marshal(line)
		if err != nil {
			continue
		}
		_, _ = w.f.Write(append(b, '\n'))
	}
}

// stop writes a last line, stops the writer and closes the file; it waits
// for the writer goroutine. Safe to call more than once and on nil.
func (w *statsWriter) stop() error {
	if w == nil {
		return nil
	}
	var err error
	w.once.Do(func() {
		close(w.done)
		w.wg.Wait()
		w.write()
		err = w.f.Close()
	})
	return err
}
