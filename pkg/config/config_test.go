package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary double as the child processes of the
// editing tests (see edit_test.go).
func TestMain(m *testing.M) {
	if child := os.Getenv(childEnv); child != "" {
		os.Exit(runChild(child))
	}
	os.Exit(m.Run())
}

// sameConfig reports whether a and b hold the same configuration, ignoring
// where each was read from.
func sameConfig(a, b *Config) bool {
	x, y := *a, *b
	x.src, y.src = nil, nil
	return reflect.DeepEqual(x, y)
}

const exampleConfig = "../../configs/hagroup.toml"

func TestExampleConfigIsValidAndComplete(t *testing.T) {
	t.Parallel()
	c, err := Load(exampleConfig)
	if err != nil {
		t.Fatalf("the shipped example does not load:\n%v", err)
	}
	// The example documents every key of the schema.
	data, err := os.ReadFile(exampleConfig)
	if err != nil {
		t.Fatal(err)
	}
	lines := scanSource(data).lines
	have := map[string]bool{}
	for p := range lines {
		// Drop the indices: group[0].member[1].uri -> group.member.uri.
		for {
			i := strings.IndexByte(p, '[')
			if i < 0 {
				break
			}
			p = p[:i] + p[i+strings.IndexByte(p[i:], ']')+1:]
		}
		have[p] = true
	}
	for _, table := range []string{"agent", "library", "ha", "group", "group.member"} {
		for _, k := range knownKeys(table) {
			if k == "member" {
				continue
			}
			if !have[table+"."+k] && !(table == "group" && have["ha."+k]) {
				t.Errorf("configs/hagroup.toml does not show the key %s.%s", table, k)
			}
		}
	}
	g, ok := c.Group("signing")
	if !ok || len(g.Members) != 3 || !g.Members[2].Standby {
		t.Fatalf("example's group = %+v", g)
	}
	if uid := g.Members[2].ExpectedServerUID(); uid == nil || *uid != 990 || g.Members[0].ExpectedServerUID() != nil {
		t.Errorf("example's server_uid: %v on hsm-c, %v on hsm-a; want 990 and unset", uid, g.Members[0].ExpectedServerUID())
	}
	s := c.Settings(g)
	if s.Policy != PolicyPrimaryBackup || s.Interval != 30*time.Second || s.CommandTimeout != 20*time.Second {
		t.Errorf("example settings = %+v", s)
	}
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	c, err := Load(exampleConfig)
	if err != nil {
		t.Fatal(err)
	}
	// Exercise what the example leaves out: odd strings, several groups.
	c.Library.Process = ProcessHelper
	c.Groups = append(c.Groups, Group{
		Label: `q"uote\ü`,
		HA:    HA{Only: new(true), Retries: new(0), FailureThreshold: new(3), TombstoneHorizon: Duration(1500 * time.Millisecond)},
		Members: []Member{{Name: "x", Module: "/a b/m.so", TokenSerial: "0001",
			ModuleEnv: map[string]string{"Z": "1", "A": "line\nbreak\t\x7f", "B_2": ""},
			InitArgs:  `configdir='sql:/a "b"\c' certPrefix=''`}},
	})
	data, err := encode(c, notes{})
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(data, exampleConfig)
	if err != nil {
		t.Fatalf("re-parse of Encode output failed: %v\n%s", err, data)
	}
	if !sameConfig(c, back) {
		t.Errorf("round trip changed the config:\n was %+v\n now %+v\n%s", c, back, data)
	}
	again, err := encode(back, notes{})
	if err != nil || string(again) != string(data) {
		t.Errorf("Encode is not stable:\n%s\n---\n%s", data, again)
	}
	// Unset fields are left out.
	empty, err := encode(&Config{Groups: []Group{{Label: "g", Members: []Member{{Name: "m", Module: "/m", TokenLabel: "t"}}}}}, notes{})
	if err != nil {
		t.Fatal(err)
	}
	want := "[[group]]\nlabel = \"g\"\n\n  [[group.member]]\n  name = \"m\"\n  module = \"/m\"\n  token_label = \"t\"\n"
	if string(empty) != want {
		t.Errorf("minimal encoding:\n%s\nwant\n%s", empty, want)
	}
	if _, err := encode(&Config{Groups: []Group{{Label: "\xff"}}}, notes{}); err == nil {
		t.Error("Encode accepted a label that is not UTF-8")
	}
}

