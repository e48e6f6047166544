package main

import (
	"context"
	"fmt"
	"io"

	"github.com/hagroup/hagroup/pkg/agent/report"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync"
)

// holdLine is one kind of key a member could not hold in a group of two or
// more: the group makes no such key while the member serves with another,
// and does not offer the mechanisms that generate it.
type holdLine struct {
	Member string `json:"member"`
	Kind   string `json:"kind"`
	Reason string `json:"reason"`
}

// cannotHold probes what the open slot s of member name can wrap and
// unwrap, and lists the kinds of key it could not hold.
func cannotHold(ctx context.Context, name string, s *slot.Slot) ([]holdLine, error) {
	mechs, err := s.Mechanisms(ctx)
	if err != nil {
		return nil, report.NameMember(name, fmt.Errorf("read mechanisms: %w", err))
	}
	c, err := sync.ProbeWrap(ctx, s, mechs)
	if err != nil {
		return nil, report.NameMember(name, err)
	}
	var out []holdLine
	for _, k := range c.Unholdable() {
		out = append(out, holdLine{Member: name, Kind: k.String(), Reason: c.Holds(k).Error()})
	}
	return out, nil
}

// memberCannotHold opens member m's token (with the group's settings)
// and lists what it could not hold.
func memberCannotHold(ctx context.Context, a *app, m config.Member, set config.Settings) ([]holdLine, error) {
	pin, err := m.ReadPIN()
	if err != nil {
		return nil, report.NameMember(m.Name, err)
	}
	defer pin.Zero()
	s, err := a.openSlot(ctx, report.MemberSpec(m, set, pin))
	if err != nil {
		return nil, report.NameMember(m.Name, err)
	}
	defer s.Close()
	return cannotHold(ctx, m.Name, s)
}

// printCannotHold warns of each kind of key a member could not hold.
func printCannotHold(w io.Writer, lines []holdLine) {
	for _, l := range lines {
		fmt.Fprintf(w, "hactl: warning: member %q cannot hold %ss made through the group: %s\n", l.Member, l.Kind, l.Reason)
	}
	if len(lines) > 0 {
		fmt.Fprintln(w, "hactl: while such a member serves with another, the group makes no such key (the creation fails, an HA event names the member) and does not offer the mechanisms that generate it")
	}
}
