package main

import (
	"context"
	"strings"

	"github.com/hagroup/hagroup/pkg/ha"
)

// watchConfig makes the groups behind the virtual slots follow their
// configuration file without a restart of the application: a member added,
// removed, or moved to or from standby with hactl (or by hand) on this host
// is applied within ha.DefaultFollowEvery, by ha.Group.Update, the very
// code haagent runs on SIGHUP. The file is watched by a stat a second on
// the library's own goroutine rather than by inotify (one descriptor per
// application, lost on an editor's rename) or by the agent's word (the
// library must follow with no agent running). The slot list stays as
// C_Initialize made it: a member's own slot and a group added to the file
// appear at the next C_Initialize, since applications keep slot lists.
// The returned func stops the watch and waits for it.
func watchConfig(ctx context.Context, path string, virt []token, log *eventLog) func() {
	var groups []*ha.Group
	for _, t := range virt {
		if v, ok := t.(*virtual); ok && v.h != nil {
			groups = append(groups, v.h)
		}
	}
	return ha.FollowConfig(ctx, path, groups, ha.FollowOptions{
		Applied: func(group string, lines []string, err error) {
			if err != nil {
				log.event(group, "", "reload_refused", err.Error())
				return
			}
			// One line for the change, in this process's name: each line
			// reads "member: event (detail)" (ha.Group.Update).
			log.event(group, "", "config_followed", strings.Join(lines, "; "))
		},
	})
}
