package config

import (
	"fmt"
	"maps"
	"math"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/hagroup/hagroup/internal/initargs"
	"github.com/hagroup/hagroup/pkg/slot/dispatch"
)

// remoteScheme starts the module path of a token served by hsmserve
// (pkg/remote.Scheme; not imported, to keep this package free of cgo).
const remoteScheme = "hagroup-remote:"

// Limits that come from PKCS#11 (CK_TOKEN_INFO) and from our own use of
// names in metrics labels.
const (
	maxLabel      = 32 // CK_TOKEN_INFO.label
	maxSerial     = 16 // CK_TOKEN_INFO.serialNumber
	maxMemberName = 64
)

// Validate checks c against every rule of the schema and returns all the
// problems found, joined (each a *FieldError naming the file, line when
// known, group, member and key), or nil.
//
// The rules: group labels are non-empty, unique, at most 32 bytes with no
// control characters or edge spaces; serials, when set, are digits, at most
// 16, and unique; a group has at least one member and at least one that is
// not a standby; member names are non-empty, unique in their group, and of
// [A-Za-z0-9._-]; a member sets exactly one of token_label, token_serial
// and uri, a uri is a pkcs11: URI naming a token (by token= or serial=) and
// carrying no PIN; module is an absolute path; at most one of pin_file
// (absolute) and pin_env; server_uid is a user ID, on a member served by
// hsmserve only; two members of a group do not select the same
// token; durations are not negative, interval is at least 1s; policy and
// recovery_mode come from their sets; retries is at least -1 and
// failure_threshold at least 1; agent paths are absolute and metrics is
// host:port.
func (c *Config) Validate() error {
	p := &problems{c: c}
	c.validateAgent(p)
	if v := c.Library.Process; v != "" && v != ProcessInProcess && v != ProcessHelper {
		p.at(-1, -1, "library.process", fmt.Sprintf("%q is not a process model: want %q or %q", v, ProcessInProcess, ProcessHelper))
	}
	validateHA(p, -1, "ha.", c.HA)
	labels := map[string]int{}
	serials := map[string]int{}
	for gi := range c.Groups {
		g := &c.Groups[gi]
		switch {
		case g.Label == "":
			p.at(gi, -1, "label", "missing: every group needs a label")
		default:
			if msg := checkLabel(g.Label); msg != "" {
				p.at(gi, -1, "label", msg)
			}
			if first, dup := labels[g.Label]; dup {
				p.at(gi, -1, "label", fmt.Sprintf("%q is already the label of group #%d", g.Label, first+1))
			} else {
				labels[g.Label] = gi
			}
		}
		if g.Serial != "" {
			switch {
			case strings.Trim(g.Serial, "0123456789") != "":
				p.at(gi, -1, "serial", fmt.Sprintf("%q is not a number: a serial is digits only", g.Serial))
			case len(g.Serial) > maxSerial:
				p.at(gi, -1, "serial", fmt.Sprintf("%d digits is too long: at most %d", len(g.Serial), maxSerial))
			}
			if first, dup := serials[g.Serial]; dup {
				p.at(gi, -1, "serial", fmt.Sprintf("%s is already the serial of group %q", g.Serial, c.Groups[first].Label))
			} else {
				serials[g.Serial] = gi
			}
		}
		validateHA(p, gi, "", g.HA)
		c.validateMembers(p, gi)
	}
	return p.err()
}

func (c *Config) validateAgent(p *problems) {
	a := c.Agent
	for _, f := range []struct{ key, val string }{
		{"agent.socket", a.Socket},
		{"agent.state_dir", a.StateDir},
		{"agent.log_file", a.LogFile},
	} {
		if f.val != "" && !filepath.IsAbs(f.val) {
			p.at(-1, -1, f.key, fmt.Sprintf("%q is not an absolute path", f.val))
		}
	}
	if a.LogMaxBytes < 0 {
		p.at(-1, -1, "agent.log_max_bytes", fmt.Sprintf("%d is negative", a.LogMaxBytes))
	}
	if a.Metrics != "" {
		_, port, err := net.SplitHostPort(a.Metrics)
		if err == nil {
			_, err = strconv.ParseUint(port, 10, 16)
		}
		if err != nil {
			p.at(-1, -1, "agent.metrics", fmt.Sprintf("%q is not host:port (like \"127.0.0.1:9464\")", a.Metrics))
		}
	}
	for _, uid := range a.AllowedUIDs {
		if uid < 0 || uid >= math.MaxUint32 {
			p.at(-1, -1, "agent.allowed_uids", fmt.Sprintf("%d is not a user ID", uid))
		}
	}
	if g := a.AllowedGroup; g != "" && !validGroupName(g) {
		p.at(-1, -1, "agent.allowed_group", fmt.Sprintf("%q is neither a group name nor a group ID", g))
	}
}

