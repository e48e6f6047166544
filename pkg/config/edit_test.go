package config

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Child processes: the test binary re-executed with childEnv set runs one
// of these instead of the tests.
const (
	childEnv  = "HAGROUP_CONFIG_TEST_CHILD"
	childPath = "HAGROUP_CONFIG_TEST_PATH"
	childName = "HAGROUP_CONFIG_TEST_NAME"
)

func runChild(kind string) int {
	path, name := os.Getenv(childPath), os.Getenv(childName)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	switch kind {
	case "edit":
		// Wait at the gate so that all editors start together.
		if _, err := os.Stdin.Read(make([]byte, 1)); err != nil {
			fmt.Fprintln(os.Stderr, "gate:", err)
			return 1
		}
		if err := Edit(ctx, path, addMember(name)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	case "crash":
		// Stop between the complete temporary file and the rename, tell
		// the parent where the temporary file is, and wait to be killed.
		e := editor{w: atomicWriter{beforeRename: func(tmp string) {
			fmt.Println(tmp)
			io.Copy(io.Discard, os.Stdin)
			os.Exit(3) // only if the parent closed stdin instead of killing
		}}}
		if err := e.edit(ctx, path, addMember(name)); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		return 1
	case "readpin":
		_, err := Member{Name: name, PINFile: path}.ReadPIN()
		fmt.Print(err)
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown child", kind)
	return 2
}

// addMember returns an edit that appends member name to group "g".
func addMember(name string) func(*Config) error {
	return func(c *Config) error {
		g, ok := c.Group("g")
		if !ok {
			return errors.New("no group g")
		}
		g.Members = append(g.Members, Member{Name: name, Module: "/m.so", TokenLabel: "tok-" + name})
		return nil
	}
}

// seed writes a valid file with group "g" and one member, and returns its
// content.
func seed(t *testing.T, path string) []byte {
	t.Helper()
	err := Edit(t.Context(), path, func(c *Config) error {
		c.Groups = []Group{{Label: "g", Serial: c.NextSerial(), Members: []Member{{Name: "seed", Module: "/m.so", TokenLabel: "tok-seed"}}}}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func memberNames(t *testing.T, path string) []string {
	t.Helper()
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	g, ok := c.Group("g")
	if !ok {
		t.Fatal("group g is gone")
	}
	var names []string
	for _, m := range g.Members {
		names = append(names, m.Name)
	}
	slices.Sort(names)
	return names
}

// noTemps fails if a temporary file of path is left in its directory.
func noTemps(t *testing.T, path string) {
	t.Helper()
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tempPrefix(path)) {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}

func wantNames(n int, prefix string) []string {
	names := []string{"seed"}
	for i := range n {
		names = append(names, fmt.Sprintf("%s%02d", prefix, i))
	}
	slices.Sort(names)
	return names
}

const editors = 20

func TestEditConcurrentGoroutines(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "hagroup.toml")
	seed(t, path)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	start := make(chan struct{})
	errs := make(chan error, editors)
	var wg sync.WaitGroup
	for i := range editors {
		wg.Go(func() {
			<-start
			errs <- Edit(ctx, path, addMember(fmt.Sprintf("g%02d", i)))
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if got, want := memberNames(t, path), wantNames(editors, "g"); !slices.Equal(got, want) {
		t.Errorf("members after %d concurrent edits:\n got %v\nwant %v", editors, got, want)
	}
	noTemps(t, path)
}

func TestEditConcurrentProcesses(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "hagroup.toml")
	seed(t, path)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	type child struct {
		cmd   *exec.Cmd
		gate  io.WriteCloser
		out   strings.Builder
		name  string
		start error
	}
	children := make([]*child, editors)
	for i := range children {
		ch := &child{name: fmt.Sprintf("p%02d", i)}
		ch.cmd = exec.CommandContext(ctx, os.Args[0])
		ch.cmd.Env = append(os.Environ(), childEnv+"=edit", childPath+"="+path, childName+"="+ch.name)
		ch.cmd.Stdout, ch.cmd.Stderr = &ch.out, &ch.out
		var err error
		if ch.gate, err = ch.cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		if err := ch.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		children[i] = ch
	}
	// Open the gate for all at once.
	for _, ch := range children {
		ch.gate.Write([]byte{1})
		ch.gate.Close()
	}
	for _, ch := range children {
		if err := ch.cmd.Wait(); err != nil {
			t.Errorf("editor %s: %v: %s", ch.name, err, ch.out.String())
		}
	}
	if got, want := memberNames(t, path), wantNames(editors, "p"); !slices.Equal(got, want) {
		t.Errorf("members after %d concurrent editing processes:\n got %v\nwant %v", editors, got, want)
	}
	noTemps(t, path)
}

// A writer killed after writing its temporary file and before renaming it
// leaves the old file whole; the next Edit clears the leftover.
func TestEditCrashBeforeRename(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "hagroup.toml")
	old := seed(t, path)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()

	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"=crash", childPath+"="+path, childName+"=crashed")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The child prints the temporary file's name when it reaches the
	// point before the rename; ctx bounds the wait (it kills the child).
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("child did not reach the rename: %v", err)
	}
	tmp := strings.TrimSpace(line)
	newData, err := os.ReadFile(tmp)
	if err != nil || !strings.Contains(string(newData), `name = "crashed"`) {
		t.Fatalf("temporary file %s before the rename: %q, %v", tmp, newData, err)
	}

	// While the child holds the lock, another editor waits no longer than
	// its context allows.
	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	err = Edit(short, path, addMember("blocked"))
	cancelShort()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Edit while locked = %v, want a deadline error", err)
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil {
		t.Fatal("child exited cleanly instead of being killed")
	}

	// The old file is intact and loads; the leftover does not matter to it.
	now, err := os.ReadFile(path)
	if err != nil || string(now) != string(old) {
		t.Fatalf("file after the crash:\n%s\nwant the old content:\n%s", now, old)
	}
	if got := memberNames(t, path); !slices.Equal(got, []string{"seed"}) {
		t.Errorf("members after the crash = %v", got)
	}
	if _, err := os.Stat(tmp); err != nil {
		t.Errorf("the killed writer's temporary file should still be there: %v", err)
	}

	// The lock died with the child, and the next Edit removes the leftover.
	if err := Edit(ctx, path, addMember("after")); err != nil {
		t.Fatal(err)
	}
	if got := memberNames(t, path); !slices.Equal(got, []string{"after", "seed"}) {
		t.Errorf("members after the next edit = %v", got)
	}
	noTemps(t, path)
}

func TestEditLeavesFileAloneOnFailure(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "hagroup.toml")
	old := seed(t, path)
	unchanged := func(what string) {
		t.Helper()
		if now, _ := os.ReadFile(path); string(now) != string(old) {
			t.Errorf("%s changed the file:\n%s", what, now)
		}
		noTemps(t, path)
	}

	boom := errors.New("boom")
	if err := Edit(t.Context(), path, func(c *Config) error {
		c.Groups = nil
		return boom
	}); !errors.Is(err, boom) {
		t.Errorf("fn error: got %v", err)
	}
	unchanged("a failing fn")

	err := Edit(t.Context(), path, func(c *Config) error {
		g, _ := c.Group("g")
		g.Members = append(g.Members, Member{Name: "seed", Module: "/m.so", TokenLabel: "x"})
		return nil
	})
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Key != "name" || fe.Member != "seed" || fe.Line != 0 {
		t.Errorf("invalid change: got %v (%+v)", err, fe)
	}
	unchanged("an invalid change")

	// A hand-broken file is not edited over.
	broken := []byte("[ha]\npolicy = \"nope\"\n")
	if err := os.WriteFile(path, broken, 0o600); err != nil {
		t.Fatal(err)
	}
	err = Edit(t.Context(), path, func(*Config) error { return nil })
	if err == nil || !strings.Contains(err.Error(), path+":2: ha.policy") {
		t.Errorf("edit of an invalid file: %v", err)
	}
	if now, _ := os.ReadFile(path); string(now) != string(broken) {
		t.Errorf("edit of an invalid file rewrote it:\n%s", now)
	}
}

func TestEditCreatesAndKeepsMode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "new.toml")
	seed(t, path)
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("new file mode = %v, %v; want 0600", st.Mode(), err)
	}
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := Edit(t.Context(), path, addMember("m")); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o640 {
		t.Errorf("mode after edit = %v, want 0640 kept", st.Mode())
	}
	if _, err := os.Stat(path + ".lock"); err != nil {
		t.Errorf("lock file: %v", err)
	}
	// Through a symbolic link, the target is replaced and the link stays.
	link := filepath.Join(dir, "link.toml")
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	if err := Edit(t.Context(), link, addMember("via-link")); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the link was replaced: %v %v", fi.Mode(), err)
	}
	if got := memberNames(t, path); !slices.Contains(got, "via-link") {
		t.Errorf("target members = %v", got)
	}
}

