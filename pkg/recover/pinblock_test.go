package recover

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Two processes sharing a state directory are two PINBlocks on it: a mark
// one makes is seen by the other, a clear by either lifts it for both, and
// a mark that cannot be read still blocks.
func TestPINBlocksShared(t *testing.T) {
	dir := t.TempDir()
	a, err := NewPINBlocks(dir, "1000001", 0)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewPINBlocks(dir, "1000001", 0)
	if err := b.Blocked("hsm-b"); err != nil {
		t.Fatalf("no mark yet: %v", err)
	}
	a.Refused("hsm-b", errors.New("member hsm-b: Login: CKR_PIN_INCORRECT"))
	err = b.Blocked("hsm-b")
	if !errors.Is(err, ErrPINBlocked) || !strings.Contains(err.Error(), "CKR_PIN_INCORRECT") {
		t.Fatalf("the other process sees %v, want ErrPINBlocked naming the refusal", err)
	}
	path := filepath.Join(dir, "1000001", "hsm-b.pinblock")
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o660 {
		t.Fatalf("mark file: %v, mode %v; want 0660", err, st.Mode().Perm())
	}
	if err := b.Clear("hsm-b"); err != nil {
		t.Fatal(err)
	}
	if err := a.Blocked("hsm-b"); err != nil {
		t.Errorf("the process that made the mark still sees it after the other cleared it: %v", err)
	}
	if err := os.WriteFile(path, []byte("{not json"), 0o660); err != nil {
		t.Fatal(err)
	}
	if err := a.Blocked("hsm-b"); !errors.Is(err, ErrPINBlocked) {
		t.Errorf("an unreadable mark: %v, want it to block", err)
	}
}

// Without a state directory the marks live in the process.
func TestPINBlocksInMemory(t *testing.T) {
	b, err := NewPINBlocks("", "1000001", 0)
	if err != nil {
		t.Fatal(err)
	}
	b.Refused("hsm-a", errors.New("CKR_PIN_LOCKED"))
	if err := b.Blocked("hsm-a"); !errors.Is(err, ErrPINBlocked) {
		t.Fatalf("in memory: %v", err)
	}
	b.Clear("hsm-a")
	if err := b.Blocked("hsm-a"); err != nil {
		t.Fatalf("after Clear: %v", err)
	}
}