func validGroupName(s string) bool {
	if _, err := strconv.ParseUint(s, 10, 32); err == nil {
		return true
	}
	for i, r := range s {
		switch {
		case r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z':
		case i > 0 && (r >= '0' && r <= '9' || r == '-' || r == '.'):
		case i > 0 && i == len(s)-1 && r == '$':
		default:
			return false
		}
	}
	return len(s) <= 256
}

// validateHA checks the [ha] table (gi = -1, prefix "ha.") or a group's
// inline override.
func validateHA(p *problems, gi int, prefix string, h HA) {
	if h.RecoveryMode != "" && h.RecoveryMode != RecoveryActiveBasic && h.RecoveryMode != RecoveryActiveEnhanced {
		p.at(gi, -1, prefix+"recovery_mode", fmt.Sprintf("%q is not a recovery mode: want %q or %q",
			h.RecoveryMode, RecoveryActiveBasic, RecoveryActiveEnhanced))
	}
	if h.Policy != "" && h.Policy != PolicyLeastBusy && h.Policy != PolicyRoundRobin && h.Policy != PolicyPrimaryBackup {
		p.at(gi, -1, prefix+"policy", fmt.Sprintf("%q is not a policy: want %q, %q or %q",
			h.Policy, PolicyLeastBusy, PolicyRoundRobin, PolicyPrimaryBackup))
	}
	if h.Retries != nil && *h.Retries < -1 {
		p.at(gi, -1, prefix+"retries", fmt.Sprintf("%d is out of range: want -1 (unlimited), 0 (off) or a count", *h.Retries))
	}
	if h.FailureThreshold != nil && *h.FailureThreshold < 1 {
		p.at(gi, -1, prefix+"failure_threshold", fmt.Sprintf("%d is out of range: want at least 1", *h.FailureThreshold))
	}
	for _, d := range []struct {
		key string
		val Duration
		min time.Duration
	}{
		{"interval", h.Interval, time.Second},
		{"command_timeout", h.CommandTimeout, 0},
		{"keygen_timeout", h.KeygenTimeout, 0},
		{"probe_interval", h.ProbeInterval, 0},
		{"tombstone_horizon", h.TombstoneHorizon, 0},
	} {
		switch {
		case d.val < 0:
			p.at(gi, -1, prefix+d.key, fmt.Sprintf("%s is negative", d.val))
		case d.val.IsSet() && d.val.Std() < d.min:
			p.at(gi, -1, prefix+d.key, fmt.Sprintf("%s is too short: want at least %s", d.val, Duration(d.min)))
		}
	}
}

// checkLabel returns what is wrong with a token label, or "".
func checkLabel(s string) string {
	switch {
	case !utf8.ValidString(s):
		return "not valid UTF-8"
	case len(s) > maxLabel:
		return fmt.Sprintf("%d bytes is too long: a PKCS#11 token label holds at most %d", len(s), maxLabel)
	case strings.TrimSpace(s) != s:
		return "begins or ends with a space, which PKCS#11's space-padded labels lose"
	case strings.ContainsFunc(s, unicode.IsControl):
		return "contains a control character"
	}
	return ""
}

func validMemberName(s string) bool {
	if s == "" || len(s) > maxMemberName {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isBare(c) && c != '.' {
			return false
		}
	}
	return true
}

func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

