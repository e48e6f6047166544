package conformance

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
)

// label is the token label every configuration answers to: the bare
// token's and the group's, so C_GetTokenInfo compares whole.
const label = "conform"

// world is one configuration: a module, the token it is driven on, and
// the environment its driver runs in.
type world struct {
	t       *testing.T
	name    string
	dir     string
	module  string
	env     []string
	pinFile string
	served  []*testhsm.Served // hsmserve members, in member order
	// wrap, when set, runs the driver's argv where the token is reached
	// (opencryptoki's namespace).
	wrap func(ctx context.Context, argv ...string) *exec.Cmd
	// reset, when set, runs before each driver starts (the TPM's slots
	// emptied of what the last one left).
	reset func()
}

// newWorld makes a fresh configuration: members == 0 is a bare SoftHSM
// token; otherwise a group of that many members, in-process SoftHSM
// tokens or, with served, each behind its own hsmserve.
func newWorld(t *testing.T, name string, members int, served bool) *world {
	t.Helper()
	w := &world{t: t, name: name, dir: t.TempDir()}
	w.pinFile = w.write("pins", testhsm.UserPIN+"\n"+testhsm.SOPIN+"\n")
	tokens := filepath.Join(w.dir, "tokens")
	if err := os.Mkdir(tokens, 0o700); err != nil {
		t.Fatal(err)
	}
	softConf := w.write("softhsm2.conf", "directories.tokendir = "+tokens+"\nobjectstore.backend = file\nlog.level = ERROR\nslots.removable = false\n")
	w.env = append(os.Environ(), "SOFTHSM2_CONF="+softConf)
	if members == 0 {
		w.module = testhsm.SoftHSMModule
		w.initTokens(softConf, label)
		return w
	}
	w.module = library(t)
	var ms []testhsm.Token
	for i := 0; i < members; i++ {
		name := fmt.Sprintf("m-%d", i)
		if served {
			s := testhsm.ServeRemote(t, name)
			w.served = append(w.served, s)
			tok := s.Token()
			tok.Name = name
			ms = append(ms, tok)
			continue
		}
		w.initTokens(softConf, name)
		ms = append(ms, testhsm.Token{Name: name, Label: name, Module: testhsm.SoftHSMModule})
	}
	// The module appends to the HA event log only if it exists.
	w.write("ha.log", "")
	conf := w.write("hagroup.toml", w.config(ms))
	w.env = append(w.env, "HAGROUP_CONF="+conf)
	w.write("user.pin", testhsm.UserPIN+"\n")
	w.write("so.pin", testhsm.SOPIN+"\n")
	w.prep(conf)
	return w
}

func (w *world) initTokens(softConf string, labels ...string) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(w.t.Context(), time.Minute)
	defer cancel()
	if _, err := testhsm.InitTokens(ctx, softConf, labels, testhsm.UserPIN, testhsm.SOPIN); err != nil {
		w.t.Fatal(err)
	}
}

// config renders group "conform" over ms; only the virtual slot is listed,
// so the token under test is found by its label as on the bare token.
func (w *world) config(ms []testhsm.Token) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[agent]\nsocket = %q\nstate_dir = %q\nlog_file = %q\n\n",
		filepath.Join(w.dir, "no-agent.sock"), filepath.Join(w.dir, "state"), filepath.Join(w.dir, "ha.log"))
	b.WriteString("[ha]\nonly = true\ninterval = \"1s\"\ncommand_timeout = \"10s\"\n\n")
	fmt.Fprintf(&b, "[[group]]\nlabel = %q\nserial = \"2000002\"\n", label)
	for _, m := range ms {
		fmt.Fprintf(&b, "\n  [[group.member]]\n  name = %q\n  module = %q\n  token_label = %q\n", m.Name, m.Module, m.Label)
		if m.InitArgs != "" {
			fmt.Fprintf(&b, "  init_args = %q\n", m.InitArgs)
		}
	}
	return b.String()
}

// prep installs the group's domain key on every member, as an operator
// would with hactl.
func (w *world) prep(conf string) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(w.t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, hsmprep(w.t), "-config", conf, "-group", label,
		"-user-pin-file", filepath.Join(w.dir, "user.pin"), "-so-pin-file", filepath.Join(w.dir, "so.pin"))
	cmd.Env = w.env
	if out, err := cmd.CombinedOutput(); err != nil {
		w.t.Fatalf("%s: hsmprep: %v\n%s", w.name, err, out)
	}
}

func (w *world) write(name, body string) string {
	w.t.Helper()
	p := filepath.Join(w.dir, name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		w.t.Fatal(err)
	}
	return p
}

// haLog returns the group's HA event log (for failure reports).
func (w *world) haLog() string {
	b, _ := os.ReadFile(filepath.Join(w.dir, "ha.log"))
	return string(b)
}
