package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// EventLog is the HA event log: one JSON Event per line in a file, rotated
// to path+".1" when it would pass its size limit, with followers that see
// each new event as it is appended. With an empty path it keeps the last
// 1000 events in memory only. Safe for concurrent use.
type EventLog struct {
	path     string
	maxBytes int64
	now      func() time.Time

	mu     sync.Mutex
	f      *os.File
	size   int64
	ring   []Event // memory-only mode
	subs   map[*follower]struct{}
	closed bool
}

const ringSize = 1000

type follower struct {
	ch     chan Event
	lagged bool
}

// OpenEventLog opens (creating 0640) the log at path, appending.
// maxBytes <= 0 means 10 MiB.
func OpenEventLog(path string, maxBytes int64) (*EventLog, error) {
	if maxBytes <= 0 {
		maxBytes = 10 << 20
	}
	l := &EventLog{path: path, maxBytes: maxBytes, now: time.Now, subs: map[*follower]struct{}{}}
	if path == "" {
		return l, nil
	}
	if err := l.openFile(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *EventLog) openFile() error {
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return fmt.Errorf("HA event log: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("HA event log: %w", err)
	}
	l.f, l.size = f, fi.Size()
	return nil
}

// Path returns the log file's path ("" in memory-only mode).
func (l *EventLog) Path() string { return l.path }

// Append writes e (stamping Time when zero) and hands it to followers.
func (l *EventLog) Append(e Event) error {
	if e.Time.IsZero() {
		e.Time = l.now()
	}
	e.Time = e.Time.UTC()
	line, err := json.Marshal(e)
	if err != nil {
		return err
	}
	line = append(line, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errors.New("HA event log is closed")
	}
	if l.f == nil {
		if len(l.ring) == ringSize {
			copy(l.ring, l.ring[1:])
			l.ring = l.ring[:ringSize-1]
		}
		l.ring = append(l.ring, e)
	} else {
		// Other writers (libhapkcs11 in applications) append to the same
		// file: take its real size, not only what this process wrote.
		if fi, err := l.f.Stat(); err == nil {
			l.size = fi.Size()
		}
		if l.size > 0 && l.size+int64(len(line)) > l.maxBytes {
			if err := l.rotate(); err != nil {
				return err
			}
		}
		n, err := l.f.Write(line)
		l.size += int64(n)
		if err != nil {
			return fmt.Errorf("HA event log %s: %w", l.path, err)
		}
	}
	for f := range l.subs {
		select {
		case f.ch <- e:
		default: // a follower that cannot keep up is cut off, never waited for
			f.lagged = true
			close(f.ch)
			delete(l.subs, f)
		}
	}
	return nil
}

func (l *EventLog) rotate() error {
	if err := l.f.Close(); err != nil {
		return fmt.Errorf("HA event log %s: closing for rotation: %w", l.path, err)
	}
	l.f = nil
	if err := os.Rename(l.path, l.path+".1"); err != nil {
		return fmt.Errorf("HA event log %s: rotating: %w", l.path, err)
	}
	return l.openFile()
}

// Read calls emit for each stored event matching req, oldest first, then,
// with req.Follow, for each new one until ctx ends. Events appended while
// Read starts are seen exactly once.
func (l *EventLog) Read(ctx context.Context, req HALogRequest, emit func(Event) error) error {
	var cutoff time.Time
	if req.Since > 0 {
		cutoff = l.now().Add(-req.Since)
	}
	keep := func(e Event) bool {
		return (req.Group == "" || e.Group == req.Group) && !e.Time.Before(cutoff)
	}
	// Under the lock: snapshot what is stored and subscribe, so nothing
	// falls between the two.
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return errors.New("HA event log is closed")
	}
	var files []io.Reader
	var closers []io.Closer
	if l.f != nil {
		for _, p := range []string{l.path + ".1", l.path} {
			f, err := os.Open(p)
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				l.mu.Unlock()
				return fmt.Errorf("HA event log: %w", err)
			}
			closers = append(closers, f)
			r := io.Reader(f)
			if p == l.path {
				r = io.LimitReader(f, l.size)
			}
			files = append(files, r)
		}
	}
	ring := append([]Event(nil), l.ring...)
	var fo *follower
	if req.Follow {
		fo = &follower{ch: make(chan Event, 1024)}
		l.subs[fo] = struct{}{}
	}
	l.mu.Unlock()
	defer func() {
		for _, c := range closers {
			c.Close()
		}
		if fo != nil {
			l.mu.Lock()
			delete(l.subs, fo)
			l.mu.Unlock()
		}
	}()

	for _, r := range files {
		if err := readLines(r, keep, emit); err != nil {
			return err
		}
	}
	for _, e := range ring {
		if keep(e) {
			if err := emit(e); err != nil {
				return err
			}
		}
	}
	if fo == nil {
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-fo.ch:
			if !ok {
				if fo.lagged {
					return Errorf(CodeUnavailable, "halog follower fell more than %d events behind and was cut off", cap(fo.ch))
				}
				return nil // log closed: the agent is stopping
			}
			if keep(e) {
				if err := emit(e); err != nil {
					return err
				}
			}
		}
	}
}

// Close ends every follower and closes the file.
func (l *EventLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	for f := range l.subs {
		close(f.ch)
		delete(l.subs, f)
	}
	if l.f != nil {
		return l.f.Close()
	}
	return nil
}

// readLines emits the events of one log file that keep accepts.
func readLines(r io.Reader, keep func(Event) bool, emit func(Event) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			continue // a torn last line after a crash is not fatal
		}
		if keep(e) {
			if err := emit(e); err != nil {
				return err
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("HA event log: %w", err)
	}
	return nil
}

// ReadEventLogFile reads the event log at path (and its rotated
// predecessor path+".1") without an agent, oldest first. Follow is not
// supported without an agent and is an error.
func ReadEventLogFile(path string, req HALogRequest, emit func(Event) error) error {
	if req.Follow {
		return Errorf(CodeUnavailable, "following the HA event log needs a running haagent")
	}
	var cutoff time.Time
	if req.Since > 0 {
		cutoff = time.Now().Add(-req.Since)
	}
	keep := func(e Event) bool {
		return (req.Group == "" || e.Group == req.Group) && !e.Time.Before(cutoff)
	}
	found := false
	for _, p := range []string{path + ".1", path} {
		f, err := os.Open(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("HA event log: %w", err)
		}
		found = true
		err = readLines(f, keep, emit)
		f.Close()
		if err != nil {
			return err
		}
	}
	if !found {
		return fmt.Errorf("HA event log %s does not exist yet", path)
	}
	return nil
}
