package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// expand replaces each {name} in want with the 1-based line of doc that
// carries the comment "#name", so the expected line numbers are read off
// the document itself.
func expand(t *testing.T, doc, want string) string {
	t.Helper()
	lines := strings.Split(doc, "\n")
	for {
		i := strings.Index(want, "{")
		if i < 0 {
			return want
		}
		j := strings.Index(want[i:], "}")
		if j < 0 {
			t.Fatalf("unclosed marker in %q", want)
		}
		name := want[i+1 : i+j]
		n := 0
		for k, l := range lines {
			if strings.HasSuffix(l, "#"+name) {
				n = k + 1
				break
			}
		}
		if n == 0 {
			t.Fatalf("no line marked #%s in the document", name)
		}
		want = want[:i] + fmt.Sprint(n) + want[i+j+1:]
	}
}

// errLines splits a joined error into its messages, checking that each is
// a *FieldError.
func errLines(t *testing.T, err error) []string {
	t.Helper()
	if err == nil {
		return nil
	}
	var out []string
	var walk func(error)
	walk = func(e error) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
			return
		}
		var fe *FieldError
		if !errors.As(e, &fe) {
			t.Errorf("error %q is a %T, not a *FieldError", e, e)
		}
		out = append(out, e.Error())
	}
	walk(err)
	return out
}

func checkErrors(t *testing.T, doc string, err error, want []string) {
	t.Helper()
	got := errLines(t, err)
	if len(want) == 0 && len(got) == 0 {
		return
	}
	var exp []string
	for _, w := range want {
		exp = append(exp, expand(t, doc, w))
	}
	if strings.Join(got, "\n") != strings.Join(exp, "\n") {
		t.Errorf("errors:\n got: %s\nwant: %s", strings.Join(got, "\n      "), strings.Join(exp, "\n      "))
	}
}

// A valid member, for documents that are about something else.
const okMember = `  [[group.member]]
  name = "a"
  module = "/usr/lib/softhsm/libsofthsm2.so"
  token_label = "tok-a"
`

func TestValidateErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		doc  string
		want []string // each error, {x} = line marked #x
	}{
		{
			name: "group without label",
			doc:  "[[group]] #g\n" + okMember,
			want: []string{`t.toml:{g}: group #1: label: missing: every group needs a label`},
		},
		{
			name: "duplicate group label",
			doc:  "[[group]]\nlabel = \"x\"\n" + okMember + "[[group]]\nlabel = \"x\" #l\n" + okMember,
			want: []string{`t.toml:{l}: group "x": label: "x" is already the label of group #1`},
		},
		{
			name: "label too long",
			doc:  "[[group]]\nlabel = \"" + strings.Repeat("x", 33) + "\" #l\n" + okMember,
			want: []string{`t.toml:{l}: group "` + strings.Repeat("x", 33) + `": label: 33 bytes is too long: a PKCS#11 token label holds at most 32`},
		},
		{
			name: "label with trailing space",
			doc:  "[[group]]\nlabel = \"x \" #l\n" + okMember,
			want: []string{`t.toml:{l}: group "x ": label: begins or ends with a space, which PKCS#11's space-padded labels lose`},
		},
		{
			name: "label with control character",
			doc:  "[[group]]\nlabel = \"a\\tb\" #l\n" + okMember,
			want: []string{`t.toml:{l}: group "a\tb": label: contains a control character`},
		},
		{
			name: "hedge not a boolean",
			doc:  "[[group]]\nlabel = \"x\"\nhedge = \"yes\" #h\n" + okMember,
			want: []string{`t.toml:{h}: group "x": hedge: incompatible types: TOML value has type string; destination has type boolean`},
		},
		{
			name: "serial not digits",
			doc:  "[[group]]\nlabel = \"x\"\nserial = \"12a\" #s\n" + okMember,
			want: []string{`t.toml:{s}: group "x": serial: "12a" is not a number: a serial is digits only`},
		},
		{
			name: "serial too long",
			doc:  "[[group]]\nlabel = \"x\"\nserial = \"12345678901234567\" #s\n" + okMember,
			want: []string{`t.toml:{s}: group "x": serial: 17 digits is too long: at most 16`},
		},
		{
			name: "duplicate serial",
			doc:  "[[group]]\nlabel = \"x\"\nserial = \"7\"\n" + okMember + "[[group]]\nlabel = \"y\"\nserial = \"7\" #s\n" + okMember,
			want: []string{`t.toml:{s}: group "y": serial: 7 is already the serial of group "x"`},
		},
		{
			name: "group without members",
			doc:  "[[group]] #g\nlabel = \"x\"\n",
			want: []string{`t.toml:{g}: group "x": member: the group has no members: it needs at least one`},
		},
		{
			name: "every member a standby",
			doc: "[[group]] #g\nlabel = \"x\"\n" + okMember + "  standby = true\n" +
				"  [[group.member]]\n  name = \"b\"\n  module = \"/m.so\"\n  token_label = \"tok-b\"\n  standby = true\n",
			want: []string{`t.toml:{g}: group "x": member: every member is a standby: at least one must be active`},
		},
		{
			name: "member without name",
			doc:  "[[group]]\nlabel = \"x\"\n  [[group.member]] #m\n  module = \"/m.so\"\n  token_label = \"t\"\n",
			want: []string{`t.toml:{m}: group "x": member #1: name: missing: every member needs a name`},
		},
		{
			name: "member name with bad characters",
			doc:  "[[group]]\nlabel = \"x\"\n  [[group.member]]\n  name = \"hsm a/1\" #n\n  module = \"/m.so\"\n  token_label = \"t\"\n",
			want: []string{`t.toml:{n}: group "x": member "hsm a/1": name: "hsm a/1" is not a valid name: use 1 to 64 of A-Z a-z 0-9 . _ -`},
		},
		{
			name: "duplicate member name",
			doc:  "[[group]]\nlabel = \"x\"\n" + okMember + "  [[group.member]]\n  name = \"a\" #n\n  module = \"/m.so\"\n  token_label = \"t2\"\n",
			want: []string{`t.toml:{n}: group "x": member "a": name: "a" is already the name of member #1 of this group`},
		},
		{
			name: "no token selector",
			doc:  "[[group]]\nlabel = \"x\"\n  [[group.member]] #m\n  name = \"a\"\n  module = \"/m.so\"\n",
			want: []string{`t.toml:{m}: group "x": member "a": token_label: no token selected: set exactly one of token_label, token_serial, uri`},
		},
		{
			name: "token_label and uri",
			doc:  "[[group]]\nlabel = \"x\"\n" + okMember + "  uri = \"pkcs11:token=tok-a\" #u\n",
			want: []string{`t.toml:{u}: group "x": member "a": uri: token_label and uri are both set: set exactly one of token_label, token_serial, uri`},
		},
		{
			name: "all three selectors",
			doc:  "[[group]]\nlabel = \"x\"\n" + okMember + "  token_serial = \"99\"\n  uri = \"pkcs11:token=tok-a\" #u\n",
			want: []string{`t.toml:{u}: group "x": member "a": uri: token_label, token_serial and uri are all set: set exactly one of token_label, token_serial, uri`},
		},
		{
			name: "token_label too long",
			doc:  "[[group]]\nlabel = \"x\"\n  [[group.member]]\n  name = \"a\"\n  module = \"/m.so\"\n  token_label = \"" + strings.Repeat("t", 33) + "\" #l\n",
			want: []string{`t.toml:{l}: group "x": member "a": token_label: 33 bytes is too long: a PKCS#11 token label holds at most 32`},
		},
		{
			name: "token_serial too long",
			doc:  "[[group]]\nlabel = \"x\"\n  [[group.member]]\n  name = \"a\"\n  module = \"/m.so\"\n  token_serial = \"12345678901234567\" #s\n",
			want: []string{`t.toml:{s}: group "x": member "a": token_serial: 17 bytes is too long: a PKCS#11 token serial holds at most 16`},
		},
		{
			name: "uri not pkcs11",
			doc:  "[[group]]\nlabel = \"x\"\n  [[group.member]]\n  name = \"a\"\n  module = \"/m.so\"\n  uri = \"https://hsm/\" #u\n",
			want: []string{`t.toml:{u}: group "x": member "a": uri: not a PKCS#11 URI: it must begin with "pkcs11:"`},
		},
		{
			name: "uri naming no token",
			doc:  "[[group]]\nlabel = \"x\"\n  [[group.member]]\n  name = \"a\"\n  module = \"/m.so\"\n  uri = \"pkcs11:model=SoftHSM%20v2;slot-id=3\" #u\n",
			want: []string{`t.toml:{u}: group "x": member "a": uri: names no token: include token= or serial= (slot-id, manufacturer and model alone are not unique or not stable)`},
		},
		{
			name: "uri carrying a PIN",
			doc:  "[[group]]\nlabel = \"x\"\n  [[group.member]]\n  name = \"a\"\n  module = \"/m.so\"\n  uri = \"pkcs11:token=t?pin-value=SECRET-1234\" #u\n",
			want: []string{`t.toml:{u}: group "x": member "a": uri: must not carry a PIN (pin-value): use pin_file or pin_env`},
		},
		{
			name: "uri naming an object",
			doc:  "[[group]]\nlabel = \"x\"\n  [[group.member]]\n  name = \"a\"\n  module = \"/m.so\"\n  uri = \"pkcs11:token=t;object=key1\" #u\n",
			want: []string{`t.toml:{u}: group "x": member "a": uri: attribute "object" names an object: a member URI selects a token`},
		},
		{
			name: "uri bad percent-encoding",
			doc:  "[[group]]\nlabel = \"x\"\n  [[group.member]]\n  name = \"a\"\n  module = \"/m.so\"\n  uri = \"pkcs11:token=t%zz\" #u\n",
			want: []string{`t.toml:{u}: group "x": member "a": uri: attribute "token": bad percent-encoding`},
		},
		{
			name: "uri repeated attribute",
			doc:  "[[group]]\nlabel = \"x\"\n  [[group.member]]\n  name = \"a\"\n  module = \"/m.so\"\n  uri = \"pkcs11:token=t;token=u\" #u\n",
			want: []string{`t.toml:{u}: group "x": member "a": uri: attribute "token" appears twice`},
		},
		{
			name: "module missing",
			doc:  "[[group]]\nlabel = \"x\"\n  [[group.member]] #m\n  name = \"a\"\n  token_label = \"t\"\n",
			want: []string{`t.toml:{m}: group "x": member "a": module: missing: the path of the member's PKCS#11 module`},
		},
		{
			name: "module relative",
			doc:  "[[group]]\nlabel = \"x\"\n  [[group.member]]\n  name = \"a\"\n  module = \"libsofthsm2.so\" #m\n  token_label = \"t\"\n",
			want: []string{`t.toml:{m}: group "x": member "a": module: "libsofthsm2.so" is not an absolute path`},
		},
		{
			name: "module remote without socket path",
			doc:  "[[group]]\nlabel = \"x\"\n  [[group.member]]\n  name = \"a\"\n  module = \"hagroup-remote:unix:run/a.sock\" #m\n  token_label = \"t\"\n",
			want: []string{`t.toml:{m}: group "x": member "a": module: "hagroup-remote:unix:run/a.sock": a served token is hagroup-remote:unix:/absolute/path/of/socket`},
		},
		{
			name: "server_uid on a module that is not served",
			doc:  "[[group]]\nlabel = \"x\"\n" + okMember + "  server_uid = 1000 #u\n",
			want: []string{`t.toml:{u}: group "x": member "a": server_uid: applies only to a token served by hsmserve (module hagroup-remote:…)`},
		},
		{
			name: "server_uid negative",
			doc:  "[[group]]\nlabel = \"x\"\n  [[group.member]]\n  name = \"a\"\n  module = \"hagroup-remote:unix:/run/a.sock\"\n  token_label = \"t\"\n  server_uid = -1 #u\n",
			want: []string{`t.toml:{u}: group "x": member "a": server_uid: -1 is not a user ID`},
		},
		{
			name: "server_uid beyond uid_t",
			doc:  "[[group]]\nlabel = \"x\"\n  [[group.member]]\n  name = \"a\"\n  module = \"hagroup-remote:unix:/run/a.sock\"\n  token_label = \"t\"\n  server_uid = 4294967295 #u\n",
			want: []string{`t.toml:{u}: group "x": member "a": server_uid: 4294967295 is not a user ID`},
		},
		{
			name: "dispatch unknown",
			doc:  "[[group]]\nlabel = \"x\"\n" + okMember + "  dispatch = \"spin\" #d\n",
			want: []string{`t.toml:{d}: group "x": member "a": dispatch: "spin" is not a dispatch: use "handoff" (the default) or "inline"`},
		},
		{
			name: "dispatch inline on a served token",
			doc:  "[[group]]\nlabel = \"x\"\n  [[group.member]]\n  name = \"a\"\n  module = \"hagroup-remote:unix:/run/a.sock\"\n  token_label = \"t\"\n  dispatch = \"inline\" #d\n",
			want: []string{`t.toml:{d}: group "x": member "a": dispatch: "inline" is for in-process software tokens that cannot hang; a token served by hsmserve can: use "handoff"`},
		},
		{
			name: "init_args naming a password",
			doc:  "[[group]]\nlabel = \"x\"\n" + okMember + "  init_args = \"configdir='sql:/a' password='p'\" #i\n",
			want: []string{`t.toml:{i}: group "x": member "a": init_args: init arguments name a PIN or password parameter: a PIN never goes in init arguments (they are shown by hactl and on command lines); give it with pin_file or pin_env`},
		},
		{
			name: "init_args with a newline",
			doc:  "[[group]]\nlabel = \"x\"\n" + okMember + "  init_args = \"configdir='sql:/a'\\nflags=x\" #i\n",
			want: []string{`t.toml:{i}: group "x": member "a": init_args: init arguments contain a control character (a NUL, newline or tab)`},
		},
		{
			name: "init_args on a served token",
			doc:  "[[group]]\nlabel = \"x\"\n  [[group.member]]\n  name = \"a\"\n  module = \"hagroup-remote:unix:/run/a.sock\"\n  token_label = \"t\"\n  init_args = \"configdir='sql:/a'\" #i\n",
			want: []string{`t.toml:{i}: group "x": member "a": init_args: a served token's module is initialised by its hsmserve: give the init arguments to hsmserve (--init-args)`},
		},
		{
			name: "module_env bad name",
			doc:  "[[group]]\nlabel = \"x\"\n" + okMember + "  module_env = { \"A=B\" = \"c\" } #e\n",
			want: []string{`t.toml:{e}: group "x": member "a": module_env: "A=B" is not an environment variable name`},
		},
		{
			name: "pin_file and pin_env",
			doc:  "[[group]]\nlabel = \"x\"\n" + okMember + "  pin_file = \"/etc/pin\" #f\n  pin_env = \"PIN\"\n",
			want: []string{`t.toml:{f}: group "x": member "a": pin_file: pin_file and pin_env are both set: use one`},
		},
		{
			name: "pin_file relative",
			doc:  "[[group]]\nlabel = \"x\"\n" + okMember + "  pin_file = \"pin-a\" #f\n",
			want: []string{`t.toml:{f}: group "x": member "a": pin_file: "pin-a" is not an absolute path`},
		},
		{
			name: "pin_env bad name",
			doc:  "[[group]]\nlabel = \"x\"\n" + okMember + "  pin_env = \"1PIN\" #e\n",
			want: []string{`t.toml:{e}: group "x": member "a": pin_env: "1PIN" is not an environment variable name`},
		},
		{
			name: "two members on one token",
			doc:  "[[group]]\nlabel = \"x\"\n" + okMember + "  [[group.member]]\n  name = \"b\"\n  module = \"/usr/lib/softhsm/libsofthsm2.so\"\n  token_label = \"tok-a\" #t\n",
			want: []string{`t.toml:{t}: group "x": member "b": token_label: selects the same token as member "a"`},
		},
		{
			name: "unknown process model",
			doc:  "[library]\nprocess = \"forked\" #p\n",
			want: []string{`t.toml:{p}: library.process: "forked" is not a process model: want "in-process" or "helper"`},
		},
		{
			name: "unknown policy",
			doc:  "[ha]\npolicy = \"fastest\" #p\n",
			want: []string{`t.toml:{p}: ha.policy: "fastest" is not a policy: want "least-busy", "round-robin" or "primary-backup"`},
		},
		{
			name: "unknown recovery mode in a group",
			doc:  "[[group]]\nlabel = \"x\"\nrecovery_mode = \"activebasic\" #r\n" + okMember,
			want: []string{`t.toml:{r}: group "x": recovery_mode: "activebasic" is not a recovery mode: want "activeBasic" or "activeEnhanced"`},
		},
		{
			name: "retries below -1",
			doc:  "[ha]\nretries = -2 #r\n",
			want: []string{`t.toml:{r}: ha.retries: -2 is out of range: want -1 (unlimited), 0 (off) or a count`},
		},
		{
			name: "failure_threshold zero",
			doc:  "[[group]]\nlabel = \"x\"\nfailure_threshold = 0 #f\n" + okMember,
			want: []string{`t.toml:{f}: group "x": failure_threshold: 0 is out of range: want at least 1`},
		},
		{
			name: "interval under a second",
			doc:  "[ha]\ninterval = \"500ms\" #i\n",
			want: []string{`t.toml:{i}: ha.interval: 500ms is too short: want at least 1s`},
		},
		{
			name: "negative duration",
			doc:  "[[group]]\nlabel = \"x\"\ncommand_timeout = \"-5s\" #c\n" + okMember,
			want: []string{`t.toml:{c}: group "x": command_timeout: -5s is negative`},
		},
		{
			name: "zero duration",
			doc:  "[ha]\nkeygen_timeout = \"0s\" #k\n[[group]]\nlabel = \"x\"\nprobe_interval = \"0m\" #p\n" + okMember,
			want: []string{
				`t.toml:{k}: ha.keygen_timeout: zero is not allowed: omit the key for the default (2m)`,
				`t.toml:{p}: group "x": probe_interval: zero is not allowed: omit the key for the default (5s)`,
			},
		},
		{
			name: "agent relative paths",
			doc:  "[agent]\nsocket = \"run/ha.sock\" #s\nstate_dir = \"state\" #d\nlog_file = \"ha.log\" #l\n",
			want: []string{
				`t.toml:{s}: agent.socket: "run/ha.sock" is not an absolute path`,
				`t.toml:{d}: agent.state_dir: "state" is not an absolute path`,
				`t.toml:{l}: agent.log_file: "ha.log" is not an absolute path`,
			},
		},
		{
			name: "agent numbers",
			doc:  "[agent]\nlog_max_bytes = -1 #b\nallowed_uids = [0, -7] #u\n",
			want: []string{
				`t.toml:{b}: agent.log_max_bytes: -1 is negative`,
				`t.toml:{u}: agent.allowed_uids: -7 is not a user ID`,
			},
		},
		{
			name: "agent metrics not host:port",
			doc:  "[agent]\nmetrics = \"9464\" #m\n",
			want: []string{`t.toml:{m}: agent.metrics: "9464" is not host:port (like "127.0.0.1:9464")`},
		},
		{
			name: "agent bad group",
			doc:  "[agent]\nallowed_group = \"ha group\" #g\n",
			want: []string{`t.toml:{g}: agent.allowed_group: "ha group" is neither a group name nor a group ID`},
		},
		{
			name: "every problem reported, not just the first",
			doc: "[ha]\npolicy = \"x\" #p\n[[group]]\nlabel = \"g\"\n  [[group.member]]\n  name = \"a\"\n  module = \"rel.so\" #m\n" +
				"  token_label = \"t\"\n  token_serial = \"1\" #s\n[[group]] #g2\n",
			want: []string{
				`t.toml:{p}: ha.policy: "x" is not a policy: want "least-busy", "round-robin" or "primary-backup"`,
				`t.toml:{m}: group "g": member "a": module: "rel.so" is not an absolute path`,
				`t.toml:{s}: group "g": member "a": token_serial: token_label and token_serial are both set: set exactly one of token_label, token_serial, uri`,
				`t.toml:{g2}: group #2: label: missing: every group needs a label`,
				`t.toml:{g2}: group #2: member: the group has no members: it needs at least one`,
			},
		},
		{
			name: "valid",
			doc: "[ha]\npolicy = \"round-robin\"\n[[group]]\nlabel = \"x\"\nserial = \"42\"\n" + okMember +
				"  [[group.member]]\n  name = \"b\"\n  module = \"/m.so\"\n  uri = \"pkcs11:token=tok-b;serial=%31\"\n  standby = true\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := Parse([]byte(tt.doc), "t.toml")
			checkErrors(t, tt.doc, err, tt.want)
			if err == nil && c == nil {
				t.Fatal("Parse returned neither a config nor an error")
			}
			if err != nil && strings.Contains(err.Error(), "SECRET-1234") {
				t.Errorf("error reveals the PIN in a URI: %v", err)
			}
		})
	}
}

// A configuration built in memory has no file or lines; its errors still
// name group, member and key.
func TestValidateInMemory(t *testing.T) {
	t.Parallel()
	c := &Config{Groups: []Group{{
		Label:   "signing",
		HA:      HA{Interval: Duration(10e6)},
		Members: []Member{{Name: "a", Module: "/m.so", TokenLabel: "t", URI: "pkcs11:token=t"}},
	}}}
	got := errLines(t, c.Validate())
	want := []string{
		`group "signing": interval: 10ms is too short: want at least 1s`,
		`group "signing": member "a": uri: token_label and uri are both set: set exactly one of token_label, token_serial, uri`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var fe *FieldError
	if !errors.As(c.Validate(), &fe) || fe.Group != "signing" || fe.Key != "interval" || fe.GroupIndex != 0 || fe.MemberIndex != -1 {
		t.Errorf("first FieldError = %+v", fe)
	}
	if err := (&Config{}).Validate(); err != nil {
		t.Errorf("empty config: %v", err)
	}
}
