package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/fleet"
)

// eventLog is where the module reports: HA events go to haagent through
// the fleet reporter (the agent writes the HA log, in order, folded), which
// also carries the members' figures. Without an agent the reporter hands
// them back, folded, and they are appended to the configuration's
// log_file when this process may write it; otherwise, and for debug
// detail, to stderr only when HAGROUP_DEBUG is set. An application's
// stderr is never written otherwise. No PIN is ever passed to it.
type eventLog struct {
	pid  int
	prog string
	host string
	rep  *fleet.Reporter // nil before the configuration is read

	mu sync.Mutex
	f  *os.File // the HA event log, or nil

	dbg *slog.Logger // nil unless HAGROUP_DEBUG is set
}

// debugEnv is the variable that turns stderr logging on.
const debugEnv = "HAGROUP_DEBUG"

// haEvent is one line of the HA event log written without an agent (the
// same fields as the agent's events).
type haEvent struct {
	Time    time.Time `json:"time"`
	Group   string    `json:"group"`
	Member  string    `json:"member,omitempty"`
	Event   string    `json:"event"`
	Detail  string    `json:"detail,omitempty"`
	Program string    `json:"program"`
	PID     int       `json:"pid"`
	UID     int       `json:"uid"`
	Host    string    `json:"host"`
}

// newEventLog reports to the agent at socket ("" for none) and falls back
// to the HA event log at path ("" for none), opened for appending; a file
// this process may not write is skipped silently (stderr, when debugging,
// says so).
func newEventLog(path, socket string) *eventLog {
	l := &eventLog{pid: os.Getpid(), prog: programName()}
	l.host, _ = os.Hostname()
	if os.Getenv(debugEnv) != "" {
		l.dbg = newDebugLogger(os.Stderr, l.pid)
	}
	if path != "" {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			l.debug("HA event log not writable; events go to stderr with "+debugEnv, "path", path, "err", err)
		} else {
			l.f = f
		}
	}
	if socket != "" || l.f != nil || l.dbg != nil {
		l.rep = fleet.Start(fleet.Options{Socket: socket, Program: l.prog, Fallback: l.write})
	}
	return l
}

func newDebugLogger(w io.Writer, pid int) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})).
		With("lib", "libhapkcs11", "pid", pid)
}

// event records an HA event of the module itself (the engine's go
// through the reporter from pkg/ha).
func (l *eventLog) event(group, member, name, detail string) {
	if l == nil {
		return
	}
	e := agent.FleetEvent{Time: time.Now(), Group: group, Member: member, Event: name, Detail: detail}
	if l.rep != nil {
		l.rep.Event(e)
		return
	}
	l.write(e)
}

// write appends e to the HA event log (the reporter's fallback: called
// from its goroutine, already folded), or to stderr when debugging.
func (l *eventLog) write(e agent.FleetEvent) {
	group, member, name, detail := e.Group, e.Member, e.Event, e.Detail
	l.mu.Lock()
	f := l.f
	if f != nil {
		line, err := json.Marshal(haEvent{Time: e.Time.UTC(), Group: group, Member: member,
			Event: name, Detail: detail, Program: l.prog, PID: l.pid, UID: os.Getuid(), Host: l.host})
		if err == nil {
			_, err = f.Write(append(line, '\n')) // one write: O_APPEND keeps lines whole
		}
		if err != nil {
			f = nil
		}
	}
	l.mu.Unlock()
	if f == nil && l.dbg != nil {
		l.dbg.Info(name, "group", group, "member", member, "detail", detail)
	}
}

// debugging reports whether debug detail goes anywhere.
func (l *eventLog) debugging() bool { return l != nil && l.dbg != nil }

// debug writes detail to stderr when HAGROUP_DEBUG is set.
func (l *eventLog) debug(msg string, kv ...any) {
	if l.debugging() {
		l.dbg.Debug(msg, kv...)
	}
}

// close sends the last report (bounded: pkg/fleet) and closes the file.
func (l *eventLog) close() {
	l.rep.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		_ = l.f.Close() // appends are unbuffered; nothing is lost
		l.f = nil
	}
}

// logPanic records a panic recovered at the C boundary.
func logPanic(call string, r any, stack []byte) {
	module.RLock()
	l := module.lib
	module.RUnlock()
	detail := fmt.Sprintf("%s: panic: %v", call, r)
	if l != nil {
		l.log.event("", "", "panic", detail)
		l.log.debug("panic", "call", call, "panic", fmt.Sprint(r), "stack", string(stack))
		return
	}
	if os.Getenv(debugEnv) != "" {
		newDebugLogger(os.Stderr, os.Getpid()).Error("panic", "call", call, "panic", fmt.Sprint(r), "stack", string(stack))
	}
}
