package conformance

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	p "github.com/miekg/pkcs11"
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
	// generates: the make takes no key from outside, so the sequences
	// generate on it the keys they import (generateKeys).
	generates bool
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

// anyStep, as a known difference's step, stands for every step that
// answers its two return values: a make-wide difference (a make that
// answers every call on a key it does not hold CKR_KEY_HANDLE_INVALID,
// where the group answers CKR_OBJECT_HANDLE_INVALID), which must show at
// least once.
const anyStep = "*"

func (k knownDifference) same(o knownDifference) bool {
	return (k.step == o.step || k.step == anyStep) && k.got == o.got && k.want == o.want
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
		if line == "" {
			continue
		}
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
	"tpm":             "**What tpm2-pkcs11 leaves out.**",
	"tpm-slots":       "**The test rig's TPM has no resource manager.**",
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
	{
		name:    "tpm2-pkcs11",
		userPIN: testhsm.UserPIN, soPIN: testhsm.SOPIN,
		bare:      tpmToken,
		member:    tpmToken,
		generates: true,
		known:     "known-tpm.txt",
	},
}

// tpmToken makes a tpm2-pkcs11 token labelled label on a software TPM of
// w's own; the driver's environment points the module at it.
func tpmToken(w *world, label string) testhsm.Token {
	tok := testhsm.TPM(w.t, label)
	for k, v := range tok.ModuleEnv {
		w.env = append(w.env, k+"="+v)
	}
	w.reset = func() { testhsm.FlushTPM(w.t, tok) }
	return tok
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
	for i, s := range seqs {
		if mk.leaveOut != nil {
			s = slices.DeleteFunc(slices.Clone(s), mk.leaveOut)
		}
		if mk.generates {
			s = generateKeys(s)
		}
		seqs[i] = s
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
		for j >= 0 && seen[j] && known[j].step != anyStep {
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
			if !names[k.step] && k.step != anyStep {
				t.Errorf("testdata/%s lists step %q, which the sequences do not have", mk.known, k.step)
			}
		}
	}
}

// generateKeys rewrites steps for a make that takes no private key from
// outside (tpm2-pkcs11: C_CreateObject makes RSA public keys and data
// objects only): each import of an EC private key becomes the generation
// of a P-256 key pair on the token with the same flags, standing also for
// the import of its public key when that is the next step. The outputs
// that depend on the key (signatures, its public point) are not compared,
// as the bare token and the member each make their own key. RSA keys stay
// imports: the test rig's TPM has no resource manager, so it holds one
// generated key at a time (a second generation answers
// CKR_GENERAL_ERROR), and the EC key is what a TPM member signs with.
func generateKeys(in []step) []step {
	var out []step
	generated := map[string]bool{}
	ops := map[string]bool{} // the operations on a generated key
	for i := 0; i < len(in); i++ {
		s := in[i]
		g, pubVar, ok := generation(s, in[i+1:])
		if !ok {
			if refersTo(s.call, generated) {
				ops[s.op] = s.op != ""
			}
			if refersTo(s.call, generated) || ops[s.op] {
				s.skip = append(slices.Clone(s.skip), "out", fmt.Sprintf("a%x", p.CKA_EC_POINT))
			}
			out = append(out, s)
			continue
		}
		for v := range g.save {
			generated[v] = true
		}
		if pubVar != "" {
			i++ // the public key's import, made by the generation
		}
		out = append(out, g)
	}
	return out
}

func refersTo(call string, vars map[string]bool) bool {
	for _, m := range varRef.FindAllStringSubmatch(call, -1) {
		if vars[m[1]] {
			return true
		}
	}
	return false
}

// generation is the generation standing for s when s imports an EC
// private key ("create S TEMPLATE"), and the variable of the public key
// import that follows it, which the generation also makes.
func generation(s step, next []step) (step, string, bool) {
	sess, items, ok := createItems(s.call)
	if !ok || !slices.Contains(items, tu(p.CKA_CLASS, p.CKO_PRIVATE_KEY)) || !slices.Contains(items, tu(p.CKA_KEY_TYPE, p.CKK_EC)) {
		return s, "", false
	}
	priv := slices.DeleteFunc(slices.Clone(items), func(it string) bool {
		return strings.HasPrefix(it, fmt.Sprintf("0x%x=", p.CKA_VALUE)) || strings.HasPrefix(it, fmt.Sprintf("0x%x=", p.CKA_EC_PARAMS))
	})
	pub := []string{tx(p.CKA_EC_PARAMS, p256), tb(p.CKA_TOKEN, slices.Contains(items, tb(p.CKA_TOKEN, true)))}
	g := step{name: s.name, op: s.op, skip: s.skip, save: map[string]string{}}
	for v := range s.save {
		g.save[v] = "h2"
	}
	pubVar := ""
	if len(next) > 0 {
		if _, ni, ok := createItems(next[0].call); ok && slices.Contains(ni, tu(p.CKA_CLASS, p.CKO_PUBLIC_KEY)) && slices.Contains(ni, tu(p.CKA_KEY_TYPE, p.CKK_EC)) {
			pub = slices.DeleteFunc(ni, func(it string) bool { return strings.HasPrefix(it, fmt.Sprintf("0x%x=", p.CKA_EC_POINT)) })
			for v := range next[0].save {
				pubVar = v
				g.save[v] = "h"
			}
		}
	}
	g.call = fmt.Sprintf("genkp %s %s %s %s", sess, mech(p.CKM_EC_KEY_PAIR_GEN), tpl(pub...), tpl(priv...))
	return g, pubVar, true
}

// createItems splits "create S TEMPLATE" into its session and items.
func createItems(call string) (string, []string, bool) {
	f := strings.Fields(call)
	if len(f) != 3 || f[0] != "create" {
		return "", nil, false
	}
	return f[1], strings.Split(f[2], ","), true
}
