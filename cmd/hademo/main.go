// Command hademo tells hagroup's story on one machine, with no input, in
// under two minutes (`make demo`): three SoftHSM tokens, each served by its
// own server process (hsmserve, hagroup's token server) so that a member
// can really die; an HA group
// of them (one a standby) configured with hactl; the group's domain key;
// haagent; a signing key made through libhapkcs11.so and shown on every
// member; a signing load through the module while the primary member's
// server is killed and restarted; then a summary and demo-out/failover.svg,
// the operations per second of each member over time with the kill and the
// recovery marked.
//
// The load offers a fixed rate (-rate), below what one member serves
// alone, so the total stays flat through the kill and only the split
// between the members moves. Run flat out (-rate 0), the total is what
// this machine's CPUs allow: the member servers share them, so with one
// server dead the survivor gets more CPU and the total rises, which is
// the machine's doing, not HA's; the picture then says so.
//
// Everything it starts it stops, on success, failure or Ctrl-C (each child
// runs in its own process group and dies with hademo). It cleans its output
// directory first, so it can run again at once.
//
//	hademo [-out demo-out] [-bin DIR] [-src DIR] [-threads 4] [-rate 1500] [-phase 6s]
//
// Exit status: 0 when the story held (no failed operation, every signature
// verified, the member back in rotation, the group in sync), 1 otherwise.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/hagroup/hagroup/pkg/slot"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/hagroup/hagroup/test/load"
)

func main() {
	load.InitTokensMain() // the re-executed child that initialises tokens
	os.Exit(run())
}

// options are hademo's flags.
type options struct {
	out     string
	bin     string
	src     string
	threads int
	rate    int // signatures per second offered; 0: flat out
	phase   time.Duration
	quiet   bool
}

func run() int {
	slot.OwnEnvironment() // a hagroup program: members' module_env may be written (pkg/slot)
	var o options
	flag.StringVar(&o.out, "out", "demo-out", "output directory (removed and made anew)")
	flag.StringVar(&o.bin, "bin", "", "directory holding hactl, haagent and libhapkcs11.so (default: hademo's own)")
	flag.StringVar(&o.src, "src", "", "source tree, for the C load generator (default: found from the working directory)")
	flag.IntVar(&o.threads, "threads", 4, "signing threads")
	flag.IntVar(&o.rate, "rate", defaultRate, "signatures per second the load offers on a fixed schedule, below what one member serves alone (0: as fast as the members answer, which this machine's CPUs limit)")
	flag.DurationVar(&o.phase, "phase", 6*time.Second, "load before the kill, while the member is down, and after it is back")
	flag.BoolVar(&o.quiet, "quiet", false, "no progress line")
	flag.Parse()
	if flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "hademo: no arguments expected")
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	d, err := newDemo(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "hademo:", err)
		return 1
	}
	start := time.Now()
	err = d.run(ctx)
	n, cerr := d.cleanup()
	if n > 0 {
		d.say("stopped %d process(es) hademo started", n)
	}
	if cerr != nil {
		fmt.Fprintln(os.Stderr, "hademo: cleanup:", cerr)
	}
	switch {
	case ctx.Err() != nil:
		fmt.Fprintln(os.Stderr, "hademo: interrupted; everything it started is stopped")
		return 1
	case err != nil:
		fmt.Fprintln(os.Stderr, "hademo:", err)
		return 1
	}
	d.say("demo finished in %.0f s", time.Since(start).Seconds())
	return 0
}

// newDemo resolves the paths and makes a clean output directory.
func newDemo(o options) (*demo, error) {
	var err error
	if o.bin == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		o.bin = filepath.Dir(exe)
	}
	if o.bin, err = filepath.Abs(o.bin); err != nil {
		return nil, err
	}
	need := []string{"hactl", "haagent", "libhapkcs11.so", "hsmserve"}
	for _, f := range need {
		if _, err := os.Stat(filepath.Join(o.bin, f)); err != nil {
			return nil, fmt.Errorf("%s not built (run make build): %w", f, err)
		}
	}
	if o.src == "" {
		if o.src, err = findSource(); err != nil {
			return nil, err
		}
	}
	if o.out, err = filepath.Abs(o.out); err != nil {
		return nil, err
	}
	if err := os.RemoveAll(o.out); err != nil {
		return nil, fmt.Errorf("clean %s: %w", o.out, err)
	}
	if err := os.MkdirAll(o.out, 0o700); err != nil {
		return nil, err
	}
	if o.threads < 1 || o.threads > 64 {
		return nil, errors.New("-threads must be 1 to 64")
	}
	if o.rate < 0 {
		return nil, errors.New("-rate must be 0 (flat out) or a positive rate")
	}
	cwd, _ := os.Getwd()
	return &demo{o: o, reg: load.NewRegistry(), w: os.Stdout, cwd: cwd}, nil
}

// findSource walks up from the working directory to the source tree.
func findSource() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "test", "load", "c", "haload.c")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the source tree (test/load/c/haload.c) above the working directory: pass -src")
		}
		dir = parent
	}
}
