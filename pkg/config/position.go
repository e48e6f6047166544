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
	sc := scanner{data: data, line: 1, lines: map[string]int{}, arrays: map[string]int{}}
	sc.run()
	return &source{lines: sc.lines}
}

type scanner struct {
	data   []byte
	i      int
	line   int
	table  string         // indexed path of the current table
	lines  map[string]int // indexed path -> line
	arrays map[string]int // indexed path of an array of tables -> elements so far
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
			for !sc.eof() && sc.data[sc.i] != '\n' {
				sc.i++
			}
		default:
			return
		}
	}
}

func (sc *scanner) record(path string, line int) {
	if _, ok := sc.lines[path]; !ok {
		sc.lines[path] = line
	}
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
			for !sc.eof() && sc.data[sc.i] != '\n' {
				sc.i++
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
