package config

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// Load reads, strictly decodes and validates the configuration file at
// path. A file that does not exist gives an error wrapping both ErrNoConfig
// and fs.ErrNotExist; an invalid file gives *FieldError values joined, each
// with the file and, where known, the line.
func Load(path string) (*Config, error) {
	if path == "" {
		return nil, errors.New("config: no configuration path given")
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %w", ErrNoConfig, err)
	}
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(data, path)
}

// Parse strictly decodes and validates a configuration; name is the file it
// came from, used in messages and kept as Config.Path. Unknown keys (the
// match is case-sensitive), values of the wrong type and durations written
// as "0s" are errors, reported together with the failures of Validate.
func Parse(data []byte, name string) (*Config, error) {
	c, strict, err := decode(data, name)
	if err != nil {
		return nil, err
	}
	if err := errors.Join(append(flatten(strict), flatten(c.Validate())...)...); err != nil {
		return nil, err
	}
	return c, nil
}

// flatten returns the errors joined in err, so that joining two joins
// gives one flat list.
func flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	if err != nil {
		return []error{err}
	}
	return nil
}

// decode decodes data without validating it. err is non-nil when data is
// not TOML or does not fit the schema's types; strict holds the unknown
// keys and zero durations, which Validate cannot see.
func decode(data []byte, name string) (c *Config, strict, err error) {
	// Decoding into plain maps first separates syntax errors (no key of
	// ours to blame) from values that do not fit the schema.
	var raw map[string]any
	if _, err := toml.Decode(string(data), &raw); err != nil {
		return nil, nil, decodeError(name, err, true)
	}
	src := scanSource(data)
	c = &Config{Path: name}
	if _, err := toml.Decode(string(data), c); err != nil {
		return nil, nil, typeError(decodeError(name, err, false), src, raw)
	}
	c.src = src
	c.normalise()
	p := &problems{c: c}
	checkKeys(p, raw)
	return c, p.err(), nil
}

// normalise makes empty collections nil, so that a configuration encodes
// and decodes back to the same value.
func (c *Config) normalise() {
	if len(c.Agent.AllowedUIDs) == 0 {
		c.Agent.AllowedUIDs = nil
	}
	if len(c.Groups) == 0 {
		c.Groups = nil
	}
	for gi := range c.Groups {
		g := &c.Groups[gi]
		if len(g.Members) == 0 {
			g.Members = nil
		}
		for mi := range g.Members {
			if len(g.Members[mi].ModuleEnv) == 0 {
				g.Members[mi].ModuleEnv = nil
			}
		}
	}
}

// typeErrRE matches the errors BurntSushi/toml returns for a value that
// does not fit its Go type.
var typeErrRE = regexp.MustCompile(`^toml: (?:line (\d+) )?\(last key "([^"]*)"\): (.*)$`)

// decodeError turns an error from toml.Decode into a *FieldError. A syntax
// error names no key: the parser's "last key" is only the one before.
func decodeError(name string, err error, syntax bool) error {
	e := &FieldError{File: name, GroupIndex: -1, MemberIndex: -1}
	var pe toml.ParseError
	if errors.As(err, &pe) {
		e.Line, e.Col = pe.Position.Line, pe.Position.Col
		e.Msg = pe.Message
		if syntax {
			e.Msg = "syntax error: " + e.Msg
		} else {
			e.Key = pe.LastKey
		}
		return e
	}
	if m := typeErrRE.FindStringSubmatch(err.Error()); m != nil {
		e.Line, _ = strconv.Atoi(m[1])
		e.Key, e.Msg = m[2], m[3]
		return e
	}
	e.Msg = strings.TrimPrefix(err.Error(), "toml: ")
	return e
}

