package module

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
)

// The token sizes BenchmarkManyObjects runs at. 10,000 takes minutes to
// fill: `-manyobjects 100,1000,10000`.
var manyObjects = flag.String("manyobjects", "100,1000", "keys on each token in BenchmarkManyObjects, comma-separated")

// manyRemote serves each member by its own hsmserve (a process of its
// own that has loaded its token before the application starts) instead of
// loading the three in the application's process.
var manyRemote = flag.Bool("manyremote", false, "BenchmarkManyObjects with every member served by hsmserve")

// manyRounds is how many times each side of a ratio is measured,
// alternating with the other side.
var manyRounds = flag.Int("manyrounds", 5, "alternated rounds per measurement in BenchmarkManyObjects")

// manyBase, when set, is another build of libhapkcs11.so (a commit
// before a change): the pkcs11-tool measurements then time it too, in
// the same rounds, alternated with this build and the bare token, so a
// change is measured side by side on one fixture and one load.
var manyBase = flag.String("manybase", "", "BenchmarkManyObjects: a libhapkcs11.so to time beside this build (before/after)")

// BenchmarkManyObjects measures, with N AES keys and one EC key pair on
// each of 3 members, what a client pays through libhapkcs11.so against one
// bare SoftHSM token holding the same objects (issue 32: many objects
// cost what the members cost). Each side is a fresh process, alternated
// with the other side, medians reported:
//
//   - first-signature: pkcs11-tool --sign (load, login, find by label, sign);
//   - softhsm-load: pkcs11-tool -L on libsofthsm2.so itself, the members'
//     token directory (three tokens) against the bare token's (one);
//   - list: pkcs11-tool -O --login (every object and its attributes);
//   - listgroups: hactl hagroup listgroups through a haagent running the
//     group (its last comparison of the members), listgroups --check (the
//     members compared now), and the agent's RSS after them;
//   - create: one C_GenerateKey of an AES token key (mkkeys, 10 in one process), replicated to 3 members.
//
// docs/BENCHMARKS.md ("Many objects") has the figures.
//
//	go test -run '^$' -bench ManyObjects -benchtime 1x ./test/module -manyobjects 100,1000,10000
func BenchmarkManyObjects(b *testing.B) {
	var sizes []int
	for _, s := range strings.Split(*manyObjects, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			b.Fatalf("-manyobjects %q: want positive counts, comma-separated", *manyObjects)
		}
		sizes = append(sizes, n)
	}
	for _, n := range sizes {
		// Made under the parent: a sub-benchmark's temporary directory
		// carries its name, and SoftHSM's configuration takes no '=' in
		// a path.
		f := newManyFixture(b, n)
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			b.Run("op=first-signature", func(b *testing.B) {
				data := f.r.write("data", strings.Repeat("x", 32))
				sign := []string{"--login", "--pin", "env:HA_PIN", "--sign", "-m", "ECDSA", "--label", "sig", "-i", data, "-o", filepath.Join(f.r.dir, "sig")}
				f.ratio(b, sign, sign)
			})
			b.Run("op=softhsm-load", func(b *testing.B) {
				if *manyRemote {
					b.Skip("the members are loaded by their servers, not by the application")
				}
				// SoftHSM alone, no hagroup: C_Initialize reads every object
				// of every token in its directory, the members' three
				// against the bare token's one. The floor of a first
				// signature with in-process SoftHSM members.
				load := []string{"--module", testhsm.SoftHSMModule, "-L"}
				for b.Loop() {
					var group, bare []float64
					for range *manyRounds {
						group = append(group, f.timed(b, nil, load))
						bare = append(bare, f.timed(b, []string{"SOFTHSM2_CONF=" + f.bareConf}, load))
					}
					report(b, group, bare)
				}
			})
			b.Run("op=list", func(b *testing.B) {
				list := []string{"--login", "--pin", "env:HA_PIN", "-O"}
				f.ratio(b, list, list)
			})
			b.Run("op=listgroups", func(b *testing.B) {
				f.listgroups(b)
			})
			b.Run("op=create", func(b *testing.B) {
				mk := cprog(b, "mkkeys")
				for b.Loop() {
					var group, bare []float64
					for i := range *manyRounds {
						group = append(group, f.mkkeys(b, f.r.lib, virtualSlot, nil, fmt.Sprintf("g%d", i), mk))
						bare = append(bare, f.mkkeys(b, testhsm.SoftHSMModule, f.bareSlot, []string{"SOFTHSM2_CONF=" + f.bareConf}, fmt.Sprintf("b%d", i), mk))
					}
					report(b, group, bare)
				}
			})
		})
	}
}