func TestSettingsPrecedence(t *testing.T) {
	t.Parallel()
	doc := `
[ha]
retries = 5
interval = "2m"
policy = "round-robin"

[[group]]
label = "override"
retries = 0
only = true
hedge = false
command_timeout = "3s"
  [[group.member]]
  name = "a"
  module = "/m.so"
  token_label = "t"

[[group]]
label = "inherit"
  [[group.member]]
  name = "a"
  module = "/m.so"
  token_label = "t"
`
	c, err := Parse([]byte(doc), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	o, _ := c.Group("override")
	i, _ := c.Group("inherit")
	def := Defaults()
	tests := []struct {
		name string
		got  Settings
		want Settings
	}{
		{"defaults", (*Config)(nil).Settings(nil), def},
		{"ha", c.Settings(nil), func() Settings {
			s := def
			s.Retries, s.Interval, s.Policy = 5, 2*time.Minute, PolicyRoundRobin
			return s
		}()},
		{"inherit", c.Settings(i), func() Settings {
			s := def
			s.Retries, s.Interval, s.Policy = 5, 2*time.Minute, PolicyRoundRobin
			return s
		}()},
		{"override", c.Settings(o), func() Settings {
			s := def
			s.Retries, s.Interval, s.Policy, s.Only, s.CommandTimeout = 0, 2*time.Minute, PolicyRoundRobin, true, 3*time.Second
			s.Hedge = false
			return s
		}()},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: got %+v, want %+v", tt.name, tt.got, tt.want)
		}
	}
	want := Settings{Only: false, RecoveryMode: "activeBasic", Retries: -1, Interval: 60 * time.Second,
		CommandTimeout: 20 * time.Second, KeygenTimeout: 120 * time.Second, ProbeInterval: 5 * time.Second,
		TombstoneHorizon: 2160 * time.Hour, Policy: "least-busy", FailureThreshold: 1, Hedge: true}
	if def != want {
		t.Errorf("Defaults() = %+v, want %+v", def, want)
	}
	a := Agent{}.WithDefaults()
	if a.Socket != "/run/hagroup/haagent.sock" || a.StateDir != "/var/lib/hagroup" || a.LogMaxBytes != 10<<20 ||
		a.OthersReadOnly == nil || *a.OthersReadOnly {
		t.Errorf("Agent defaults = %+v", a)
	}
}

func TestUnknownKeys(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		doc  string
		want []string
	}{
		{
			name: "misspelt member key",
			doc:  "[[group]]\nlabel = \"g\"\n  [[group.member]]\n  name = \"a\"\n  module = \"/m.so\"\n  token_label = \"t\"\n  pinfile = \"/p\" #k\n",
			want: []string{`t.toml:{k}: group "g": member "a": pinfile: unknown key (did you mean "pin_file"?)`},
		},
		{
			name: "key in the wrong case",
			doc:  "[ha]\nRetries = 3 #k\n",
			want: []string{`t.toml:{k}: ha.Retries: unknown key (did you mean "retries"?)`},
		},
		{
			name: "unknown table and top-level key, in file order",
			doc:  "version = 2 #v\n[agnet] #a\nsocket = \"/s\"\n[ha]\nthreshold = 2 #t\n",
			want: []string{
				`t.toml:{v}: version: unknown key`,
				`t.toml:{a}: agnet: unknown key (did you mean "agent"?)`,
				`t.toml:{t}: ha.threshold: unknown key`,
			},
		},
		{
			name: "second group, second member",
			doc: "[[group]]\nlabel = \"g\"\n" + okMember + "[[group]]\nlabel = \"h\"\npolcy = \"x\" #p\n" + okMember +
				"  [[group.member]]\n  name = \"b\"\n  module = \"/m.so\"\n  token_label = \"u\"\n  standbye = true #s\n",
			want: []string{
				`t.toml:{p}: group "h": polcy: unknown key (did you mean "policy"?)`,
				`t.toml:{s}: group "h": member "b": standbye: unknown key (did you mean "standby"?)`,
			},
		},
		{
			name: "dotted key into an unknown sub-table",
			doc:  "[[group]]\nlabel = \"g\"\nextra.x = 1 #e\n" + okMember,
			want: []string{`t.toml:{e}: group "g": extra: unknown key`},
		},
		{
			name: "inline array of tables",
			doc: "# top\n" +
				"group = [{label = \"a\", member = [{name = \"m\", module = \"/m\", token_label = \"t\", bogus = 1}]}] #g\n" +
				"[ha]\nretries = 1\n",
			want: []string{`t.toml:{g}: group "a": member "m": bogus: unknown key`},
		},
		{
			name: "module_env keys are free",
			doc:  "[[group]]\nlabel = \"g\"\n" + okMember + "  module_env = { ANY_thing = \"1\", other = \"2\" }\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tt.doc), "t.toml")
			checkErrors(t, tt.doc, err, tt.want)
		})
	}
}

func TestSyntaxAndTypeErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		doc  string
		want string
	}{
		{
			name: "unclosed table header",
			doc:  "[ha]\nretries = 1\n[[group] #x\n",
			want: `t.toml:{x}:8: syntax error: expected end of table array name delimiter ']', but got ' ' instead`,
		},
		{
			name: "missing value",
			doc:  "[agent]\n\nsocket = #x\n",
			want: `t.toml:{x}:10: syntax error: expected value but found '#' instead`,
		},
		{
			name: "duplicate key",
			doc:  "[ha]\nretries = 1\nretries = 2 #x\n",
			want: `t.toml:{x}:13: syntax error: Key 'ha.retries' has already been defined.`,
		},
		{
			name: "string for an integer",
			doc:  "[ha]\n\nretries = \"3\" #x\n",
			want: `t.toml:{x}: ha.retries: incompatible types: TOML value has type string; destination has type integer`,
		},
		{
			name: "wrong type in a member of the second group",
			doc: "[[group]]\nlabel = \"g\"\n" + okMember + "[[group]]\nlabel = \"h\"\n" + okMember +
				"  [[group.member]]\n  name = \"b\"\n  standby = \"yes\" #x\n",
			want: `t.toml:{x}: group "h": member "b": standby: incompatible types: TOML value has type string; destination has type boolean`,
		},
		{
			name: "wrong type in a group",
			doc:  "[[group]]\nlabel = \"g\"\n" + okMember + "[[group]]\nlabel = \"h\"\nfailure_threshold = 1.5 #x\n" + okMember,
			want: `t.toml:{x}: group "h": failure_threshold: incompatible types: TOML value has type float64; destination has type integer`,
		},
		{
			name: "duration without a unit",
			doc:  "[ha]\ninterval = 60 #x\n",
			want: `t.toml:{x}:12: ha.interval: invalid duration "60": want a string with a unit, like "60s" or "5m"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tt.doc), "t.toml")
			checkErrors(t, tt.doc, err, []string{tt.want})
		})
	}
}

func TestLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	missing := filepath.Join(dir, "none.toml")
	_, err := Load(missing)
	if !errors.Is(err, ErrNoConfig) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load(missing) = %v, want ErrNoConfig and fs.ErrNotExist", err)
	}
	if err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("Load(missing) error %q does not name the file", err)
	}

	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(bad, []byte("[ha]\npolicy = \"x\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Load(bad)
	if err == nil || errors.Is(err, ErrNoConfig) {
		t.Errorf("Load(invalid) = %v, want an error that is not ErrNoConfig", err)
	}
	if err != nil && !strings.HasPrefix(err.Error(), bad+":2: ha.policy:") {
		t.Errorf("Load(invalid) = %q, want it to start with %q", err, bad+":2: ha.policy:")
	}

	// Unknown keys and failed rules come back as one flat list.
	_, err = Parse([]byte("[ha]\npolcy = \"x\"\nretries = -5\n"), "t.toml")
	if j, ok := err.(interface{ Unwrap() []error }); !ok || len(j.Unwrap()) != 2 {
		t.Errorf("Parse error is not a flat list of two: %#v", err)
	}

	empty := filepath.Join(dir, "empty.toml")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(empty)
	if err != nil || len(c.Groups) != 0 || c.Path != empty {
		t.Errorf("Load(empty) = %+v, %v; want an empty config", c, err)
	}
	if _, err := Load(""); err == nil {
		t.Error("Load(\"\") succeeded")
	}
}

func TestResolvePath(t *testing.T) {
	// Not parallel: sets the environment.
	t.Setenv(EnvPath, "")
	if got := ResolvePath(""); got != "/etc/hagroup/hagroup.toml" {
		t.Errorf("default = %q", got)
	}
	t.Setenv(EnvPath, "/tmp/env.toml")
	if got := ResolvePath(""); got != "/tmp/env.toml" {
		t.Errorf("env = %q", got)
	}
	if got := ResolvePath("/x.toml"); got != "/x.toml" {
		t.Errorf("flag = %q", got)
	}
}

func TestGroupHelpers(t *testing.T) {
	t.Parallel()
	c := &Config{}
	if got := c.NextSerial(); got != "1000001" {
		t.Errorf("NextSerial of empty = %s", got)
	}
	c.Groups = []Group{{Label: "a", Serial: "1000007"}, {Label: "b", Serial: "5"}, {Label: "c", Serial: "x"}}
	if got := c.NextSerial(); got != "1000008" {
		t.Errorf("NextSerial = %s, want 1000008", got)
	}
	g, ok := c.Group("b")
	if !ok || g.Serial != "5" {
		t.Fatalf("Group(b) = %v, %v", g, ok)
	}
	g.Members = []Member{{Name: "m1"}, {Name: "m2"}}
	if m, ok := c.Groups[1].Member("m2"); !ok || m.Name != "m2" {
		t.Error("Group returned a copy, not a pointer into Groups")
	}
	if !g.RemoveMember("m1") || g.RemoveMember("m1") || len(g.Members) != 1 {
		t.Errorf("RemoveMember: members now %v", g.Members)
	}
	if !c.RemoveGroup("a") || c.RemoveGroup("a") || len(c.Groups) != 2 {
		t.Errorf("RemoveGroup: groups now %v", c.Groups)
	}
	if _, ok := c.Group("a"); ok {
		t.Error("removed group still found")
	}
}

func TestDurationText(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{
		{60 * time.Second, "1m"}, {90 * time.Second, "90s"}, {2160 * time.Hour, "2160h"},
		{1500 * time.Millisecond, "1500ms"}, {-5 * time.Second, "-5s"}, {7, "7ns"}, {0, "0s"},
	} {
		if got := Duration(tt.d).String(); got != tt.want {
			t.Errorf("Duration(%v) = %q, want %q", tt.d, got, tt.want)
		}
		var back Duration
		if err := back.UnmarshalText([]byte(tt.want)); err != nil || back.Std() != tt.d {
			t.Errorf("UnmarshalText(%q) = %v, %v", tt.want, back, err)
		}
	}
}
