package tokenfacts

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStoreAndLoad: a fact comes back under its key only; a file holding
// another key's fact, or garbage, is no fact.
func TestStoreAndLoad(t *testing.T) {
	d := Open(filepath.Join(t.TempDir(), "state", "1"), 0)
	if _, ok := d.Load("a"); ok {
		t.Fatal("a fact before any was stored")
	}
	if err := d.Store("a", []byte(`{"x":1}`)); err != nil {
		t.Fatal(err)
	}
	if v, ok := d.Load("a"); !ok || string(v) != `{"x":1}` {
		t.Fatalf("Load(a) = %s, %v", v, ok)
	}
	if _, ok := d.Load("b"); ok {
		t.Fatal("a fact under a key never stored")
	}
	fi, err := os.Stat(d.name("a"))
	if err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("fact file mode %v (%v), want 0660", fi.Mode().Perm(), err)
	}
	// Another key's fact in a's file (a hash collision, or a copied
	// file) is not a's.
	b, _ := os.ReadFile(d.name("a"))
	if err := os.WriteFile(d.name("c"), b, 0o660); err != nil {
		t.Fatal(err)
	}
	if _, ok := d.Load("c"); ok {
		t.Fatal("c loaded a's fact")
	}
	if err := os.WriteFile(d.name("a"), []byte("{torn"), 0o660); err != nil {
		t.Fatal(err)
	}
	if _, ok := d.Load("a"); ok {
		t.Fatal("a torn file loaded as a fact")
	}
	ents, err := os.ReadDir(d.path)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "fact-") || !strings.HasSuffix(e.Name(), ".json") {
			t.Errorf("a file that is no fact left in the directory: %s", e.Name())
		}
	}
}
