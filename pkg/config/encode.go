package config

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"unicode/utf8"
)

// encode writes c as TOML in a fixed, readable layout: [agent], [library],
// [ha], then each [[group]] with its keys and its indented
// [[group.member]] tables, in the order of c. Unset fields are left out,
// so a file holds what its author set and nothing else. The comments of n
// (by identity, see notes.byIdentity) go back above, and after, the
// headers and keys they belong to, wherever those now are. encode does not
// validate c; it fails only on strings that are not valid UTF-8, which
// TOML cannot hold.
func encode(c *Config, n notes) ([]byte, error) {
	w := &tomlWriter{notes: n}
	a := c.Agent
	if !isZeroAgent(a) {
		w.table("[agent]", "", "agent")
		w.str("socket", a.Socket)
		w.str("state_dir", a.StateDir)
		w.str("log_file", a.LogFile)
		if a.LogMaxBytes != 0 {
			w.kv("log_max_bytes", strconv.FormatInt(a.LogMaxBytes, 10))
		}
		w.str("metrics", a.Metrics)
		if a.AllowedUIDs != nil {
			var b []byte
			b = append(b, '[')
			for i, u := range a.AllowedUIDs {
				if i > 0 {
					b = append(b, ", "...)
				}
				b = strconv.AppendInt(b, int64(u), 10)
			}
			w.kv("allowed_uids", string(append(b, ']')))
		}
		w.str("allowed_group", a.AllowedGroup)
		w.boolp("others_read_only", a.OthersReadOnly)
	}
	if c.Library != (Library{}) {
		w.table("[library]", "", "library")
		w.str("process", c.Library.Process)
	}
	if c.HA != (HA{}) {
		w.table("[ha]", "", "ha")
		w.ha(c.HA)
	}
	for _, g := range c.Groups {
		w.table("[[group]]", "", groupAnchor(g.Label))
		w.str("label", g.Label)
		w.str("serial", g.Serial)
		w.ha(g.HA)
		for _, m := range g.Members {
			w.table("[[group.member]]", "  ", memberAnchor(g.Label, m.Name))
			w.str("name", m.Name)
			w.str("module", m.Module)
			if m.ModuleEnv != nil {
				var b []byte
				b = append(b, '{')
				for i, k := range slices.Sorted(maps.Keys(m.ModuleEnv)) {
					if i > 0 {
						b = append(b, ',')
					}
					b = append(b, ' ')
					b = append(b, w.key(k)...)
					b = append(b, " = "...)
					b = append(b, w.quote("module_env", m.ModuleEnv[k])...)
				}
				w.kv("module_env", string(append(b, " }"...)))
			}
			w.str("init_args", m.InitArgs)
			w.str("token_label", m.TokenLabel)
			w.str("token_serial", m.TokenSerial)
			w.str("uri", m.URI)
			w.str("pin_file", m.PINFile)
			w.str("pin_env", m.PINEnv)
			if m.Standby {
				w.kv("standby", "true")
			}
			if m.ServerUID != nil {
				w.kv("server_uid", strconv.FormatInt(*m.ServerUID, 10))
			}
			w.str("dispatch", m.Dispatch)
		}
	}
	if len(n.tail) > 0 {
		w.buf.WriteByte('\n')
		w.comments("", n.tail)
	}
	if w.err != nil {
		return nil, w.err
	}
	return w.buf.Bytes(), nil
}

func isZeroAgent(a Agent) bool {
	return a.Socket == "" && a.StateDir == "" && a.LogFile == "" && a.LogMaxBytes == 0 && a.Metrics == "" &&
		a.AllowedUIDs == nil && a.AllowedGroup == "" && a.OthersReadOnly == nil
}

type tomlWriter struct {
	buf    bytes.Buffer
	indent string
	anchor string // the current table in notes
	notes  notes
	err    error
}

// table starts a table; anchor names it in w.notes.
func (w *tomlWriter) table(header, indent, anchor string) {
	if w.buf.Len() > 0 {
		w.buf.WriteByte('\n')
	}
	w.indent, w.anchor = indent, anchor
	w.comments(indent, w.notes.before[anchor])
	w.line(indent+header, anchor)
}

func (w *tomlWriter) kv(k, v string) {
	path := w.anchor + "." + k
	w.comments(w.indent, w.notes.before[path])
	w.line(w.indent+k+" = "+v, path)
}

// line writes s and the comment that followed path on its line.
func (w *tomlWriter) line(s, path string) {
	w.buf.WriteString(s)
	if t := w.notes.trailing[path]; t != "" {
		w.buf.WriteString(" " + t)
	}
	w.buf.WriteByte('\n')
}

// comments writes comment lines (an empty one as a blank line).
func (w *tomlWriter) comments(indent string, lines []string) {
	for _, l := range lines {
		if l == "" {
			w.buf.WriteByte('\n')
			continue
		}
		w.buf.WriteString(indent + l + "\n")
	}
}

func (w *tomlWriter) str(k, v string) {
	if v != "" {
		w.kv(k, w.quote(k, v))
	}
}

func (w *tomlWriter) boolp(k string, v *bool) {
	if v != nil {
		w.kv(k, strconv.FormatBool(*v))
	}
}

func (w *tomlWriter) intp(k string, v *int) {
	if v != nil {
		w.kv(k, strconv.Itoa(*v))
	}
}

func (w *tomlWriter) dur(k string, v Duration) {
	if v.IsSet() {
		w.kv(k, strconv.Quote(v.String()))
	}
}

func (w *tomlWriter) ha(h HA) {
	w.boolp("only", h.Only)
	w.str("recovery_mode", h.RecoveryMode)
	w.intp("retries", h.Retries)
	w.dur("interval", h.Interval)
	w.dur("command_timeout", h.CommandTimeout)
	w.dur("keygen_timeout", h.KeygenTimeout)
	w.str("policy", h.Policy)
	w.intp("failure_threshold", h.FailureThreshold)
	w.dur("probe_interval", h.ProbeInterval)
	w.dur("tombstone_horizon", h.TombstoneHorizon)
	w.boolp("hedge", h.Hedge)
}

// key writes k bare when TOML allows, else quoted.
func (w *tomlWriter) key(k string) string {
	if k == "" {
		return `""`
	}
	for i := 0; i < len(k); i++ {
		if !isBare(k[i]) {
			return w.quote("module_env", k)
		}
	}
	return k
}

// quote writes s as a TOML basic string. field names the key for the error
// when s is not valid UTF-8.
func (w *tomlWriter) quote(field, s string) string {
	if !utf8.ValidString(s) {
		if w.err == nil {
			w.err = fmt.Errorf("config: encode: %s is not valid UTF-8", field)
		}
		return `""`
	}
	var b []byte
	b = append(b, '"')
	for _, r := range s {
		switch r {
		case '"':
			b = append(b, `\"`...)
		case '\\':
			b = append(b, `\\`...)
		case '\b':
			b = append(b, `\b`...)
		case '\t':
			b = append(b, `\t`...)
		case '\n':
			b = append(b, `\n`...)
		case '\f':
			b = append(b, `\f`...)
		case '\r':
			b = append(b, `\r`...)
		default:
			if r < 0x20 || r == 0x7f {
				b = fmt.Appendf(b, `\u%04X`, r)
			} else {
				b = utf8.AppendRune(b, r)
			}
		}
	}
	return string(append(b, '"'))
}
