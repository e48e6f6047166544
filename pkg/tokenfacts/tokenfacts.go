// Package tokenfacts keeps, in a directory, what a process found out
// about a member's token by trying it — which kinds of key it can wrap,
// whether it refuses the copies of a domain key that would give up its
// secret — so that a process started per task (a tool that initialises
// the PKCS#11 module for one signature) does not try again what an
// earlier process on the host tried. Each trial is work on the token, and
// some of it a write. A fact is a shortcut only: one missing, unreadable
// or written for another key is found out again by the caller.
package tokenfacts

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/hagroup/hagroup/pkg/config"
)

// Dir keeps facts as small files in one directory, each named after a
// hash of its key and holding the key itself, so that two keys never
// share a fact. Safe for concurrent use by several processes: a fact is
// written whole (config.WriteFileAtomic).
type Dir struct {
	path string
	perm os.FileMode
}

// Open returns the facts kept in dir; files are made with perm (0o660 when
// zero). The directory is made on the first Store.
func Open(dir string, perm os.FileMode) *Dir {
	if perm == 0 {
		perm = 0o660
	}
	return &Dir{path: dir, perm: perm}
}

// file is a fact as written.
type file struct {
	Key   string          `json:"key"`
	Value json.RawMessage `json:"value"`
}

func (d *Dir) name(key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(d.path, "fact-"+hex.EncodeToString(sum[:12])+".json")
}

// Load returns the value stored under key, and whether there is one.
func (d *Dir) Load(key string) ([]byte, bool) {
	b, err := os.ReadFile(d.name(key))
	if err != nil {
		return nil, false
	}
	var f file
	if json.Unmarshal(b, &f) != nil || f.Key != key || len(f.Value) == 0 {
		return nil, false
	}
	return f.Value, true
}

// Store keeps value, a JSON document, under key.
func (d *Dir) Store(key string, value []byte) error {
	b, err := json.Marshal(file{Key: key, Value: value})
	if err != nil {
		return fmt.Errorf("token facts: encode %q: %w", key, err)
	}
	if err := os.MkdirAll(d.path, 0o770); err != nil {
		return fmt.Errorf("token facts: %w", err)
	}
	if err := config.WriteFileAtomic(d.name(key), b, d.perm); err != nil {
		return fmt.Errorf("token facts: %w", err)
	}
	return nil
}