// manyFixture is a rig whose 3 members hold n AES keys and the EC key
// pair "sig" (and the domain key), and a bare SoftHSM token, alone in its
// own token directory, holding the same objects.
type manyFixture struct {
	r        *rig
	bareConf string
	bareSlot string
	cpu      float64 // the last timed run's CPU in ms (the application's: pkcs11-tool and the module it loaded)
}

// newManyFixture fills member hsm-0 (hsmprep -fill, one key at a time) and
// copies its token to the other members and to the bare token, keeping
// each one's label and serial: filling four tokens would take four times
// as long, and the copies hold the very same objects.
func newManyFixture(b *testing.B, n int) *manyFixture {
	b.Helper()
	start := time.Now()
	r := newRig(b, rigOpts{ecKey: "sig,01", remote: *manyRemote, allRemote: *manyRemote})
	r.mustRun(time.Duration(n)*500*time.Millisecond+2*time.Minute, hsmprep(b),
		"-config", r.conf, "-group", groupLabel, "-user-pin-file", r.pinFile, "-fill", strconv.Itoa(n), "-member", "hsm-0")
	tokens := func(i int) string {
		if *manyRemote {
			return filepath.Join(filepath.Dir(r.remotes[i].Socket()), "tokens")
		}
		return filepath.Join(r.dir, "tokens")
	}
	src := tokenDirOf(b, tokens(0), "ha-0")
	for i, label := range []string{"ha-1", "ha-2"} {
		copyToken(b, src, tokenDirOf(b, tokens(i+1), label), "")
	}
	for _, s := range r.remotes {
		s.Restart(b) // its next child loads the token as copied
	}
	bareTokens := filepath.Join(r.dir, "bare-tokens")
	bareDir := filepath.Join(bareTokens, "b0f1c2a3-0000-4000-8000-000000000001")
	if err := os.MkdirAll(bareDir, 0o700); err != nil {
		b.Fatal(err)
	}
	copyToken(b, src, bareDir, "bare")
	// The recovery interval a deployment runs by (the rig's 1 s would
	// read the behind marks every second, a search of each member).
	conf, err := os.ReadFile(r.conf)
	if err != nil {
		b.Fatal(err)
	}
	r.write("hagroup.toml", strings.Replace(string(conf), "interval = \"1s\"\n", "", 1))
	f := &manyFixture{r: r, bareConf: r.write("bare-softhsm2.conf", "directories.tokendir = "+bareTokens+"\nobjectstore.backend = file\nlog.level = ERROR\nslots.removable = false\n")}
	out, err := r.run(time.Minute, []string{"SOFTHSM2_CONF=" + f.bareConf}, "pkcs11-tool", "--module", testhsm.SoftHSMModule, "-L")
	if err != nil {
		b.Fatalf("pkcs11-tool -L on the bare token: %v\n%s", err, out)
	}
	for _, s := range parseSlots(out) {
		if s.Label == "bare" {
			f.bareSlot = s.ID
		}
	}
	if f.bareSlot == "" {
		b.Fatalf("no bare token in\n%s", out)
	}
	b.Logf("fixture: %d keys on 3 members and a bare token in %v", n, time.Since(start).Round(time.Millisecond))
	return f
}

// SoftHSM 2.6's token.object starts with the token's label (32 bytes,
// attribute 0x80005349) and serial (16 bytes, 0x8000534a) at these offsets.
const (
	tokenLabelAt  = 0x20
	tokenSerialAt = 0x58
)

// tokenDirOf returns the directory of the SoftHSM token labelled label.
func tokenDirOf(b *testing.B, tokens, label string) string {
	b.Helper()
	dirs, err := os.ReadDir(tokens)
	if err != nil {
		b.Fatal(err)
	}
	for _, d := range dirs {
		obj, err := os.ReadFile(filepath.Join(tokens, d.Name(), "token.object"))
		if err != nil {
			continue
		}
		checkTokenObject(b, obj)
		if strings.TrimRight(string(obj[tokenLabelAt:tokenLabelAt+32]), " ") == label {
			return filepath.Join(tokens, d.Name())
		}
	}
	b.Fatalf("no SoftHSM token labelled %s in %s", label, tokens)
	return ""
}

