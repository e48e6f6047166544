package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"
)

// eventLog is where the module reports: HA events go to the HA event log
// named by the configuration's log_file, as JSON lines in the agent's
// format, when this process may append to it; otherwise, and for debug
// detail, to stderr only when HAGROUP_DEBUG is set. An application's
// stderr is never written otherwise. No PIN is ever passed to it.
type eventLog struct {
	pid int

	mu sync.Mutex
	f  *os.File // the HA event log, or nil

	dbg *slog.Logger // nil unless HAGROUP_DEBUG is set
}

// debugEnv is the variable that turns stderr logging on.
const debugEnv = "HAGROUP_DEBUG"

// haEvent is one line of the HA event log (the same fields as the agent's
// events, plus where it came from).
type haEvent struct {
	Time   time.Time `json:"time"`
	Group  string    `json:"group"`
	Member string    `json:"member,omitempty"`
	Event  string    `json:"event"`
	Detail string    `json:"detail,omitempty"`
	Source string    `json:"source"`
}

// newEventLog opens the HA event log at path ("" for none) for appending;
// a file this process may not write is skipped silently (stderr, when
// debugging, says so).
func newEventLog(path string) *eventLog {
	l := &eventLog{pid: os.Getpid()}
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
	return l
}

func newDebugLogger(w io.Writer, pid int) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})).
		With("lib", "libhapkcs11", "pid", pid)
}

// event records an HA event.
func (l *eventLog) event(group, member, name, detail string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	f := l.f
	if f != nil {
		line, err := json.Marshal(haEvent{Time: time.Now().UTC(), Group: group, Member: member,
			Event: name, Detail: detail, Source: fmt.Sprintf("libhapkcs11 pid %d", l.pid)})
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

func (l *eventLog) close() {
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
		l.log.event("", "", "client-panic", detail)
		l.log.debug("panic", "call", call, "panic", fmt.Sprint(r), "stack", string(stack))
		return
	}
	if os.Getenv(debugEnv) != "" {
		newDebugLogger(os.Stderr, os.Getpid()).Error("panic", "call", call, "panic", fmt.Sprint(r), "stack", string(stack))
	}
}
