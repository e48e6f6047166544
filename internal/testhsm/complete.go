package testhsm

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// CompleteHalfMadeObject does to the object PlantHalfMadeObject put on tok
// what the rest of a creation under way in another process does: SoftHSM
// commits the template to the file that held the defaults. The planted
// file takes the content of the complete object file on tok that holds
// label (a public object made on tok by the test, so its label is stored
// in clear), under a higher generation, and that file goes; so tok then
// holds that object once, in the file that was half-made, and SoftHSM in
// this process sees the change on its next search or read.
func CompleteHalfMadeObject(t testing.TB, tok Token, label string) {
	t.Helper()
	planted, err := hex.DecodeString(halfMadeObject)
	if err != nil {
		t.Fatal(err)
	}
	dir := tokenDir(t, tok)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var half, done string
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".object") || e.Name() == "token.object" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case bytes.Equal(b, planted):
			half = e.Name()
		case bytes.Contains(b, []byte(label)):
			done = e.Name()
		}
	}
	if half == "" || done == "" {
		t.Fatalf("token %s: planted half-made file %q, file holding %q %q: want both", tok.Label, half, label, done)
	}
	body, err := os.ReadFile(filepath.Join(dir, done))
	if err != nil || len(body) < 8 {
		t.Fatalf("read %s: %v", done, err)
	}
	gen := max(binary.BigEndian.Uint64(planted), binary.BigEndian.Uint64(body)) + 1
	binary.BigEndian.PutUint64(body, gen)
	if err := os.WriteFile(filepath.Join(dir, half), body, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{done, strings.TrimSuffix(done, ".object") + ".lock"} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	bumpGeneration(t, tok, dir)
}