// TestEditKeepsOwner: root editing a file the agent's group may read
// (root:hagroup 0640, as the .deb installs it) keeps its owner and group,
// or the agent could no longer read its configuration.
func TestEditKeepsOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give the file another owner")
	}
	t.Parallel()
	path := filepath.Join(t.TempDir(), "hagroup.toml")
	seed(t, path)
	const uid, gid = 65534, 65534
	if err := os.Chown(path, uid, gid); err != nil {
		t.Fatal(err)
	}
	if err := Edit(t.Context(), path, addMember("m")); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if sys := st.Sys().(*syscall.Stat_t); sys.Uid != uid || sys.Gid != gid {
		t.Errorf("owner after edit = %d:%d, want %d:%d kept", sys.Uid, sys.Gid, uid, gid)
	}
}

func TestEditWaitsForLock(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "hagroup.toml")
	seed(t, path)
	unlock, _, err := lockFile(t.Context(), path+".lock")
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	err = Edit(short, path, addMember("early"))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Edit under a held lock = %v, want a deadline error", err)
	}
	// An editor already waiting proceeds as soon as the lock is released.
	done := make(chan error, 1)
	go func() { done <- Edit(t.Context(), path, addMember("waiter")) }()
	unlock()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiting editor did not proceed after the lock was released")
	}
	if got := memberNames(t, path); !slices.Equal(got, []string{"seed", "waiter"}) {
		t.Errorf("members = %v", got)
	}
}

