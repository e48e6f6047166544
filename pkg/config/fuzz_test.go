package config

import (
	"os"
	"testing"
)

// FuzzParse checks that no input makes the decoder panic, and that what
// decodes also encodes and decodes back to the same configuration, both
// before validation (decode) and after it (Parse).
func FuzzParse(f *testing.F) {
	if data, err := os.ReadFile(exampleConfig); err == nil {
		f.Add(data)
	}
	for _, s := range []string{
		"",
		"[ha]\nretries = -1\ninterval = \"90s\"\n",
		"[[group]]\nlabel = \"x\"\n  [[group.member]]\n  name = \"a\"\n  module = \"/m\"\n  token_label = \"t\"\n",
		"group = [{label = \"a\", member = [{name = \"m\", module = \"/m\", uri = \"pkcs11:token=a\"}]}]\n",
		"[agent]\nallowed_uids = []\n[[group]]\n[[group.member]]\nmodule_env = {}\n",
		"[[group]]\nlabel = 'a\\b'\nserial = \"\"\"1\n2\"\"\"\n[[group.member]]\nmodule_env = { \"k y\" = \"\\u0001\" }\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, _, err := decode(data, "f.toml")
		if err != nil {
			return
		}
		roundTrip(t, c, func(b []byte) (*Config, error) {
			back, _, err := decode(b, "f.toml")
			return back, err
		})
		if c, err := Parse(data, "f.toml"); err == nil {
			roundTrip(t, c, func(b []byte) (*Config, error) { return Parse(b, "f.toml") })
		}
	})
}

func roundTrip(t *testing.T, c *Config, parse func([]byte) (*Config, error)) {
	t.Helper()
	out, err := encode(c, notes{})
	if err != nil {
		t.Fatalf("Encode of a decoded config: %v", err)
	}
	back, err := parse(out)
	if err != nil {
		t.Fatalf("Encode output does not decode: %v\n%s", err, out)
	}
	if !sameConfig(c, back) {
		t.Fatalf("round trip changed the config:\n was %#v\n now %#v\n%s", c, back, out)
	}
}