func checkTokenObject(b *testing.B, obj []byte) {
	b.Helper()
	if len(obj) < tokenSerialAt+16 || !bytes.Equal(obj[0x0c:0x10], []byte{0x80, 0x00, 0x53, 0x49}) || !bytes.Equal(obj[0x44:0x48], []byte{0x80, 0x00, 0x53, 0x4a}) {
		b.Fatal("token.object is not laid out as SoftHSM 2.6 writes it (label, then serial)")
	}
}

// copyToken replaces dst's files with src's, keeping dst's label and serial
// (or, for a dst without a token.object, src's serial and label).
func copyToken(b *testing.B, src, dst, label string) {
	b.Helper()
	obj, err := os.ReadFile(filepath.Join(src, "token.object"))
	if err != nil {
		b.Fatal(err)
	}
	checkTokenObject(b, obj)
	if was, err := os.ReadFile(filepath.Join(dst, "token.object")); err == nil {
		checkTokenObject(b, was)
		copy(obj[tokenLabelAt:tokenLabelAt+32], was[tokenLabelAt:tokenLabelAt+32])
		copy(obj[tokenSerialAt:tokenSerialAt+16], was[tokenSerialAt:tokenSerialAt+16])
	} else {
		copy(obj[tokenLabelAt:tokenLabelAt+32], fmt.Sprintf("%-32s", label))
	}
	olds, _ := os.ReadDir(dst)
	for _, e := range olds {
		if err := os.Remove(filepath.Join(dst, e.Name())); err != nil {
			b.Fatal(err)
		}
	}
	files, err := os.ReadDir(src)
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range files {
		body := obj
		if e.Name() != "token.object" {
			if body, err = os.ReadFile(filepath.Join(src, e.Name())); err != nil {
				b.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), body, 0o600); err != nil {
			b.Fatal(err)
		}
	}
}

// ratio runs pkcs11-tool with args through the group and on the bare
// token, alternated, each in a fresh process; with -manybase, through
// the base build too, in the same rounds.
func (f *manyFixture) ratio(b *testing.B, groupArgs, bareArgs []string) {
	for b.Loop() {
		var group, base, bare, groupCPU, baseCPU, bareCPU []float64
		for range *manyRounds {
			if *manyBase != "" {
				base = append(base, f.timed(b, nil, append([]string{"--module", *manyBase, "--slot", virtualSlot}, groupArgs...)))
				baseCPU = append(baseCPU, f.cpu)
			}
			group = append(group, f.timed(b, nil, append([]string{"--module", f.r.lib, "--slot", virtualSlot}, groupArgs...)))
			groupCPU = append(groupCPU, f.cpu)
			bare = append(bare, f.timed(b, []string{"SOFTHSM2_CONF=" + f.bareConf}, append([]string{"--module", testhsm.SoftHSMModule, "--slot", f.bareSlot}, bareArgs...)))
			bareCPU = append(bareCPU, f.cpu)
		}
		report(b, group, bare)
		// The application's CPU beside its wall time: a gain bought with
		// the application's CPU is not one.
		b.ReportMetric(median(groupCPU), "group-app-cpu-ms")
		b.ReportMetric(median(bareCPU), "bare-app-cpu-ms")
		b.Logf("application CPU: group %v ms, bare %v ms", rounded(groupCPU), rounded(bareCPU))
		if *manyBase != "" {
			k := median(bare)
			b.ReportMetric(median(base), "base-group-ms")
			b.ReportMetric(median(base)/k, "base-ratio")
			b.ReportMetric(median(baseCPU), "base-app-cpu-ms")
			b.Logf("base %v ms, application CPU %v ms", rounded(base), rounded(baseCPU))
		}
	}
}

