package config

import (
	"errors"
	"strconv"
	"strings"
)

// ErrNoConfig is returned (wrapped) by Load when the configuration file
// does not exist. It is distinct from an invalid file, which Load reports
// with one or more *FieldError.
var ErrNoConfig = errors.New("no configuration file")

// FieldError is one problem in a configuration: a syntax error, an unknown
// key, a value of the wrong type, or a failed validation rule. Load, Parse
// and Validate return them joined with errors.Join; use errors.As to pick
// one out.
//
// Its message has the form
//
//	hagroup.toml:14: group "signing": member "hsm-a": token_label: ...
//
// leaving out the parts that do not apply.
type FieldError struct {
	// File is the configuration file, empty for a configuration built in
	// memory.
	File string
	// Line and Col are 1-based; zero when unknown.
	Line, Col int
	// Group is the label of the group at fault, Member the name of the
	// member; empty when the problem is elsewhere or the name is missing.
	Group, Member string
	// GroupIndex and MemberIndex are the 0-based positions of the group and
	// member at fault, or -1.
	GroupIndex, MemberIndex int
	// Key is the TOML key at fault: relative to its table within a group
	// or member ("token_label"), dotted from the top elsewhere
	// ("ha.interval", "agent.socket").
	Key string
	// Msg says what is wrong.
	Msg string
}

func (e *FieldError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			b.WriteString(":" + strconv.Itoa(e.Line))
			if e.Col > 0 {
				b.WriteString(":" + strconv.Itoa(e.Col))
			}
		}
		b.WriteString(": ")
	} else if e.Line > 0 {
		b.WriteString("line " + strconv.Itoa(e.Line) + ": ")
	}
	switch {
	case e.Group != "":
		b.WriteString("group " + strconv.Quote(e.Group) + ": ")
	case e.GroupIndex >= 0:
		b.WriteString("group #" + strconv.Itoa(e.GroupIndex+1) + ": ")
	}
	switch {
	case e.Member != "":
		b.WriteString("member " + strconv.Quote(e.Member) + ": ")
	case e.MemberIndex >= 0:
		b.WriteString("member #" + strconv.Itoa(e.MemberIndex+1) + ": ")
	}
	if e.Key != "" {
		b.WriteString(e.Key + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// problems collects the *FieldError values of one configuration.
type problems struct {
	c    *Config
	errs []error
}

// at adds a problem with the field key of group gi / member mi (-1 for
// none). The line is that of the key when the file sets it, else that of
// the table it belongs in.
func (p *problems) at(gi, mi int, key, msg string) {
	table := ""
	switch {
	case mi >= 0:
		table = memberPath(gi, mi)
	case gi >= 0:
		table = groupPath(gi)
	default:
		// A key of [ha] or [agent], written with its table.
		table, _, _ = strings.Cut(key, ".")
	}
	path := key
	if gi >= 0 {
		path = table + "." + key
	}
	e := p.newAt(gi, mi, key, path, msg)
	if e.Line == 0 && table != "" {
		e.Line = p.c.src.line(table)
	}
	p.errs = append(p.errs, e)
}

func (p *problems) err() error { return errors.Join(p.errs...) }
