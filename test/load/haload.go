package load

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// BuildHaload compiles test/load/c/haload.c under repo (the source tree:
// the C headers come from cmd/hapkcs11 and test/module/c) into out.
func BuildHaload(ctx context.Context, repo, out string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "gcc", "-Wall", "-Werror", "-O2",
		"-I", filepath.Join(repo, "cmd", "hapkcs11"), "-I", filepath.Join(repo, "test", "module", "c"),
		"-o", out, filepath.Join(repo, "test", "load", "c", "haload.c"), "-ldl", "-lpthread")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("gcc haload.c: %v\n%s", err, b)
	}
	return nil
}

// LoadOptions configure one haload run.
type LoadOptions struct {
	Prog    string // the built haload
	Module  string // libhapkcs11.so
	Slot    uint   // virtual slot ID
	PINFile string
	Key     string // EC key label
	Threads int
	Mixed   bool
	SigFile string        // every signature, for VerifySignatures; "" for none
	Tick    time.Duration // tick interval (default 100ms)
	AESKey  string        // AES key label for the round trips (mixed)
	Keypair bool          // mixed: create EC key pairs, not data objects
	Prefix  string        // label prefix of created objects
	Seed    uint64
	// LockFile, when set, is flock(2)ed around every object creation and
	// destruction (see haload.c).
	LockFile string
	// Rate, when positive, is the operations per second the threads offer
	// together on a fixed schedule (haload -R); 0 runs them flat out.
	Rate int
	Env  []string // environment (HAGROUP_CONF, HAGROUP_STATS_FILE …)
	Dir  string
}

// Tick is one tick of a run: what finished in it.
type Tick struct {
	At     time.Time
	OK     int
	Failed int
	MaxLat time.Duration
}

// Load is a running haload.
type Load struct {
	proc  *Proc
	stdin *os.File
	lines chan string
	ready chan struct{}

	mu        sync.Mutex
	ticks     []Tick
	total     int
	failed    int
	other     []string // lines other than ticks and object events, in order
	created   []string
	destroyed []string
	createErr map[string]string
	destErr   map[string]string
	onLine    func(string)
	readDone  chan struct{}
}

// StartLoad starts haload and waits (up to a minute, or ctx) until every
// thread has its session. onLine, when not nil, sees every line as it comes
// (ticks included).
func StartLoad(ctx context.Context, reg *Registry, o LoadOptions, onLine func(string)) (*Load, error) {
	args := []string{"-m", o.Module, "-s", fmt.Sprintf("%#x", o.Slot), "-p", o.PINFile, "-k", o.Key,
		"-t", strconv.Itoa(max(o.Threads, 1))}
	if o.Mixed {
		args = append(args, "-x", "mixed")
	}
	if o.SigFile != "" {
		args = append(args, "-o", o.SigFile)
	}
	if o.Tick > 0 {
		args = append(args, "-i", strconv.FormatInt(o.Tick.Milliseconds(), 10))
	}
	if o.AESKey != "" {
		args = append(args, "-a", o.AESKey)
	}
	if o.Keypair {
		args = append(args, "-c", "keypair")
	}
	if o.Prefix != "" {
		args = append(args, "-n", o.Prefix)
	}
	if o.LockFile != "" {
		args = append(args, "-l", o.LockFile)
	}
	if o.Rate > 0 {
		args = append(args, "-R", strconv.Itoa(o.Rate))
	}
	args = append(args, "-r", strconv.FormatUint(o.Seed, 10))
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	p, err := reg.Start(Spec{Name: "haload", Path: o.Prog, Args: args, Env: o.Env, Dir: o.Dir, Stdin: inR, Output: outW})
	inR.Close()
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, err
	}
	l := &Load{proc: p, stdin: inW, lines: make(chan string, 64), ready: make(chan struct{}),
		createErr: map[string]string{}, destErr: map[string]string{}, onLine: onLine, readDone: make(chan struct{})}
	go l.read(outR)
	select {
	case <-l.ready:
		return l, nil
	case <-l.readDone:
		_ = p.Kill()
		return nil, fmt.Errorf("haload ended before it was ready: %s", strings.Join(l.Other(), "\n"))
	case <-ctx.Done():
		_ = p.Kill()
		return nil, fmt.Errorf("haload not ready: %w (output: %s)", ctx.Err(), strings.Join(l.Other(), "\n"))
	case <-time.After(time.Minute):
		_ = p.Kill()
		return nil, fmt.Errorf("haload not ready within a minute (output: %s)", strings.Join(l.Other(), "\n"))
	}
}

