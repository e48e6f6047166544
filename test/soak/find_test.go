package soak

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/test/load"
	"github.com/miekg/pkcs11"
)

// TestDataObjectLifeCycle is the soak's object life cycle without faults,
// on members behind each kind of server: a token data object created
// through the group is found by class and label, and destroying it
// removes it.
func TestDataObjectLifeCycle(t *testing.T) {
	for _, kind := range []load.Kind{load.HSMServe, load.P11Kit} {
		t.Run(string(kind), func(t *testing.T) { dataObjectLifeCycle(t, kind) })
	}
}

func dataObjectLifeCycle(t *testing.T, kind load.Kind) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	w := newWorld(t, ctx, 3, kind)
	cfg, err := config.Load(w.conf)
	if err != nil {
		t.Fatal(err)
	}
	gc := cfg.Groups[0]
	g, err := group.Open(ctx, gc, cfg.Settings(&gc), group.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Login(ctx, pkcs11.CKU_USER, w.userPIN.Clone()); err != nil {
		t.Fatal(err)
	}
	gl, err := newGoLoad(ctx, g, w.userPIN.Clone(), "life", false, "", nil, "A")
	if err != nil {
		t.Fatal(err)
	}
	for i, label := range []string{"life-a", "life-b"} {
		if err := gl.create(ctx, label, []byte(label)); err != nil {
			t.Fatalf("create %s: %v", label, err)
		}
		hs, err := g.Find(ctx, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), pkcs11.NewAttribute(pkcs11.CKA_LABEL, label)})
		if err != nil || len(hs) != 1 {
			t.Errorf("object %d: find by class and label after create = %v, %v; want one handle", i, hs, err)
		}
		found, err := gl.destroy(ctx, label)
		if err != nil || found != 1 {
			t.Errorf("destroy %s: found %d, err %v; want 1, nil", label, found, err)
		}
		hs, err = g.Find(ctx, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), pkcs11.NewAttribute(pkcs11.CKA_LABEL, label)})
		if err != nil || len(hs) != 0 {
			t.Errorf("find after destroy = %v, %v; want none", hs, err)
		}
	}
}

// repairToken puts back a token.object a kill left truncated, and only
// then.
func TestRepairToken(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token.object")
	orig := []byte("token object as provisioned, label padded to 32 bytes")
	w := &world{tokenFiles: []tokenFile{{path: path, data: orig}}}
	for _, tc := range []struct {
		name     string
		content  []byte
		repaired bool
	}{
		{"intact", orig, false},
		{"rewritten by a login, same size", bytes.ToUpper(orig), false},
		{"truncated by a kill", nil, true},
		{"half written", orig[:10], true},
	} {
		if err := os.WriteFile(path, tc.content, 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := w.repairToken(0)
		if err != nil || got != tc.repaired {
			t.Fatalf("%s: repairToken = %v, %v; want %v", tc.name, got, err, tc.repaired)
		}
		want := tc.content
		if tc.repaired {
			want = orig
		}
		if b, _ := os.ReadFile(path); !bytes.Equal(b, want) {
			t.Fatalf("%s: file holds %q, want %q", tc.name, b, want)
		}
	}
}

// removeHalfWritten deletes the object files a kill left without
// CKA_CLASS (with their lock files): a generation counter alone, or
// attributes that CKA_CLASS does not lead; and nothing else.
func TestRemoveHalfWritten(t *testing.T) {
	dir := t.TempDir()
	w := &world{tokenFiles: []tokenFile{{path: filepath.Join(dir, "token.object")}}}
	files := map[string][]byte{
		"token.object": []byte("tiny"), // repairToken's business, not this
		"half.object":  make([]byte, 8),
		"half.lock":    nil,
		// The soak's (seed 1796690171447315564): the counter and CKA_KEY_TYPE.
		"keytype.object": {0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3},
		"keytype.lock":   nil,
		"whole.object":   make([]byte, 200),
		"whole.lock":     nil,
		"empty.object":   nil,
		"empty.lock":     nil,
		"generation":     make([]byte, 8),
		"nolock.object":  []byte{1, 2, 3},
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	n, err := w.removeHalfWritten(0)
	if err != nil || n != 3 {
		t.Fatalf("removeHalfWritten = %d, %v; want 3 (half, keytype, nolock)", n, err)
	}
	for name := range files {
		_, err := os.Stat(filepath.Join(dir, name))
		gone := errors.Is(err, fs.ErrNotExist)
		want := strings.HasPrefix(name, "half.") || strings.HasPrefix(name, "keytype.") || name == "nolock.object"
		if gone != want {
			t.Errorf("%s: removed %v, want %v", name, gone, want)
		}
	}
}