func (c *Config) validateMembers(p *problems, gi int) {
	g := &c.Groups[gi]
	if len(g.Members) == 0 {
		p.at(gi, -1, "member", "the group has no members: it needs at least one")
		return
	}
	names := map[string]int{}
	tokens := map[string]int{}
	active := 0
	for mi := range g.Members {
		m := &g.Members[mi]
		if !m.Standby {
			active++
		}
		switch {
		case m.Name == "":
			p.at(gi, mi, "name", "missing: every member needs a name")
		case !validMemberName(m.Name):
			p.at(gi, mi, "name", fmt.Sprintf("%q is not a valid name: use 1 to %d of A-Z a-z 0-9 . _ -", m.Name, maxMemberName))
		default:
			if first, dup := names[m.Name]; dup {
				p.at(gi, mi, "name", fmt.Sprintf("%q is already the name of member #%d of this group", m.Name, first+1))
			} else {
				names[m.Name] = mi
			}
		}
		switch {
		case m.Module == "":
			p.at(gi, mi, "module", "missing: the path of the member's PKCS#11 module")
		case strings.HasPrefix(m.Module, remoteScheme):
			// A token served by hsmserve (pkg/remote).
			if sock, ok := strings.CutPrefix(m.Module, remoteScheme+"unix:"); !ok || !filepath.IsAbs(sock) {
				p.at(gi, mi, "module", fmt.Sprintf("%q: a served token is %sunix:/absolute/path/of/socket", m.Module, remoteScheme))
			}
		case !filepath.IsAbs(m.Module):
			p.at(gi, mi, "module", fmt.Sprintf("%q is not an absolute path", m.Module))
		case strings.ContainsRune(m.Module, 0):
			p.at(gi, mi, "module", "contains a NUL byte")
		}
		for _, k := range slices.Sorted(maps.Keys(m.ModuleEnv)) {
			if !validEnvName(k) {
				p.at(gi, mi, "module_env", fmt.Sprintf("%q is not an environment variable name", k))
			} else if strings.ContainsRune(m.ModuleEnv[k], 0) {
				p.at(gi, mi, "module_env", fmt.Sprintf("the value of %s contains a NUL byte", k))
			}
		}
		if m.InitArgs != "" {
			if strings.HasPrefix(m.Module, remoteScheme) {
				p.at(gi, mi, "init_args", "a served token's module is initialised by its hsmserve: give the init arguments to hsmserve (--init-args)")
			} else if err := initargs.Check(m.InitArgs); err != nil {
				p.at(gi, mi, "init_args", err.Error())
			}
		}
		validateSelector(p, gi, mi, m)
		if d, err := dispatch.Parse(m.Dispatch); err != nil {
			p.at(gi, mi, "dispatch", err.Error())
		} else if d == dispatch.Inline && strings.HasPrefix(m.Module, remoteScheme) {
			p.at(gi, mi, "dispatch", fmt.Sprintf("%q is for in-process software tokens that cannot hang; a token served by hsmserve can: use %q", dispatch.Inline, dispatch.Handoff))
		}
		if uid := m.ServerUID; uid != nil {
			switch {
			case !strings.HasPrefix(m.Module, remoteScheme):
				p.at(gi, mi, "server_uid", fmt.Sprintf("applies only to a token served by hsmserve (module %s…)", remoteScheme))
			case *uid < 0 || *uid >= math.MaxUint32:
				p.at(gi, mi, "server_uid", fmt.Sprintf("%d is not a user ID", *uid))
			}
		}
		switch {
		case m.PINFile != "" && m.PINEnv != "":
			p.at(gi, mi, "pin_file", "pin_file and pin_env are both set: use one")
		case m.PINFile != "" && !filepath.IsAbs(m.PINFile):
			p.at(gi, mi, "pin_file", fmt.Sprintf("%q is not an absolute path", m.PINFile))
		case m.PINEnv != "" && !validEnvName(m.PINEnv):
			p.at(gi, mi, "pin_env", fmt.Sprintf("%q is not an environment variable name", m.PINEnv))
		}
		if id := m.tokenIdentity(); id != "" {
			if first, dup := tokens[id]; dup {
				p.at(gi, mi, m.selectorKey(), fmt.Sprintf("selects the same token as member %q", g.Members[first].Name))
			} else {
				tokens[id] = mi
			}
		}
	}
	if active == 0 {
		p.at(gi, -1, "member", "every member is a standby: at least one must be active")
	}
}

// selectorKey names the one key that selects m's token, or "".
func (m *Member) selectorKey() string {
	switch {
	case m.TokenLabel != "":
		return "token_label"
	case m.TokenSerial != "":
		return "token_serial"
	case m.URI != "":
		return "uri"
	}
	return ""
}

