package conformance

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
)

// tokenMake is a make of token whose bare token the harness compares with
// a group of one member of that make, without a domain key.
type tokenMake struct {
	name           string
	userPIN, soPIN string
	bare, member   func(w *world, label string) testhsm.Token
	known          string // its list of known differences in testdata; none: no difference
	// leaveOut names the steps the make's bare token dies in (a crash in
	// the module, not an answer): they are not run on it.
	leaveOut func(s step) bool
}

// knownDifference is a difference between a make's bare token and a group
// of one member of it, listed in testdata/known-MAKE.txt with the reason
// docs/DESIGN.md gives ("Conformance per make"): one line a difference,
// REASON|STEP|GOT-RV|WANT-RV. Only the return values are compared, as the
// outputs of NSS's reads past a buffer are whatever its memory held.
type knownDifference struct {
	reason, step, got, want string
}

func (k knownDifference) String() string {
	return fmt.Sprintf("%s|%s|%s|%s", k.reason, k.step, k.got, k.want)
}

func (k knownDifference) same(o knownDifference) bool {
	return k.step == o.step && k.got == o.got && k.want == o.want
}

// loadKnown reads a make's list of known differences.
func loadKnown(t *testing.T, file string) []knownDifference {
	t.Helper()
	if file == "" {
		return nil
	}
	b, err := os.ReadFile(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	var out []knownDifference
	for i, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Split(line, "|")
		if len(f) != 4 {
			t.Fatalf("testdata/%s:%d: want REASON|STEP|GOT-RV|WANT-RV, got %q", file, i+1, line)
		}
		if _, ok := makeReasons[f[0]]; !ok {
			t.Fatalf("testdata/%s:%d: reason %q is not in makeReasons", file, i+1, f[0])
		}
		out = append(out, knownDifference{f[0], f[1], f[2], f[3]})
	}
	return out
}

// makeReasons are the reasons a make's known differences give, each the
// text of its entry in docs/DESIGN.md ("Conformance per make").
var makeReasons = map[string]string{
	"identity":        "**Identity and the library's state.**",
	"short-buffer":    "**A short buffer keeps the operation.**",
	"one-operation":   "**One operation at a time in a session.**",
	"not-carried":     "**Functions the group does not carry.**",
	"object-size":     "**`C_GetObjectSize`.**",
	"session-state":   "**Session and login states.**",
	"key-protection":  "**Key protection on other makes.**",
	"arguments-first": "**Handles and arguments checked first.**",
	"overread":        "**Reads past the caller's buffers.**",
	"make-answers":    "**Answers a make gets wrong.**",
}

var makes = []tokenMake{
	{
		name:    "SoftHSM without a domain key",
		userPIN: testhsm.UserPIN, soPIN: testhsm.SOPIN,
		bare:   softHSMToken,
		member: softHSMToken,
	},
	{
		name:    "NSS softokn",
		userPIN: testhsm.UserPIN, soPIN: testhsm.SOPIN,
		bare: func(w *world, label string) testhsm.Token {
			tok := testhsm.NSS(w.t, label)
			w.env = append(w.env, "P11DRIVE_INIT_ARGS="+tok.InitArgs)
			return tok
		},
		member: func(w *world, label string) testhsm.Token { return testhsm.NSS(w.t, label) },
		// NSS softokn dies in C_CloseAllSessions after C_InitToken with
		// sessions open.
		leaveOut: func(s step) bool { return strings.HasPrefix(s.call, "inittoken ") },
		known:    "known-nss.txt",
	},
	{
		name:    "opencryptoki soft token",
		userPIN: testhsm.OCKUserPIN, soPIN: testhsm.OCKSOPIN,
		bare: func(w *world, label string) testhsm.Token {
			o := testhsm.NewOCK(w.t, label)
			w.wrap = o.Command
			return testhsm.Token{Name: label, Label: label, Module: testhsm.OCKModule}
		},
		member: func(w *world, label string) testhsm.Token {
			o := testhsm.NewOCK(w.t, label)
			w.wrap = o.Command
			return testhsm.Token{Name: label, Label: label, Module: testhsm.OCKModule}
		},
		leaveOut: func(s step) bool {
			return slices.ContainsFunc(ockCrashes, func(p string) bool { return strings.HasPrefix(s.name, p) })
		},
		known: "known-opencryptoki.txt",
	},
}

// softHSMToken makes a SoftHSM token labelled label in w's own token
// directory.
func softHSMToken(w *world, label string) testhsm.Token {
	tokens := filepath.Join(w.dir, "tokens")
	if err := os.Mkdir(tokens, 0o700); err != nil {
		w.t.Fatal(err)
	}
	conf := w.write("softhsm2.conf", "directories.tokendir = "+tokens+"\nobjectstore.backend = file\nlog.level = ERROR\nslots.removable = false\n")
	w.env = append(w.env, "SOFTHSM2_CONF="+conf)
	w.initTokens(conf, label)
	return testhsm.Token{Name: label, Label: label, Module: testhsm.SoftHSMModule}
}

