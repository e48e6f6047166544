package agent

import (
	"bufio"
	"bytes"
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
	last   time.Time // the latest time written: lines never go back in time
}

const ringSize = 1000

// follower is one halog --follow. In memory-only mode it receives the
// events themselves; with a file it is only woken, and reads the file,
// which also carries the events other processes (libhapkcs11) append.
type follower struct {
	ch     chan Event    // memory-only mode
	wake   chan struct{} // file mode
	lagged bool
	// pending holds, in order, a handle on every generation rotated out
	// since the follower last looked (guarded by EventLog.mu), so a slow
	// follower loses nothing to rotation.
	pending []*os.File
}

// tailPoll is how often a follower looks for lines appended by other
// processes, which cannot wake it.
const tailPoll = 500 * time.Millisecond

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
	// 0660: applications (libhapkcs11) running in the agent's group append
	// their events to the same file. It holds no secrets.
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o660)
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

// Append writes e (stamping Time when zero) and hands it to followers.
// Times in the log never go back: an event stamped before the last one
// written (by a goroutine that was slower to get here) takes its time.
func (l *EventLog) Append(e Event) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errors.New("HA event log is closed")
	}
	if e.Time.IsZero() {
		e.Time = l.now()
	}
	e.Time = e.Time.UTC()
	if e.Time.Before(l.last) {
		e.Time = l.last
	}
	l.last = e.Time
	line, err := json.Marshal(e)
	if err != nil {
		return err
	}
	line = append(line, '\n')
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
		if f.wake != nil {
			select {
			case f.wake <- struct{}{}:
			default: // already woken
			}
			continue
		}
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
	for f := range l.subs {
		if f.wake != nil {
			if h, err := os.Open(l.path); err == nil {
				f.pending = append(f.pending, h)
			}
		}
	}
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
// with req.Follow, for each new one until ctx ends (or the log closes).
// With a file, following tails the file, so events appended by other
// processes are seen too; each line is emitted exactly once.
func (l *EventLog) Read(ctx context.Context, req HALogRequest, emit func(Event) error) error {
	keep := req.keeps(l.now())
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return errors.New("HA event log is closed")
	}
	if l.f == nil {
		ring := append([]Event(nil), l.ring...)
		var fo *follower
		if req.Follow {
			fo = &follower{ch: make(chan Event, 1024)}
			l.subs[fo] = struct{}{}
		}
		l.mu.Unlock()
		if fo != nil {
			defer l.unsubscribe(fo)
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
	// File mode: open both generations under the lock, so a rotation
	// cannot fall between them.
	old, oerr := os.Open(l.path + ".1")
	cur, cerr := os.Open(l.path)
	var fo *follower
	if req.Follow {
		fo = &follower{wake: make(chan struct{}, 1)}
		l.subs[fo] = struct{}{}
	}
	l.mu.Unlock()
	if fo != nil {
		defer l.unsubscribe(fo)
	}
	if cerr != nil {
		if oerr == nil {
			old.Close()
		}
		return fmt.Errorf("HA event log: %w", cerr)
	}
	if oerr == nil {
		err := readLines(old, keep, emit)
		old.Close()
		if err != nil {
			cur.Close()
			return err
		}
	}
	t := &tail{l: l, fo: fo, path: l.path, f: cur}
	defer func() { t.f.Close() }()
	if err := t.read(keep, emit); err != nil {
		return err
	}
	if fo == nil {
		return nil
	}
	poll := time.NewTicker(tailPoll)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case _, ok := <-fo.wake:
			if !ok {
				t.read(keep, emit)
				return nil // log closed: the agent is stopping
			}
		case <-poll.C:
		}
		if err := t.read(keep, emit); err != nil {
			return err
		}
	}
}

func (l *EventLog) unsubscribe(fo *follower) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.subs, fo)
	for _, h := range fo.pending {
		h.Close()
	}
	fo.pending = nil
}

// tail reads whole lines appended to a log file, following rotations.
type tail struct {
	l       *EventLog
	fo      *follower // nil when not following
	path    string
	f       *os.File
	partial []byte // an incomplete last line, kept until its newline comes
}

// read emits the complete lines appended since the last read: the rest of
// the current file, every generation rotated out meanwhile, in order, and
// the new current file.
func (t *tail) read(keep func(Event) bool, emit func(Event) error) error {
	if err := t.drain(keep, emit); err != nil {
		return err
	}
	if t.fo == nil {
		return nil
	}
	// Under the lock no rotation can fall between taking the rotated
	// generations and opening the current file.
	t.l.mu.Lock()
	pend := t.fo.pending
	t.fo.pending = nil
	var nf *os.File
	if fi, err := os.Stat(t.path); err == nil {
		if cfi, err := t.f.Stat(); err == nil && !os.SameFile(fi, cfi) {
			nf, _ = os.Open(t.path)
		}
	}
	t.l.mu.Unlock()
	for _, h := range pend {
		if sameFile(h, t.f) {
			h.Close()
			if err := t.drain(keep, emit); err != nil { // its last lines
				return err
			}
			continue
		}
		t.switchTo(h)
		if err := t.drain(keep, emit); err != nil {
			return err
		}
	}
	if nf != nil {
		if sameFile(nf, t.f) {
			nf.Close()
			return nil
		}
		t.switchTo(nf)
		return t.drain(keep, emit)
	}
	return nil
}

func (t *tail) switchTo(f *os.File) {
	t.f.Close()
	t.f, t.partial = f, nil
}

func sameFile(a, b *os.File) bool {
	fa, err1 := a.Stat()
	fb, err2 := b.Stat()
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}

func (t *tail) drain(keep func(Event) bool, emit func(Event) error) error {
	buf := make([]byte, 64<<10)
	for {
		n, err := t.f.Read(buf)
		if n > 0 {
			t.partial = append(t.partial, buf[:n]...)
			for {
				i := bytes.IndexByte(t.partial, '\n')
				if i < 0 {
					break
				}
				line := t.partial[:i]
				t.partial = t.partial[i+1:]
				var e Event
				if json.Unmarshal(line, &e) != nil {
					continue
				}
				if keep(e) {
					if err := emit(e); err != nil {
						return err
					}
				}
			}
			if len(t.partial) > 1<<20 {
				t.partial = nil // not a log line; drop it
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("HA event log: %w", err)
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
		if f.wake != nil {
			close(f.wake)
			for _, h := range f.pending {
				h.Close()
			}
			f.pending = nil
		} else {
			close(f.ch)
		}
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
	keep := req.keeps(time.Now())
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
