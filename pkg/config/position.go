package config

import (
	"strconv"
	"strings"
)

// source locates keys and tables in a parsed file. BurntSushi/toml keeps
// key positions to itself, so after a successful parse the file is scanned
// once more, cheaply, for the line of every table header and key.
type source struct {
	// lines maps an indexed key path, such as "group[1].member[0].uri" or
	// "ha.interval", to the 1-based line where it is defined.
	lines map[string]int
	// notes are the file's comments, so that an edit can keep them.
	notes notes
}

// notes are a file's comments by the path of the table header or key they
// belong to: the comment lines above it, and a comment after it on its
// line. Paths are indexed ("group[1].member[0].uri") as the scanner finds
// them, or by identity ("group=signing.member=hsm-b.uri") once byIdentity
// has translated them.
type notes struct {
	before   map[string][]string
	trailing map[string]string
	tail     []string // comments after the last key
}

// line returns the line of path, or 0 when it is unknown. A table made
// only by dotted keys (a.b = 1 makes a) has no line of its own; it gets the
// first line of a key inside it. A key that is not in the file, or that
// the scanner could not place (inside an inline table), gets the line of
// the nearest enclosing table it knows.
func (s *source) line(path string) int {
	if s == nil {
		return 0
	}
	for path != "" {
		if n, ok := s.lines[path]; ok {
			return n
		}
		first := 0
		for p, n := range s.lines {
			if strings.HasPrefix(p, path+".") && (first == 0 || n < first) {
				first = n
			}
		}
		if first > 0 {
			return first
		}
		path = path[:max(0, strings.LastIndexAny(path, ".["))]
	}
	return 0
}

// groupPath and friends build the indexed paths used as keys of source.
func groupPath(gi int) string { return "group[" + strconv.Itoa(gi) + "]" }

func memberPath(gi, mi int) string {
	return groupPath(gi) + ".member[" + strconv.Itoa(mi) + "]"
}

// scanSource returns the position of every table header and key in data,
// which must already have parsed as TOML. It understands just enough TOML
// to skip values (strings of the four kinds, arrays, inline tables) and to
// index arrays of tables. Anything it cannot follow ends the scan early:
// positions are a help in messages, never needed for correctness.
func scanSource(data []byte) *source {
	sc := scanner{data: data, line: 1, lines: map[string]int{}, arrays: map[string]int{},
		notes: notes{before: map[string][]string{}, trailing: map[string]string{}}}
	sc.run()
	sc.notes.tail = sc.pending
	return &source{lines: sc.lines, notes: sc.notes}
}

type scanner struct {
	data   []byte
	i      int
	line   int
	table  string         // indexed path of the current table
	lines  map[string]int // indexed path -> line
	arrays map[string]int // indexed path of an array of tables -> elements so far

	notes       notes
	pending     []string // comment lines not yet followed by a header or key
	pendingLine int      // line of the last of them
	last        string   // path of the last header or key recorded
	lastLine    int      // its line
}

// comment takes the comment starting at sc.i (a '#') up to the end of its
// line: a trailing comment of the header or key on the same line, else a
// line for the next header or key (a gap of blank lines is kept as one).
func (sc *scanner) comment() {
	start := sc.i
	for !sc.eof() && sc.data[sc.i] != '\n' {
		sc.i++
	}
	text := strings.TrimRight(string(sc.data[start:sc.i]), " \t\r")
	if sc.last != "" && sc.line == sc.lastLine {
		sc.notes.trailing[sc.last] = text
		return
	}
	if len(sc.pending) > 0 && sc.line > sc.pendingLine+1 {
		sc.pending = append(sc.pending, "")
	}
	sc.pending = append(sc.pending, text)
	sc.pendingLine = sc.line
}

func (sc *scanner) eof() bool { return sc.i >= len(sc.data) }

func (sc *scanner) peek(off int) byte {
	if sc.i+off < len(sc.data) {
		return sc.data[sc.i+off]
	}
	return 0
}

