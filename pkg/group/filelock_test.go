package group

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
)

// TestLockedSoftHSMMemberIsAbandoned: SoftHSM, in process, waits for
// another process's POSIX lock on its token files for as long as that
// process holds it (a stopped pkcs11-tool, a paused VM sharing the token
// directory): a key generation on it writes those files. Under the default
// dispatch the group abandons that call at its deadline, fails the member
// over and the generation succeeds on the others, as for a hung network
// HSM; this is why SoftHSM is not run inline by default (docs/DESIGN.md,
// "Dispatch: the default for every make").
func TestLockedSoftHSMMemberIsAbandoned(t *testing.T) {
	const deadline = 1500 * time.Millisecond
	f := setup(t, setupOpts{timeout: deadline, keygen: deadline})
	victim := f.toks[1]
	release := lockFiles(t, tokenDir(t, victim.Serial))
	s := openSession(t, f.g)
	start := time.Now()
	pub, _ := genEC(t, s, "after-lock")
	took := time.Since(start)
	// The generation: the deadline once on the victim (first or as a
	// copy's target), then the others; far below the lock's hold, which
	// lasts until the test ends.
	if limit := 3*deadline + stallMargin; took > limit {
		t.Errorf("generation with a locked member took %v, want ≤ %v", took, limit)
	}
	if st := memberState(f.g, victim.Name); st != member.Failed {
		t.Errorf("locked member is %v, want failed", st)
	}
	timedOut := false
	for _, e := range f.events.all() {
		if e.Kind == MemberFailed && e.Member == victim.Name && errors.Is(e.Err, slot.ErrTimeout) {
			timedOut = true
		}
	}
	if !timedOut {
		t.Errorf("no MemberFailed event for %s caused by a timeout: no call waited on the lock", victim.Name)
	}
	// The abandoned call still waits inside SoftHSM, and holds what SoftHSM
	// locks for every token of the process while it does: the others are
	// read directly once the lock is gone.
	release()
	for _, tok := range f.toks {
		if tok.Name == victim.Name {
			continue
		}
		if n := len(findDirect(t, openDirect(t, tok), "after-lock")); n != 2 {
			t.Errorf("member %s holds %d objects labelled after-lock, want the pair", tok.Name, n)
		}
	}
	if pub == 0 {
		t.Error("no public key handle")
	}
}

// tokenDir returns the directory of the in-process SoftHSM token with this
// serial: SoftHSM names it by a UUID whose last 16 hex digits are the serial.
func tokenDir(t *testing.T, serial string) string {
	t.Helper()
	conf, err := os.ReadFile(os.Getenv("SOFTHSM2_CONF"))
	if err != nil {
		t.Fatal(err)
	}
	var root string
	for _, line := range strings.Split(string(conf), "\n") {
		if v, ok := strings.CutPrefix(line, "directories.tokendir = "); ok {
			root = strings.TrimSpace(v)
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(root, "*"))
	for _, d := range dirs {
		if strings.HasSuffix(strings.ReplaceAll(filepath.Base(d), "-", ""), strings.ToLower(serial)) {
			return d
		}
	}
	t.Fatalf("no token directory under %q for serial %s", root, serial)
	return ""
}

// lockFiles has another process take a POSIX write lock on every file in
// dir and hold them until release (or the test's end); it returns once
// they are held.
func lockFiles(t *testing.T, dir string) (release func()) {
	t.Helper()
	const script = `import fcntl, glob, sys
held = [open(p, "r+") for p in glob.glob(sys.argv[1] + "/*")]
for f in held:
    fcntl.lockf(f, fcntl.LOCK_EX)
print(len(held), flush=True)
sys.stdin.read()
`
	cmd := exec.Command("python3", "-c", script, dir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { stdin.Close(); cmd.Wait() }) }
	t.Cleanup(release)
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.TrimSpace(line) == "0" {
		t.Fatalf("the locking process held no file of %s: %q %v", dir, line, err)
	}
	return release
}
