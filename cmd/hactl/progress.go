package main

import (
	"os"

	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progressBar draws the progress of a synchronisation or recovery on
// stderr: objects done of the plan's total and the member they go to.
// Only on a terminal and without --json: a script or a log gets none.
type progressBar struct {
	bar    *progressbar.ProgressBar
	total  int
	member string
}

// progress returns the progress callback for a command and the func that
// ends the bar; the callback is nil when no bar is to be drawn (quiet, the
// output is for programs, or stderr is no terminal).
func (a *app) progress(quiet bool) (func(agent.Progress), func()) {
	if quiet || a.jsonOut() || !a.stderrIsTerminal() {
		return nil, func() {}
	}
	pb := &progressBar{}
	return pb.update(a), pb.finish
}

// stderrIsTerminal reports whether stderr is a terminal.
func (a *app) stderrIsTerminal() bool {
	f, ok := a.errOut.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func (pb *progressBar) update(a *app) func(agent.Progress) {
	return func(p agent.Progress) {
		if pb.bar == nil || p.Total != pb.total {
			// A new plan (a recovery's next catch-up pass): a new bar.
			pb.finish()
			pb.total, pb.member = p.Total, ""
			pb.bar = progressbar.NewOptions(p.Total,
				progressbar.OptionSetWriter(a.errOut),
				progressbar.OptionShowCount(),
				progressbar.OptionSetWidth(30),
				progressbar.OptionClearOnFinish(),
				progressbar.OptionThrottle(0))
		}
		if p.Member != pb.member {
			pb.member = p.Member
			pb.bar.Describe(p.Member)
		}
		pb.bar.Set(p.Done)
	}
}

func (pb *progressBar) finish() {
	if pb.bar != nil {
		pb.bar.Finish()
		pb.bar = nil
	}
}