// TestEditFailedFirstEditLeavesNothing: an edit that fails where there
// was no file leaves neither the file nor its lock file (a failed
// creategroup left x.toml.lock behind).
func TestEditFailedFirstEditLeavesNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "new.toml")
	boom := errors.New("boom")
	if err := Edit(t.Context(), path, func(*Config) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Edit = %v, want boom", err)
	}
	if err := Edit(t.Context(), path, func(c *Config) error {
		c.Groups = append(c.Groups, Group{Label: "g"}) // no member: invalid
		return nil
	}); err == nil {
		t.Fatal("an invalid first edit succeeded")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("failed first edits left %v", entries)
	}
	// An existing file keeps its lock file whatever happens.
	seed(t, path)
	Edit(t.Context(), path, func(*Config) error { return boom })
	if _, err := os.Stat(path + ".lock"); err != nil {
		t.Errorf("lock file of an existing config: %v", err)
	}
}

// openCount is how many descriptors of this process are open on path.
func openCount(t *testing.T, path string) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil && strings.TrimSuffix(target, " (deleted)") == path {
			n++
		}
	}
	return n
}

// TestEditLockRemovedUnderWaiter: an editor waiting on a lock file that
// its holder removes (a failed first edit) does not go ahead on the
// removed file while another editor holds the new one.
func TestEditLockRemovedUnderWaiter(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "hagroup.toml")
	seed(t, path)
	lock := path + ".lock"
	unlockOld, _, err := lockFile(t.Context(), lock)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- Edit(t.Context(), path, addMember("waiter")) }()
	// The waiter has the old lock file open (and waits on it).
	deadline := time.Now().Add(10 * time.Second)
	for openCount(t, lock) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the waiting editor never opened the lock file")
		}
		time.Sleep(time.Millisecond)
	}
	// The old file is removed and a new editor locks a new one before
	// the old lock is let go: the waiter then holds a lock on a file
	// that is no longer the lock file.
	if err := os.Remove(lock); err != nil {
		t.Fatal(err)
	}
	unlockNew, _, err := lockFile(t.Context(), lock)
	if err != nil {
		t.Fatal(err)
	}
	unlockOld()
	select {
	case err := <-done:
		t.Fatalf("the waiter went ahead on the removed lock file (err %v) while the new one was held", err)
	case <-time.After(300 * time.Millisecond):
	}
	unlockNew()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not go ahead once the new lock was released")
	}
	if got := memberNames(t, path); !slices.Contains(got, "waiter") {
		t.Errorf("members = %v", got)
	}
}