// skipSpace skips blanks, and newlines and comments too when nl is set.
func (sc *scanner) skipSpace(nl bool) {
	for !sc.eof() {
		switch c := sc.data[sc.i]; {
		case c == ' ' || c == '\t':
			sc.i++
		case c == '\r' && nl:
			sc.i++
		case c == '\n' && nl:
			sc.i++
			sc.line++
		case c == '#' && nl:
			sc.comment()
		default:
			return
		}
	}
}

func (sc *scanner) record(path string, line int) {
	if _, ok := sc.lines[path]; !ok {
		sc.lines[path] = line
		if len(sc.pending) > 0 {
			sc.notes.before[path] = sc.pending
			sc.pending = nil
		}
	}
	sc.last, sc.lastLine = path, line
}

func (sc *scanner) run() {
	for {
		sc.skipSpace(true)
		if sc.eof() {
			return
		}
		line := sc.line
		if sc.data[sc.i] == '[' {
			array := sc.peek(1) == '['
			if array {
				sc.i += 2
			} else {
				sc.i++
			}
			parts, ok := sc.key()
			if !ok {
				return
			}
			sc.skipSpace(false)
			if array {
				if sc.peek(0) != ']' || sc.peek(1) != ']' {
					return
				}
				sc.i += 2
			} else {
				if sc.peek(0) != ']' {
					return
				}
				sc.i++
			}
			sc.table = sc.resolve(parts, array)
			sc.record(sc.table, line)
			continue
		}
		parts, ok := sc.key()
		if !ok {
			return
		}
		sc.skipSpace(false)
		if sc.peek(0) != '=' {
			return
		}
		sc.i++
		path := strings.Join(parts, ".")
		if sc.table != "" {
			path = sc.table + "." + path
		}
		sc.record(path, line)
		sc.skipSpace(false)
		if !sc.value() {
			return
		}
	}
}

// resolve turns a header's key parts into an indexed path: every prefix
// that is an array of tables refers to its last element, and the header of
// an array of tables appends a new element.
func (sc *scanner) resolve(parts []string, array bool) string {
	path := ""
	for k, p := range parts {
		if path != "" {
			path += "."
		}
		path += p
		if array && k == len(parts)-1 {
			n := sc.arrays[path]
			sc.arrays[path] = n + 1
			path += "[" + strconv.Itoa(n) + "]"
		} else if n, ok := sc.arrays[path]; ok {
			path += "[" + strconv.Itoa(n-1) + "]"
		}
	}
	return path
}

// key reads a possibly dotted key of bare and quoted parts.
func (sc *scanner) key() ([]string, bool) {
	var parts []string
	for {
		sc.skipSpace(false)
		if sc.eof() {
			return nil, false
		}
		switch c := sc.data[sc.i]; {
		case c == '"':
			s, ok := sc.basicString()
			if !ok {
				return nil, false
			}
			parts = append(parts, s)
		case c == '\'':
			start := sc.i + 1
			end := strings.IndexByte(string(sc.data[start:]), '\'')
			if end < 0 {
				return nil, false
			}
			parts = append(parts, string(sc.data[start:start+end]))
			sc.i = start + end + 1
		case isBare(c):
			start := sc.i
			for !sc.eof() && isBare(sc.data[sc.i]) {
				sc.i++
			}
			parts = append(parts, string(sc.data[start:sc.i]))
		default:
			return nil, false
		}
		sc.skipSpace(false)
		if sc.peek(0) != '.' {
			return parts, true
		}
		sc.i++
	}
}

