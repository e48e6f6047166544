package conformance

import "testing"

// TestCompare: the comparison itself, on answers written out by hand:
// what it lets through and what it reports.
func TestCompare(t *testing.T) {
	// One hand-written difference that ends its operation, whatever the
	// real table holds now.
	allow := append([]allowance{{step: "digest key", configs: []string{served}, got: "rv=0x54", endsOp: true, design: "a hand-written difference"}}, allowances...)
	s := func(name, call, op string) step { return step{name: name, call: call, op: op} }
	q := s("final query", "encfin $o -", "cbc")
	f := s("final", "encfin $o 64", "cbc")
	info := s("info", "info", "")
	create := s("create NULL template", "create $s -", "")
	digest := s("digest key", "digkey $o $aes", "digm")
	after := s("digest final", "digfin $o 64", "digm")
	want := []answer{
		parse(q, "rv=0x0 len=15"), parse(f, "rv=0x0 len=5 out=0102030405"),
		parse(info, "rv=0x0 cryptoki=2.40 manufacturer=SoftHSM"),
		parse(create, "rv=0x7"),
		parse(digest, "rv=0x0"), parse(after, "rv=0x0 len=32 out=aa"),
	}
	cases := []struct {
		name          string
		config        string
		got           []string
		diffs         int
		firstDiffStep string
	}{
		{"the bare token's answers", "one member", []string{"rv=0x0 len=15", "rv=0x0 len=5 out=0102030405", "rv=0x0 cryptoki=2.40 manufacturer=SoftHSM", "rv=0x7", "rv=0x0", "rv=0x0 len=32 out=aa"}, 0, ""},
		{"an exact length and identity", "one member", []string{"rv=0x0 len=5", "rv=0x0 len=5 out=0102030405", "rv=0x0 cryptoki=2.40 manufacturer=hagroup", "rv=0x7", "rv=0x0", "rv=0x0 len=32 out=aa"}, 0, ""},
		{"a length that is neither", "one member", []string{"rv=0x0 len=7", "rv=0x0 len=5 out=0102030405", "rv=0x0 cryptoki=2.40 manufacturer=SoftHSM", "rv=0x7", "rv=0x0", "rv=0x0 len=32 out=aa"}, 1, "final query"},
		{"another cryptoki version", "one member", []string{"rv=0x0 len=15", "rv=0x0 len=5 out=0102030405", "rv=0x0 cryptoki=3.0 manufacturer=hagroup", "rv=0x7", "rv=0x0", "rv=0x0 len=32 out=aa"}, 1, "info"},
		{"another error code", "one member", []string{"rv=0x0 len=15", "rv=0x0 len=5 out=0102030405", "rv=0x0 cryptoki=2.40 manufacturer=SoftHSM", "rv=0x5", "rv=0x0", "rv=0x0 len=32 out=aa"}, 1, "create NULL template"},
		{"a documented difference ends its operation", served, []string{"rv=0x0 len=15", "rv=0x0 len=5 out=0102030405", "rv=0x0 cryptoki=2.40 manufacturer=SoftHSM", "rv=0x7", "rv=0x54", "rv=0x91"}, 0, ""},
		{"not where it is not documented", "one member", []string{"rv=0x0 len=15", "rv=0x0 len=5 out=0102030405", "rv=0x0 cryptoki=2.40 manufacturer=SoftHSM", "rv=0x7", "rv=0x54", "rv=0x91"}, 2, "digest key"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := make([]answer, len(want))
			for i, l := range c.got {
				got[i] = parse(want[i].step, l)
			}
			r := compare(c.config, want, got, allow)
			if len(r.diffs) != c.diffs {
				t.Fatalf("got %d differences %v; want %d", len(r.diffs), r.diffs, c.diffs)
			}
			if c.diffs > 0 && r.diffs[0].step != c.firstDiffStep {
				t.Errorf("first difference at step %q, want %q", r.diffs[0].step, c.firstDiffStep)
			}
		})
	}
}