// newMakeWorld is a bare token of mk (members == 0) or a group of one
// member of mk, in-process, driven where the token is reached.
func newMakeWorld(t *testing.T, mk tokenMake, members int) *world {
	t.Helper()
	name := mk.name + ": bare token"
	if members > 0 {
		name = mk.name + ": one member"
	}
	w := &world{t: t, name: name, dir: t.TempDir()}
	w.pinFile = w.write("pins", mk.userPIN+"\n"+mk.soPIN+"\n")
	w.env = os.Environ()
	if members == 0 {
		tok := mk.bare(w, label)
		w.module = tok.Module
		return w
	}
	tok := mk.member(w, "m-0")
	w.module = library(t)
	w.write("ha.log", "")
	conf := w.write("hagroup.toml", w.config([]testhsm.Token{tok}))
	w.env = append(w.env, "HAGROUP_CONF="+conf)
	return w
}

// makeSequences are the sequences run on mk.
func makeSequences(t testing.TB, mk tokenMake) [][]step {
	seqs := sequences(t)
	if mk.leaveOut == nil {
		return seqs
	}
	for i, s := range seqs {
		seqs[i] = slices.DeleteFunc(slices.Clone(s), mk.leaveOut)
	}
	return seqs
}

// TestConformancePerMake runs the sequences on a bare token of each make
// and through the virtual slot of a group of one member of that make:
// every answer must be the bare token's but for the documented
// differences that hold for every make, and the make's known differences,
// each of which must still show.
func TestConformancePerMake(t *testing.T) {
	for _, mk := range makes {
		t.Run(mk.name, func(t *testing.T) {
			seqs := makeSequences(t, mk)
			bare, group := newMakeWorld(t, mk, 0), newMakeWorld(t, mk, 1)
			var diffs []difference
			for _, s := range seqs {
				want := play(t, bare, s, nil)
				diffs = append(diffs, compare("one member", want, play(t, group, s, nil), allowances).diffs...)
			}
			checkKnown(t, mk, diffs)
		})
	}
}

// checkKnown fails for each difference mk does not list and for each
// listed one that did not show.
func checkKnown(t *testing.T, mk tokenMake, diffs []difference) {
	t.Helper()
	known := loadKnown(t, mk.known)
	seen := make([]bool, len(known))
	for _, d := range diffs {
		k := knownDifference{step: d.step, got: rvOf(d.got), want: rvOf(d.want)}
		j := slices.IndexFunc(known, func(x knownDifference) bool { return x.same(k) })
		for j >= 0 && seen[j] {
			next := slices.IndexFunc(known[j+1:], func(x knownDifference) bool { return x.same(k) })
			if next < 0 {
				j = -1
				break
			}
			j += 1 + next
		}
		if j < 0 {
			t.Errorf("%s: undocumented difference from the bare token: %s\n      as a line of testdata/%s: REASON|%s|%s|%s", mk.name, d, mk.known, k.step, k.got, k.want)
			continue
		}
		seen[j] = true
	}
	for j, k := range known {
		if !seen[j] {
			t.Errorf("%s: listed difference no longer shows (remove it from testdata/%s, and docs/DESIGN.md if it was the last of its reason): %s", mk.name, mk.known, k)
		}
	}
}

// rvOf is the return value field of a normalised answer.
func rvOf(norm string) string {
	rv, _, _ := strings.Cut(norm, " ")
	return strings.TrimPrefix(rv, "rv=")
}

// ockCrashes name by their prefix the steps opencryptoki 3.8's soft token
// dies in (SIGSEGV in the module): its CKM_SHA256_HMAC, verifying or
// finishing a multi-part signature.
var ockCrashes = []string{"HMAC "}

// TestMakeReasonsDocumented: every reason a make's known differences give
// is an entry of docs/DESIGN.md's "Differences from the member token", and
// every list names only steps the sequences have.
func TestMakeReasonsDocumented(t *testing.T) {
	sec := differencesSection(t)
	for tag, text := range makeReasons {
		if !strings.Contains(sec, text) {
			t.Errorf("reason %q: docs/DESIGN.md, \"Differences from the member token\", has no entry %q", tag, text)
		}
	}
	names := map[string]bool{}
	for _, s := range slices.Concat(sequences(t)...) {
		names[s.name] = true
	}
	for _, mk := range makes {
		for _, k := range loadKnown(t, mk.known) {
			if !names[k.step] {
				t.Errorf("testdata/%s lists step %q, which the sequences do not have", mk.known, k.step)
			}
		}
	}
}
