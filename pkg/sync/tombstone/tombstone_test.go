package tombstone

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
	"golang.org/x/sys/unix"
)

// The test binary re-executes itself as a second writer process.
const (
	envHelper = "TOMBSTONE_TEST_HELPER"
	envDir    = "TOMBSTONE_TEST_DIR"
	envCount  = "TOMBSTONE_TEST_COUNT"
	envWho    = "TOMBSTONE_TEST_WHO"
)

func TestMain(m *testing.M) {
	if os.Getenv(envHelper) == "writer" {
		os.Exit(helperWriter())
	}
	os.Exit(testhsm.Main(m, 24))
}

// helperWriter records envCount tombstones labelled "<who>-<i>" into the
// journal in envDir, compacting now and then, and exits non-zero on any
// error.
func helperWriter() int {
	n, _ := strconv.Atoi(os.Getenv(envCount))
	who := os.Getenv(envWho)
	j, err := Open(os.Getenv(envDir), "1000001", Options{CompactBytes: 2048})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer j.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range n {
		if err := j.Record(ctx, tomb(fmt.Sprintf("%s-%d", who, i), []byte{byte(i), 1})); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if i%25 == 0 {
			if _, err := j.Compact(ctx); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
	}
	return 0
}

func ident(label string) object.Identity {
	return object.Identity{Class: pkcs11.CKO_PRIVATE_KEY, KeyType: pkcs11.CKK_EC, ID: []byte("id-" + label), Label: label}
}

func tomb(label string, fp []byte) Tombstone {
	return Tombstone{Identity: ident(label), Fingerprint: fp}
}

// clock is a settable test clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

func openT(t *testing.T, dir string, opts Options) *Journal {
	t.Helper()
	j, err := Open(dir, "1000001", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	return j
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustContain(t *testing.T, j *Journal, id object.Identity, fp []byte, want bool) {
	t.Helper()
	got, err := j.Contains(ctxT(t), id, fp)
	if err != nil {
		t.Fatalf("Contains(%s): %v", id, err)
	}
	if got != want {
		t.Fatalf("Contains(%s, %x) = %v, want %v", id, fp, got, want)
	}
}

func TestRecordContains(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	j := openT(t, dir, Options{})
	cert := object.Identity{Class: pkcs11.CKO_CERTIFICATE, KeyType: object.NoKeyType, Label: "web"}
	for _, tb := range []Tombstone{tomb("a", []byte{1, 2}), {Identity: cert, Fingerprint: []byte{9}}, {Identity: ident("nofp")}} {
		if err := j.Record(ctx, tb); err != nil {
			t.Fatal(err)
		}
	}
	mustContain(t, j, ident("a"), []byte{1, 2}, true)
	mustContain(t, j, ident("a"), []byte{1, 3}, false) // a new key under the old identity lives
	mustContain(t, j, ident("b"), []byte{1, 2}, false)
	mustContain(t, j, cert, []byte{9}, true)
	mustContain(t, j, ident("nofp"), nil, true)
	mustContain(t, j, ident("nofp"), []byte{}, true)

	// Another process's view: a fresh Journal on the same directory.
	j2 := openT(t, dir, Options{})
	mustContain(t, j2, cert, []byte{9}, true)
	snap, err := j2.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Len() != 3 || !snap.Contains(ident("a"), []byte{1, 2}) || snap.Contains(ident("a"), nil) {
		t.Fatalf("snapshot = %v", snap.All())
	}
	// By identity, whatever the fingerprint (for objects whose
	// fingerprint a member cannot compute).
	if !snap.ContainsIdentity(ident("a")) || !snap.ContainsIdentity(cert) || snap.ContainsIdentity(ident("b")) {
		t.Fatalf("ContainsIdentity: a %v, cert %v, b %v; want true, true, false",
			snap.ContainsIdentity(ident("a")), snap.ContainsIdentity(cert), snap.ContainsIdentity(ident("b")))
	}
	if set := NewSet(tomb("x", []byte{1})); !set.ContainsIdentity(ident("x")) || set.ContainsIdentity(ident("a")) {
		t.Fatal("NewSet: ContainsIdentity wrong")
	}
	for _, tb := range snap.All() {
		if tb.GroupSerial != "1000001" || tb.Time.IsZero() {
			t.Fatalf("tombstone %v: group %q time %v", tb, tb.GroupSerial, tb.Time)
		}
	}
	// And j sees what j2 records.
	if err := j2.Record(ctx, tomb("c", []byte{3})); err != nil {
		t.Fatal(err)
	}
	mustContain(t, j, ident("c"), []byte{3}, true)
}

func TestJournalFormat(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	j := openT(t, dir, Options{})
	when := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	if err := j.Record(ctx, Tombstone{Identity: ident("k"), Fingerprint: []byte{0xab, 0xcd}, Time: when}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "1000001", JournalName))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"identity":{"class":3,"key_type":3,"id":"69642d6b","label":"k"},"fingerprint":"abcd","time":"2026-03-01T12:00:00Z","group":"1000001"}` + "\n"
	if string(data) != want {
		t.Fatalf("journal:\n%s\nwant:\n%s", data, want)
	}
	for _, name := range []string{JournalName, LockName} {
		fi, err := os.Stat(filepath.Join(dir, "1000001", name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o660 {
			t.Errorf("%s mode %v, want 0660", name, fi.Mode().Perm())
		}
	}
}

func TestRejects(t *testing.T) {
	for _, s := range []string{"", ".", "..", "a/b"} {
		if _, err := Open(t.TempDir(), s, Options{}); err == nil {
			t.Errorf("Open with serial %q: no error", s)
		}
	}
	j := openT(t, t.TempDir(), Options{})
	err := j.Record(ctxT(t), Tombstone{Identity: ident("x"), GroupSerial: "999"})
	if err == nil || !strings.Contains(err.Error(), "999") {
		t.Fatalf("record for another group: %v", err)
	}
}

func TestTornLastLine(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	j := openT(t, dir, Options{})
	if err := j.Record(ctx, tomb("before", []byte{1})); err != nil {
		t.Fatal(err)
	}
	// A writer killed mid-write leaves part of a line.
	jpath := filepath.Join(dir, "1000001", JournalName)
	f, err := os.OpenFile(jpath, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"identity":{"class":3,"key_type":3,"id":"6b","lab`); err != nil {
		t.Fatal(err)
	}
	f.Close()

	fresh := openT(t, dir, Options{})
	mustContain(t, fresh, ident("before"), []byte{1}, true)
	mustContain(t, j, ident("before"), []byte{1}, true)

	// The next writer cuts the torn line off and appends a whole one.
	if err := fresh.Record(ctx, tomb("after", []byte{2})); err != nil {
		t.Fatal(err)
	}
	mustContain(t, j, ident("after"), []byte{2}, true)
	mustContain(t, openT(t, dir, Options{}), ident("after"), []byte{2}, true)
	lines := readLines(t, jpath)
	if len(lines) != 2 {
		t.Fatalf("journal has %d lines after repair, want 2:\n%s", len(lines), strings.Join(lines, "\n"))
	}
}