// typeError places a value that does not fit the schema in its group and
// member, found from its line, so that it reads like the other problems.
func typeError(err error, src *source, raw map[string]any) error {
	e, ok := err.(*FieldError)
	if !ok || e.Line == 0 {
		return err
	}
	table, key, _ := strings.Cut(e.Key, ".")
	if table != "group" {
		return e
	}
	// The group and member tables that start last at or before the line.
	gi, mi, best := -1, -1, 0
	for p, n := range src.lines {
		if n > e.Line || n < best {
			continue
		}
		var g, m int
		if _, err := fmt.Sscanf(p, "group[%d].member[%d]", &g, &m); err == nil && p == memberPath(g, m) {
			gi, mi, best = g, m, n
		} else if _, err := fmt.Sscanf(p, "group[%d]", &g); err == nil && p == groupPath(g) && n > best {
			gi, mi, best = g, -1, n
		}
	}
	if gi < 0 {
		return e
	}
	gs := tables(raw["group"])
	if gi >= len(gs) {
		return e
	}
	e.GroupIndex, e.Group = gi, str(gs[gi]["label"])
	if rest, ok := strings.CutPrefix(key, "member."); ok && mi >= 0 {
		ms := tables(gs[gi]["member"])
		if mi >= len(ms) {
			return e
		}
		e.MemberIndex, e.Member, e.Key = mi, str(ms[mi]["name"]), rest
	} else if !strings.HasPrefix(key, "member.") {
		e.Key = key
	}
	return e
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

// knownKeys returns the key names of a table ("", "agent", "library",
// "ha", "group", "group.member"), as written in the file: the toml tags of
// its struct, an embedded struct's inline, in field order.
func knownKeys(table string) []string {
	var keys []string
	var walk func(reflect.Type)
	walk = func(t reflect.Type) {
		for f := range t.Fields() {
			if tag := f.Tag.Get("toml"); f.Anonymous {
				walk(f.Type)
			} else if tag != "" && tag != "-" {
				keys = append(keys, tag)
			}
		}
	}
	if t, ok := tableTypes[table]; ok {
		walk(t)
	}
	return keys
}

// tableTypes are the structs of the tables, by the names knownKeys takes.
var tableTypes = map[string]reflect.Type{
	"": reflect.TypeFor[Config](), "agent": reflect.TypeFor[Agent](), "library": reflect.TypeFor[Library](),
	"ha": reflect.TypeFor[HA](), "group": reflect.TypeFor[Group](), "group.member": reflect.TypeFor[Member](),
}

// checkKeys reports keys the schema does not know and durations written as
// zero. It walks the document decoded into plain maps: BurntSushi/toml
// matches field names case-insensitively, and its metadata does not say
// which element of an array of tables a key belongs to.
func checkKeys(p *problems, raw map[string]any) {
	p.checkTable(raw, "", -1, -1)
	if m, ok := raw["agent"].(map[string]any); ok {
		p.checkTable(m, "agent", -1, -1)
	}
	if m, ok := raw["library"].(map[string]any); ok {
		p.checkTable(m, "library", -1, -1)
	}
	if m, ok := raw["ha"].(map[string]any); ok {
		p.checkTable(m, "ha", -1, -1)
	}
	for gi, g := range tables(raw["group"]) {
		p.checkTable(g, "group", gi, -1)
		for mi, m := range tables(g["member"]) {
			p.checkTable(m, "group.member", gi, mi)
		}
	}
	// Report in file order.
	slices.SortStableFunc(p.errs, func(a, b error) int {
		return cmp.Compare(a.(*FieldError).Line, b.(*FieldError).Line)
	})
}

// tables returns the tables of an array of tables, written either way.
func tables(v any) []map[string]any {
	switch v := v.(type) {
	case []map[string]any:
		return v
	case []any:
		var ts []map[string]any
		for _, e := range v {
			if t, ok := e.(map[string]any); ok {
				ts = append(ts, t)
			}
		}
		return ts
	}
	return nil
}

// checkTable checks the keys of one table: table names it in the schema
// ("", "agent", "ha", "group", "group.member"), gi and mi locate it.
func (p *problems) checkTable(t map[string]any, table string, gi, mi int) {
	known := knownKeys(table)
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(t)) {
		path, key := k, k
		switch {
		case mi >= 0:
			path = memberPath(gi, mi) + "." + k
		case gi >= 0:
			path = groupPath(gi) + "." + k
		case table != "":
			path = table + "." + k
			key = path
		}
		if !slices.Contains(known, k) {
			msg := "unknown key"
			if s := suggest(k, known); s != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", s)
			}
			errs = append(errs, p.newAt(gi, mi, key, path, msg))
			continue
		}
		if _, isDur := (HA{}).durationKey(k); isDur && (table == "ha" || table == "group") {
			// Zero Duration means unset: zero written in the file would
			// silently become the default.
			if s, ok := t[k].(string); ok {
				if d, err := time.ParseDuration(s); err == nil && d == 0 {
					msg := fmt.Sprintf("zero is not allowed: omit the key for the default (%s)", defaultDuration(k))
					errs = append(errs, p.newAt(gi, mi, key, path, msg))
				}
			}
		}
	}
	p.errs = append(p.errs, errs...)
}

// newAt returns a problem located by the indexed path of the key.
func (p *problems) newAt(gi, mi int, key, path, msg string) *FieldError {
	e := &FieldError{File: p.c.Path, GroupIndex: gi, MemberIndex: mi, Key: key, Msg: msg}
	if gi >= 0 && gi < len(p.c.Groups) {
		e.Group = p.c.Groups[gi].Label
		if mi >= 0 && mi < len(p.c.Groups[gi].Members) {
			e.Member = p.c.Groups[gi].Members[mi].Name
		}
	}
	e.Line = p.c.src.line(path)
	return e
}

// durationKey returns h's Duration keyed k, and whether k keys one.
func (h HA) durationKey(k string) (Duration, bool) {
	for f := range reflect.TypeFor[HA]().Fields() {
		if f.Tag.Get("toml") == k {
			d, ok := reflect.ValueOf(h).FieldByIndex(f.Index).Interface().(Duration)
			return d, ok
		}
	}
	return 0, false
}

// defaultDuration returns the built-in default of a duration key.
func defaultDuration(k string) Duration {
	s := Defaults()
	h := HA{Interval: Duration(s.Interval), CommandTimeout: Duration(s.CommandTimeout),
		KeygenTimeout: Duration(s.KeygenTimeout), ProbeInterval: Duration(s.ProbeInterval),
		TombstoneHorizon: Duration(s.TombstoneHorizon)}
	d, _ := h.durationKey(k)
	return d
}

// suggest returns the known key closest to k when it is close enough to be
// a likely typo, or "".
func suggest(k string, known []string) string {
	best, bestD := "", 3
	norm := func(s string) string { return strings.ToLower(strings.NewReplacer("_", "", "-", "").Replace(s)) }
	for _, n := range known {
		if norm(n) == norm(k) {
			return n
		}
		if d := editDistance(k, n); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
