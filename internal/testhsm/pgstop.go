package testhsm

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// waitGroupStopped waits until every thread of every process in process
// group pgid is stopped ('T' in /proc) or gone, or the deadline passes. Waiting
// for the leader alone (waitid WSTOPPED) is not enough: the server serves
// each connection in a child of its own, and a SIGSTOP to the group stops
// that child only once one of its threads runs to take the signal — on a
// loaded machine, after another of its threads may have answered a call
// sent after Stop returned.
func waitGroupStopped(pgid int, deadline time.Duration) error {
	end := time.Now().Add(deadline)
	for {
		running, err := groupRunning(pgid)
		if err == nil && running == "" {
			return nil
		}
		if time.Now().After(end) {
			if err == nil {
				err = fmt.Errorf("%s still runs", running)
			}
			return fmt.Errorf("process group %d not stopped within %v: %w", pgid, deadline, err)
		}
		time.Sleep(time.Millisecond) // polling /proc, bounded by the deadline
	}
}

// groupRunning names a thread of process group pgid that is not stopped,
// "" when there is none.
func groupRunning(pgid int) (string, error) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return "", err
	}
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		if _, pg, ok := procStat(filepath.Join("/proc", p.Name(), "stat")); !ok || pg != pgid {
			continue
		}
		tasks, err := os.ReadDir(filepath.Join("/proc", p.Name(), "task"))
		if err != nil {
			continue // exited meanwhile
		}
		for _, tk := range tasks {
			st, _, ok := procStat(filepath.Join("/proc", p.Name(), "task", tk.Name(), "stat"))
			// Z, X: a child that has exited (its stopped parent has not
			// reaped it yet) serves nothing.
			if ok && st != "T" && st != "Z" && st != "X" {
				return fmt.Sprintf("thread %s of process %s (state %s)", tk.Name(), p.Name(), st), nil
			}
		}
	}
	return "", nil
}

// procStat reads the state and the process group of a /proc stat file
// ("pid (comm) state ppid pgrp ..."; comm may hold spaces and parentheses).
func procStat(path string) (state string, pgrp int, ok bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", 0, false
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return "", 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 3 {
		return "", 0, false
	}
	pgrp, err = strconv.Atoi(f[2])
	return f[0], pgrp, err == nil
}