func (l *Load) read(r *os.File) {
	defer close(l.readDone)
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	readyDone := false
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		l.mu.Lock()
		switch {
		case line == "ready" && !readyDone:
			readyDone = true
			close(l.ready)
		case len(f) == 5 && f[0] == "tick":
			ms, _ := strconv.ParseInt(f[1], 10, 64)
			ok, _ := strconv.Atoi(f[2])
			failed, _ := strconv.Atoi(f[3])
			lat, _ := strconv.ParseInt(f[4], 10, 64)
			l.ticks = append(l.ticks, Tick{At: time.UnixMilli(ms), OK: ok, Failed: failed, MaxLat: time.Duration(lat) * time.Microsecond})
			l.total += ok
			l.failed += failed
		case len(f) == 2 && f[0] == "created":
			l.created = append(l.created, f[1])
		case len(f) == 2 && f[0] == "destroyed":
			l.destroyed = append(l.destroyed, f[1])
		case len(f) == 3 && f[0] == "createfail":
			l.createErr[f[1]] = f[2]
		case len(f) == 3 && f[0] == "destroyfail":
			l.destErr[f[1]] = f[2]
		case len(f) > 0 && f[0] == "hist":
			// A life-cycle call's history line: for onLine (the soak's
			// history checker) only.
		default:
			l.other = append(l.other, line)
		}
		on := l.onLine
		l.mu.Unlock()
		if on != nil {
			on(line)
		}
	}
}

// Progress returns the operations finished so far, and how many failed.
func (l *Load) Progress() (ok, failed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total, l.failed
}

// Other returns the output lines that are not ticks or object events.
func (l *Load) Other() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.other...)
}

// PID is haload's process ID.
func (l *Load) PID() int { return l.proc.PID() }

// Result is what a finished run reports.
type Result struct {
	Ops, Failed, Bad int
	Reopens          int               // sessions a thread opened again after losing its own
	PerOp            map[string][2]int // name → {ok, failed}
	MaxLat           time.Duration
	MaxLatAt         time.Time
	Pub              []byte   // CKA_EC_POINT of the signing key
	Errors           []string // "error …" and "bad …" lines
	Ticks            []Tick
	Created          []string          // objects whose creation returned CKR_OK
	Destroyed        []string          // objects whose destruction returned CKR_OK
	CreateFailed     map[string]string // label → rv
	DestroyFailed    map[string]string
}

// Stop closes haload's input, waits (with ctx) for it to finish and parses
// its report.
func (l *Load) Stop(ctx context.Context) (*Result, error) {
	l.stdin.Close()
	err := l.proc.Wait(ctx)
	select {
	case <-l.readDone:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, fmt.Errorf("haload: %v: %s", err, strings.Join(l.Other(), "\n"))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r := &Result{PerOp: map[string][2]int{}, Ticks: append([]Tick(nil), l.ticks...),
		Created: l.created, Destroyed: l.destroyed, CreateFailed: l.createErr, DestroyFailed: l.destErr}
	gotTotal := false
	for _, line := range l.other {
		f := strings.Fields(line)
		switch {
		case len(f) == 0:
		case f[0] == "error" || f[0] == "bad":
			r.Errors = append(r.Errors, line)
		case f[0] == "reopens" && len(f) == 2:
			r.Reopens, _ = strconv.Atoi(f[1])
		case f[0] == "pub" && len(f) == 2:
			r.Pub, _ = hex.DecodeString(f[1])
		case f[0] == "op" && len(f) == 4:
			var ok, failed int
			fmt.Sscanf(f[2], "ok=%d", &ok)
			fmt.Sscanf(f[3], "failed=%d", &failed)
			r.PerOp[f[1]] = [2]int{ok, failed}
		case f[0] == "total":
			var lat, at int64
			if _, err := fmt.Sscanf(line, "total ops=%d failed=%d bad=%d maxlat_us=%d at_ms=%d",
				&r.Ops, &r.Failed, &r.Bad, &lat, &at); err != nil {
				return nil, fmt.Errorf("haload's total line %q: %w", line, err)
			}
			r.MaxLat = time.Duration(lat) * time.Microsecond
			r.MaxLatAt = time.UnixMilli(at)
			gotTotal = true
		}
	}
	if !gotTotal {
		return nil, fmt.Errorf("haload printed no totals: %s", strings.Join(l.other, "\n"))
	}
	return r, nil
}