func TestCorruptLineIsAnError(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	j := openT(t, dir, Options{})
	if err := j.Record(ctx, tomb("a", []byte{1})); err != nil {
		t.Fatal(err)
	}
	jpath := filepath.Join(dir, "1000001", JournalName)
	f, err := os.OpenFile(jpath, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("not json\n")
	f.Close()
	if err := j.Record(ctx, tomb("b", []byte{2})); err != nil {
		t.Fatal(err)
	}
	// A damaged line in the middle must not read as "no tombstone": that
	// would bring destroyed keys back.
	_, err = openT(t, dir, Options{}).Contains(ctx, ident("b"), []byte{2})
	if err == nil || !strings.Contains(err.Error(), JournalName+":2") {
		t.Fatalf("corrupt line 2: err = %v, want one naming %s:2", err, JournalName)
	}
}

func TestCompactAndHorizon(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	clk := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	opts := Options{Now: clk.Now, Horizon: 48 * time.Hour, CompactBytes: -1}
	j := openT(t, dir, opts)
	if err := j.Record(ctx, tomb("old", []byte{1})); err != nil {
		t.Fatal(err)
	}
	clk.Add(25 * time.Hour)
	if err := j.Record(ctx, tomb("young", []byte{2})); err != nil {
		t.Fatal(err)
	}
	st, err := j.Compact(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Kept != 2 || st.Expired != 0 || st.Folded == 0 {
		t.Fatalf("first compaction: %+v", st)
	}
	jpath := filepath.Join(dir, "1000001", JournalName)
	if fi, err := os.Stat(jpath); err != nil || fi.Size() != 0 {
		t.Fatalf("journal after compaction: %v size %d", err, fi.Size())
	}
	other := openT(t, dir, opts) // reads the checkpoint alone
	mustContain(t, other, ident("old"), []byte{1}, true)
	mustContain(t, other, ident("young"), []byte{2}, true)

	// 24 h later "old" is 49 h old: past the horizon it no longer counts,
	// before and after compaction alike.
	clk.Add(24 * time.Hour)
	mustContain(t, other, ident("old"), []byte{1}, false)
	mustContain(t, other, ident("young"), []byte{2}, true)
	if err := j.Record(ctx, tomb("new", []byte{3})); err != nil {
		t.Fatal(err)
	}
	st, err = j.Compact(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Kept != 2 || st.Expired != 1 {
		t.Fatalf("second compaction: %+v", st)
	}
	mustContain(t, other, ident("new"), []byte{3}, true)
	mustContain(t, other, ident("young"), []byte{2}, true)
	var c wireCheckpoint
	data, err := os.ReadFile(filepath.Join(dir, "1000001", CheckpointName))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	if len(c.Tombstones) != 2 || c.Group != "1000001" || c.Horizon != "48h0m0s" {
		t.Fatalf("checkpoint: %s", data)
	}
}

func TestAutoCompaction(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	j := openT(t, dir, Options{CompactBytes: 1000})
	for i := range 40 {
		if err := j.Record(ctx, tomb(fmt.Sprintf("k%d", i), []byte{byte(i)})); err != nil {
			t.Fatal(err)
		}
	}
	fi, err := os.Stat(filepath.Join(dir, "1000001", JournalName))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > 1000 {
		t.Fatalf("journal is %d bytes, past the 1000-byte compaction threshold", fi.Size())
	}
	snap, err := openT(t, dir, Options{}).Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Len() != 40 {
		t.Fatalf("%d tombstones after auto-compaction, want 40", snap.Len())
	}
}

// A compaction that crashed after writing the checkpoint but before
// emptying the journal, or before renaming its temp file, loses nothing.
func TestCrashDuringCompaction(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	gdir := filepath.Join(dir, "1000001")
	j := openT(t, dir, Options{CompactBytes: -1})
	for i := range 5 {
		if err := j.Record(ctx, tomb(fmt.Sprintf("k%d", i), []byte{byte(i)})); err != nil {
			t.Fatal(err)
		}
	}
	jpath := filepath.Join(gdir, JournalName)
	before, err := os.ReadFile(jpath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	// Crash between rename and truncate: the journal still holds its lines.
	if err := os.WriteFile(jpath, before, 0o660); err != nil {
		t.Fatal(err)
	}
	// Crash before rename: a temp file with garbage.
	if err := os.WriteFile(filepath.Join(gdir, CheckpointName+".tmp123"), []byte("{half"), 0o660); err != nil {
		t.Fatal(err)
	}
	fresh := openT(t, dir, Options{})
	snap, err := fresh.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Len() != 5 {
		t.Fatalf("%d tombstones, want 5: %v", snap.Len(), snap.All())
	}
	if err := fresh.Record(ctx, tomb("k5", []byte{5})); err != nil {
		t.Fatal(err)
	}
	if _, err := fresh.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	if m, _ := filepath.Glob(filepath.Join(gdir, "*.tmp*")); len(m) != 0 {
		t.Fatalf("temp files left: %v", m)
	}
	snap, err = openT(t, dir, Options{}).Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Len() != 6 {
		t.Fatalf("%d tombstones after recompaction, want 6", snap.Len())
	}
}

func TestLockWaitHonoursContext(t *testing.T) {
	dir := t.TempDir()
	j := openT(t, dir, Options{})
	// Another process holds the lock exclusively (a second descriptor is
	// as good as a second process for flock).
	lf, err := os.OpenFile(filepath.Join(dir, "1000001", LockName), os.O_RDWR|os.O_CREATE, 0o660)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	err = j.Record(ctx, tomb("blocked", []byte{1}))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Record under a held lock: %v, want deadline exceeded", err)
	}
	// The wait ends as soon as the holder lets go.
	done := make(chan error, 1)
	go func() { done <- j.Record(ctxT(t), tomb("waited", []byte{2})) }()
	lf.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mustContain(t, j, ident("waited"), []byte{2}, true)
	mustContain(t, j, ident("blocked"), []byte{1}, false)
}

// Two writer processes (this binary re-executed) and this process append
// and compact concurrently; every tombstone must survive, exactly once per
// line, and readers must never see a broken file.
func TestConcurrentProcesses(t *testing.T) {
	const perWriter = 150
	dir := t.TempDir()
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	for _, who := range []string{"p1", "p2"} {
		cmd := exec.CommandContext(ctxT(t), os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envHelper+"=writer", envDir+"="+dir, envCount+"="+strconv.Itoa(perWriter), envWho+"="+who)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
		outs = append(outs, &out)
	}
	ctx := ctxT(t)
	j := openT(t, dir, Options{CompactBytes: 4096})
	reader := openT(t, dir, Options{})
	var readErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := reader.Snapshot(ctx); err != nil {
				readErr.Store(err)
				return
			}
		}
	})
	for i := range perWriter {
		if err := j.Record(ctx, tomb(fmt.Sprintf("p0-%d", i), []byte{byte(i), 1})); err != nil {
			t.Fatal(err)
		}
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("writer %d: %v\n%s", i+1, err, outs[i])
		}
	}
	close(stop)
	wg.Wait()
	if err := readErr.Load(); err != nil {
		t.Fatalf("concurrent reader: %v", err)
	}
	snap, err := openT(t, dir, Options{}).Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Len() != 3*perWriter {
		t.Fatalf("%d tombstones, want %d", snap.Len(), 3*perWriter)
	}
	for _, who := range []string{"p0", "p1", "p2"} {
		for i := range perWriter {
			if !snap.Contains(ident(fmt.Sprintf("%s-%d", who, i)), []byte{byte(i), 1}) {
				t.Fatalf("tombstone %s-%d lost", who, i)
			}
		}
	}
	// Every journal line is whole JSON.
	for n, l := range readLines(t, filepath.Join(dir, "1000001", JournalName)) {
		if _, err := parseLine([]byte(l), "1000001"); err != nil {
			t.Fatalf("journal line %d: %v", n+1, err)
		}
	}
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines
}

func BenchmarkRecord(b *testing.B) {
	j, err := Open(b.TempDir(), "1000001", Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		if err := j.Record(ctx, tomb(strconv.Itoa(i), []byte{1})); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkContains(b *testing.B) {
	j, err := Open(b.TempDir(), "1000001", Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	ctx := context.Background()
	for i := range 1000 {
		if err := j.Record(ctx, tomb(strconv.Itoa(i), []byte{1})); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		if ok, err := j.Contains(ctx, ident("500"), []byte{1}); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
}
