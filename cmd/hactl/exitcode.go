package main

import (
	"errors"
	"io/fs"

	"github.com/hagroup/hagroup/pkg/agent"
)

// Exit codes of hactl. They are part of its interface (scripts and cron
// jobs test them): never renumbered, only added.
const (
	// ExitOK: the command did what was asked.
	ExitOK = 0
	// ExitError: the command failed (bad config, token not found, …).
	ExitError = 1
	// ExitUsage: the command line is wrong (unknown flag, missing or
	// conflicting flags, bad argument count, a prompt needed but no
	// terminal and no --yes).
	ExitUsage = 2
	// ExitProblem: a check ran and found a problem: a degraded group, a
	// member down, a group out of sync.
	ExitProblem = 3
	// ExitUnreachable: the command needs haagent and none answers.
	ExitUnreachable = 4
	// ExitPermission: permission denied by haagent (SO_PEERCRED) or by the
	// file system (the config file, the socket).
	ExitPermission = 5
	// ExitFailed: the command ran but some of its actions failed (a copy
	// of synchronize); the report names each.
	ExitFailed = 6
	// ExitDeclined: the operator answered no to a confirmation; nothing
	// changed.
	ExitDeclined = 7
	// ExitInterrupted: interrupted (Ctrl-C, SIGINT, SIGTERM), by the
	// shells' convention 128+SIGINT.
	ExitInterrupted = 130
)

// exitCodes lists every code with its name, for the uniqueness test and
// the man page.
var exitCodes = []struct {
	Code int
	Name string
}{
	{ExitOK, "ok"},
	{ExitError, "error"},
	{ExitUsage, "usage"},
	{ExitProblem, "check found a problem"},
	{ExitUnreachable, "agent unreachable"},
	{ExitPermission, "permission denied"},
	{ExitFailed, "an action failed"},
	{ExitDeclined, "confirmation declined"},
	{ExitInterrupted, "interrupted"},
}

// usageError is a command-line mistake found by a command itself.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// problemError is a check that ran and found something wrong; the command
// has already printed its report. When shown, the summary msg is part of
// that report (on stdout), and main does not print it again.
type problemError struct {
	msg   string
	shown bool
}

func (e *problemError) Error() string { return e.msg }

// failedError is work done in part: some of its actions failed, and the
// report (already printed, with its summary when shown) names them.
type failedError struct {
	msg   string
	shown bool
}

func (e *failedError) Error() string { return e.msg }

// reportedError is a failure (exit 1) the command has already reported:
// when shown, its summary msg is on stdout already.
type reportedError struct {
	msg   string
	shown bool
}

func (e *reportedError) Error() string { return e.msg }

// errDeclined is the operator's no to a confirmation.
var errDeclined = errors.New("not confirmed; nothing changed")

// errInterrupted is a signal (or Ctrl-C at a prompt) that ended the
// command.
var errInterrupted = errors.New("interrupted")

// shownSummary reports whether err's message is a summary the command
// already printed in its report.
func shownSummary(err error) bool {
	var p *problemError
	var f *failedError
	var r *reportedError
	return (errors.As(err, &p) && p.shown) || (errors.As(err, &f) && f.shown) || (errors.As(err, &r) && r.shown)
}

// runError marks an error returned from a command's RunE, so that errors
// from cobra's own flag and argument parsing (exit 2) are told apart from
// errors of the work (mapped by type).
type runError struct{ err error }

func (e *runError) Error() string { return e.err.Error() }
func (e *runError) Unwrap() error { return e.err }

// exitCodeOf maps an error to an exit code by its type.
func exitCodeOf(err error) int {
	var u *usageError
	var p *problemError
	var f *failedError
	var r *runError
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, errInterrupted):
		return ExitInterrupted
	case errors.As(err, &u):
		return ExitUsage
	case !errors.As(err, &r):
		// Not from a RunE: cobra rejected the command line.
		return ExitUsage
	case errors.As(err, &p):
		return ExitProblem
	case errors.As(err, &f):
		return ExitFailed
	case errors.Is(err, errDeclined):
		return ExitDeclined
	case agent.IsUnreachable(err):
		return ExitUnreachable
	case errors.Is(err, agent.ErrPermissionDenied), errors.Is(err, fs.ErrPermission):
		return ExitPermission
	default:
		return ExitError
	}
}