func isBare(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// basicString reads a one-line "..." string and returns its value.
func (sc *scanner) basicString() (string, bool) {
	start := sc.i
	sc.i++
	for !sc.eof() {
		switch sc.data[sc.i] {
		case '\\':
			sc.i += 2
			continue
		case '"':
			sc.i++
			raw := string(sc.data[start:sc.i])
			if s, err := strconv.Unquote(raw); err == nil {
				return s, true
			}
			return raw[1 : len(raw)-1], true
		case '\n':
			return "", false
		}
		sc.i++
	}
	return "", false
}

// value skips one value, including arrays and inline tables that span
// lines, and the rest of its line.
func (sc *scanner) value() bool {
	depth := 0
	for !sc.eof() {
		c := sc.data[sc.i]
		switch {
		case c == '"' || c == '\'':
			if !sc.skipString(c) {
				return false
			}
			continue
		case c == '[' || c == '{':
			depth++
		case c == ']' || c == '}':
			depth--
		case c == '#':
			if depth > 0 {
				// Inside a multi-line array or table: not kept.
				for !sc.eof() && sc.data[sc.i] != '\n' {
					sc.i++
				}
			} else {
				sc.comment()
			}
			continue
		case c == '\n':
			sc.line++
			if depth <= 0 {
				sc.i++
				return true
			}
		}
		sc.i++
	}
	return true
}

// skipString skips a string opened by q, one-line or multi-line.
func (sc *scanner) skipString(q byte) bool {
	if sc.peek(1) == q && sc.peek(2) == q {
		sc.i += 3
		for !sc.eof() {
			c := sc.data[sc.i]
			switch {
			case c == '\\' && q == '"':
				if sc.peek(1) == '\n' {
					sc.line++
				}
				sc.i += 2
				continue
			case c == '\n':
				sc.line++
			case c == q && sc.peek(1) == q && sc.peek(2) == q:
				sc.i += 3
				// A closing delimiter may carry up to two more quotes.
				for k := 0; k < 2 && sc.peek(0) == q; k++ {
					sc.i++
				}
				return true
			}
			sc.i++
		}
		return false
	}
	sc.i++
	for !sc.eof() {
		c := sc.data[sc.i]
		switch {
		case c == '\\' && q == '"':
			sc.i += 2
			continue
		case c == q:
			sc.i++
			return true
		case c == '\n':
			return false
		}
		sc.i++
	}
	return false
}

// byIdentity translates n's indexed paths into paths by group label and
// member name in c (the configuration the file held), which survive an
// edit that adds, removes or reorders groups and members. Notes of paths
// c does not explain are dropped.
func (n notes) byIdentity(c *Config) notes {
	out := notes{before: map[string][]string{}, trailing: map[string]string{}, tail: n.tail}
	for p, v := range n.before {
		if q, ok := identityPath(c, p); ok {
			out.before[q] = v
		}
	}
	for p, v := range n.trailing {
		if q, ok := identityPath(c, p); ok {
			out.trailing[q] = v
		}
	}
	return out
}

// identityPath turns "group[1].member[0].uri" into
// "group=signing.member=hsm-b.uri".
func identityPath(c *Config, p string) (string, bool) {
	rest, ok := strings.CutPrefix(p, "group[")
	if !ok {
		return p, true
	}
	gi, rest, ok := index(rest)
	if !ok || gi >= len(c.Groups) {
		return "", false
	}
	g := c.Groups[gi]
	out := groupAnchor(g.Label)
	if rest, ok = strings.CutPrefix(rest, ".member["); ok {
		mi, r, ok := index(rest)
		if !ok || mi >= len(g.Members) {
			return "", false
		}
		out, rest = memberAnchor(g.Label, g.Members[mi].Name), r
	}
	return out + rest, true
}

// index reads "N]" at the start of s.
func index(s string) (int, string, bool) {
	n, rest, ok := strings.Cut(s, "]")
	if !ok {
		return 0, "", false
	}
	i, err := strconv.Atoi(n)
	return i, rest, err == nil && i >= 0
}

// groupAnchor and memberAnchor name a group's and a member's table in
// notes by identity.
func groupAnchor(label string) string { return "group=" + label }

func memberAnchor(group, name string) string { return groupAnchor(group) + ".member=" + name }