// timed runs pkcs11-tool and returns its wall time in ms (its CPU in f.cpu).
func (f *manyFixture) timed(b *testing.B, env, args []string) float64 {
	b.Helper()
	before := childCPU(b)
	start := time.Now()
	if out, err := f.r.run(10*time.Minute, env, "pkcs11-tool", args...); err != nil {
		b.Fatalf("pkcs11-tool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	wall := float64(time.Since(start)) / float64(time.Millisecond)
	f.cpu = float64(childCPU(b)-before) / float64(time.Millisecond)
	return wall
}

// childCPU is the user and system CPU of this process's reaped children:
// across one run of pkcs11-tool, that run's (the servers live on).
func childCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// mkkeys runs the mkkeys program (10 creations) and returns its median
// creation in ms.
func (f *manyFixture) mkkeys(b *testing.B, module, slotID string, env []string, prefix, prog string) float64 {
	b.Helper()
	out, err := f.r.run(10*time.Minute, env, prog, module, slotID, f.r.pinFile, "10", prefix)
	if err != nil {
		b.Fatalf("mkkeys on %s: %v\n%s", module, err, out)
	}
	var median, q1, q3, first, n float64
	if _, err := fmt.Sscanf(strings.TrimSpace(out), "create median_us=%g q1_us=%g q3_us=%g first_us=%g n=%g", &median, &q1, &q3, &first, &n); err != nil {
		b.Fatalf("mkkeys said %q: %v", out, err)
	}
	return median / 1000
}

// report gives the medians of both sides and their ratio.
func report(b *testing.B, group, bare []float64) {
	g, k := median(group), median(bare)
	b.ReportMetric(g, "group-ms")
	b.ReportMetric(k, "bare-ms")
	b.ReportMetric(g/k, "ratio")
	b.Logf("group %v ms, bare %v ms", rounded(group), rounded(bare))
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func rounded(xs []float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(int(x*10)) / 10
	}
	return out
}

// listgroups starts haagent on the fixture (each member with the user PIN
// file), waits until listgroups says the group is whole and in sync, then
// times -manyrounds listgroups, then as many listgroups --check, and
// reports the agent's RSS (VmRSS, and its peak VmHWM) after them. The members are in-process SoftHSM tokens, so
// the RSS holds SoftHSM's copy of every object too.
func (f *manyFixture) listgroups(b *testing.B) {
	r := f.r
	haagent := goBinary(b, "haagent", "./cmd/haagent")
	hactl := goBinary(b, "hactl", "./cmd/hactl")
	cfg, err := os.ReadFile(r.conf)
	if err != nil {
		b.Fatal(err)
	}
	noAgent := fmt.Sprintf("socket = %q\n", filepath.Join(r.dir, "no-agent.sock"))
	sock := filepath.Join(r.dir, "agent.sock")
	conf := strings.Replace(string(cfg), noAgent, fmt.Sprintf("socket = %q\n", sock), 1)
	conf = strings.ReplaceAll(conf, "  token_label = ", fmt.Sprintf("  pin_file = %q\n  token_label = ", r.pinFile))
	agentConf := r.write("agent.toml", conf)
	ctx, cancel := context.WithTimeout(b.Context(), 30*time.Minute)
	defer cancel()
	ag := exec.CommandContext(ctx, haagent, "--config", agentConf)
	ag.Env, ag.Dir = r.env, r.dir
	agErr := &lockedBuffer{}
	ag.Stderr = agErr
	if err := ag.Start(); err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- ag.Wait() }()
	defer func() {
		ag.Process.Signal(syscall.SIGTERM)
		<-done
	}()
	list := func(flags ...string) (string, error) {
		return r.run(10*time.Minute, nil, hactl, append([]string{"--config", agentConf, "hagroup", "listgroups"}, flags...)...)
	}
	deadline := time.Now().Add(10 * time.Minute)
	for {
		out, err := list()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("listgroups never said the group is whole and in sync: %v\n%s\nhaagent: %s", err, out, agErr.String())
		}
		time.Sleep(time.Second) // polling the agent, bounded by the deadline
	}
	for b.Loop() {
		for _, v := range []struct {
			unit  string
			flags []string
		}{{"listgroups-ms", nil}, {"listgroups-check-ms", []string{"--check"}}} {
			var ms []float64
			for range *manyRounds {
				start := time.Now()
				if out, err := list(v.flags...); err != nil {
					b.Fatalf("listgroups %v: %v\n%s", v.flags, err, out)
				}
				ms = append(ms, float64(time.Since(start))/float64(time.Millisecond))
			}
			b.ReportMetric(median(ms), v.unit)
			b.Logf("%s %v", v.unit, rounded(ms))
		}
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", ag.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		for _, k := range []string{"VmRSS", "VmHWM"} {
			if v, ok := strings.CutPrefix(line, k+":"); ok {
				kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
				if err != nil {
					b.Fatalf("%s: %v", line, err)
				}
				b.ReportMetric(float64(kb)/1024, "agent-"+k+"-MiB")
			}
		}
	}
}