func TestWriteFileAtomic(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "state")
	if err := WriteFileAtomic(path, []byte("one"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "one" {
		t.Errorf("content = %q", b)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o644 {
		t.Errorf("mode = %v", st.Mode())
	}

	// A rename that fails leaves the old file and no temporary file.
	w := atomicWriter{beforeRename: func(string) {
		os.Remove(path)
		os.MkdirAll(filepath.Join(path, "sub"), 0o700)
	}}
	if err := w.write(path, []byte("two"), 0o600); err == nil {
		t.Error("write over a non-empty directory succeeded")
	}
	noTemps(t, path)

	if err := WriteFileAtomic(dir, []byte("x"), 0o600); err == nil {
		t.Error("WriteFileAtomic over a directory succeeded")
	}
	if err := WriteFileAtomic(filepath.Join(dir, "no", "such"), []byte("x"), 0o600); err == nil {
		t.Error("WriteFileAtomic into a missing directory succeeded")
	}
}

// An edit keeps the comments of a hand-written file above, and after, the
// header or key they belonged to, wherever that lands; a removed member's
// comments go with it.
func TestEditKeepsComments(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hagroup.toml")
	in := `# hagroup.toml — written by hand
#
# (a gap above is kept)

# --- the agent ---
[agent] # agent, trailing
# the socket
socket = "/run/x.sock" # socket, trailing

[[group]]
serial = "1000001" # before the label
# the label
label = "g"

  # member a: the primary
  [[group.member]]
  name = "a"
  module = "/m.so"
  token_label = "tok-a" # a's token

  # member b: to be removed
  [[group.member]]
  name = "b"
  # b's module
  module = "/m.so"
  token_label = "tok-b"

# the end
`
	if err := os.WriteFile(path, []byte(in), 0o600); err != nil {
		t.Fatal(err)
	}
	err := Edit(t.Context(), path, func(c *Config) error {
		g, _ := c.Group("g")
		g.Members = []Member{{Name: "c", Module: "/m.so", TokenLabel: "tok-c"}, g.Members[0]}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := `# hagroup.toml — written by hand
#
# (a gap above is kept)

# --- the agent ---
[agent] # agent, trailing
# the socket
socket = "/run/x.sock" # socket, trailing

[[group]]
# the label
label = "g"
serial = "1000001" # before the label

  [[group.member]]
  name = "c"
  module = "/m.so"
  token_label = "tok-c"

  # member a: the primary
  [[group.member]]
  name = "a"
  module = "/m.so"
  token_label = "tok-a" # a's token

# the end
`
	if string(got) != want {
		t.Fatalf("after the edit:\n%s\nwant:\n%s", got, want)
	}
	if _, err := Load(path); err != nil {
		t.Fatalf("the edited file does not load: %v", err)
	}
}