// tokenIdentity returns a string equal for two members that select the same
// token through the same module, or "" when m selects none or several.
func (m *Member) tokenIdentity() string {
	var sel []string
	for _, s := range []string{m.TokenLabel, m.TokenSerial, m.URI} {
		if s != "" {
			sel = append(sel, s)
		}
	}
	if len(sel) != 1 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%q %q %q", m.Module, m.selectorKey(), sel[0])
	for _, k := range slices.Sorted(maps.Keys(m.ModuleEnv)) {
		fmt.Fprintf(&b, " %q=%q", k, m.ModuleEnv[k])
	}
	// Init arguments choose the token too: one NSS module path serves a
	// database per configdir, each with the same label and serial.
	fmt.Fprintf(&b, " init=%q", m.InitArgs)
	return b.String()
}

func validateSelector(p *problems, gi, mi int, m *Member) {
	var set []string
	if m.TokenLabel != "" {
		set = append(set, "token_label")
	}
	if m.TokenSerial != "" {
		set = append(set, "token_serial")
	}
	if m.URI != "" {
		set = append(set, "uri")
	}
	switch len(set) {
	case 0:
		p.at(gi, mi, "token_label", "no token selected: set exactly one of token_label, token_serial, uri")
		return
	case 1:
	default:
		both := set[0] + " and " + set[1] + " are both set"
		if len(set) == 3 {
			both = "token_label, token_serial and uri are all set"
		}
		p.at(gi, mi, set[len(set)-1], both+": set exactly one of token_label, token_serial, uri")
		return
	}
	switch {
	case m.TokenLabel != "" && len(m.TokenLabel) > maxLabel:
		p.at(gi, mi, "token_label", fmt.Sprintf("%d bytes is too long: a PKCS#11 token label holds at most %d", len(m.TokenLabel), maxLabel))
	case m.TokenSerial != "" && len(m.TokenSerial) > maxSerial:
		p.at(gi, mi, "token_serial", fmt.Sprintf("%d bytes is too long: a PKCS#11 token serial holds at most %d", len(m.TokenSerial), maxSerial))
	case m.URI != "":
		if msg := checkURI(m.URI); msg != "" {
			p.at(gi, mi, "uri", msg)
		}
	}
}

// checkURI returns what is wrong with a member's RFC 7512 token URI, or "".
// The URI itself is never quoted back: a careless one may carry a PIN.
func checkURI(s string) string {
	rest, ok := strings.CutPrefix(s, "pkcs11:")
	if !ok {
		return `not a PKCS#11 URI: it must begin with "pkcs11:"`
	}
	path, query, _ := strings.Cut(rest, "?")
	seen := map[string]bool{}
	identifies := false
	if path != "" {
		for _, attr := range strings.Split(path, ";") {
			name, val, ok := strings.Cut(attr, "=")
			if !ok || name == "" {
				return "a path attribute is not name=value"
			}
			if strings.HasPrefix(strings.ToLower(name), "pin-") {
				return fmt.Sprintf("must not carry a PIN (%s): use pin_file or pin_env", name)
			}
			if seen[name] {
				return fmt.Sprintf("attribute %q appears twice", name)
			}
			seen[name] = true
			v, err := url.PathUnescape(val)
			if err != nil {
				return fmt.Sprintf("attribute %q: bad percent-encoding", name)
			}
			switch {
			case name == "token" || name == "serial":
				if v != "" {
					identifies = true
				}
			case name == "slot-id":
				if _, err := strconv.ParseUint(v, 10, 64); err != nil {
					return `attribute "slot-id" is not a number`
				}
			case name == "manufacturer" || name == "model" || name == "slot-description" ||
				name == "slot-manufacturer" || strings.HasPrefix(name, "library-") || strings.HasPrefix(name, "x-"):
			case name == "object" || name == "id" || name == "type":
				return fmt.Sprintf("attribute %q names an object: a member URI selects a token", name)
			default:
				return fmt.Sprintf("unknown attribute %q", name)
			}
		}
	}
	if query != "" {
		for _, attr := range strings.Split(query, "&") {
			name, _, _ := strings.Cut(attr, "=")
			switch {
			case strings.HasPrefix(strings.ToLower(name), "pin-"):
				return fmt.Sprintf("must not carry a PIN (%s): use pin_file or pin_env", name)
			case name == "module-name" || name == "module-path":
				return fmt.Sprintf("query attribute %s: give the module with the module key", name)
			}
		}
	}
	if !identifies {
		return "names no token: include token= or serial= (slot-id, manufacturer and model alone are not unique or not stable)"
	}
	return ""
}
