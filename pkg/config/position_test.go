package config

import (
	"strconv"
	"testing"

	"github.com/BurntSushi/toml"
)

// The scanner must place keys after values that span lines or hold
// characters that look like TOML structure.
func TestScanSourceLines(t *testing.T) {
	t.Parallel()
	doc := `# comment [not] a = table
[agent] #agent
socket = """
[[group]]
x = "not a key" \
"""
allowed_uids = [ #uids
  1, # one
  2,
]
"allowed_group" = 'g#1' #group
metrics = '''
'quoted' ]] '''

[[group]] #g0
label = "a" #label0
  [[group.member]] #m00
  "name" = "x" #name00
  module_env = { "k.y" = "v", z = "[" } #env00
  [[ group.member ]] #m01
  name = 'y' #name01
[[group]] #g1
serial = "2" #serial1
`
	var v map[string]any
	if _, err := toml.Decode(doc, &v); err != nil {
		t.Fatalf("test document is not TOML: %v", err)
	}
	lines := scanSource([]byte(doc)).lines
	for path, marker := range map[string]string{
		"agent":                         "agent",
		"agent.allowed_uids":            "uids",
		"agent.allowed_group":           "group",
		"group[0]":                      "g0",
		"group[0].label":                "label0",
		"group[0].member[0]":            "m00",
		"group[0].member[0].name":       "name00",
		"group[0].member[0].module_env": "env00",
		"group[0].member[1]":            "m01",
		"group[0].member[1].name":       "name01",
		"group[1]":                      "g1",
		"group[1].serial":               "serial1",
	} {
		want := expand(t, doc, "{"+marker+"}")
		got := lines[path]
		if want != strconv.Itoa(got) {
			t.Errorf("%s: line %d, want %s", path, got, want)
		}
	}
	// Multi-line values: the key's line is where the value opens.
	for path, want := range map[string]int{"agent.socket": 3, "agent.metrics": 12} {
		if got := lines[path]; got != want {
			t.Errorf("%s: line %d, want %d", path, got, want)
		}
	}
}
