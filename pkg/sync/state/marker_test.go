package state

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// Marks of another group, and public objects posing as marks, are not
// read; a cleared mark is gone, and a handle that no longer names the
// mark is left alone.
func TestMarks(t *testing.T) {
	ctx := testContext(t)
	ss, _ := openN(t, 1)
	s := ss[0]
	if _, err := WriteMark(ctx, s, "71", "m2", "writer-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := WriteMark(ctx, s, "72", "m2", "writer-b"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateObject(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, true),
		attr(pkcs11.CKA_PRIVATE, false), attr(pkcs11.CKA_LABEL, MarkLabel("71", "m0")), attr(pkcs11.CKA_APPLICATION, MarkApplication)}); err != nil {
		t.Fatal(err)
	}
	ks, err := ReadMarks(ctx, s, "71")
	if err != nil {
		t.Fatal(err)
	}
	if len(ks) != 1 || ks[0].Member != "m2" || ks[0].Writer != "writer-a" {
		t.Fatalf("marks of group 71: %+v, want one naming m2 by writer-a", ks)
	}
	stale := ks[0]
	stale.Writer = "someone else"
	if err := ClearMark(ctx, "71", stale); err != nil {
		t.Fatal(err)
	}
	if ks, _ := ReadMarks(ctx, s, "71"); len(ks) != 1 {
		t.Fatalf("a clear of a handle that names another mark removed it")
	}
	if err := ClearMark(ctx, "71", ks[0]); err != nil {
		t.Fatal(err)
	}
	if ks, _ := ReadMarks(ctx, s, "71"); len(ks) != 0 {
		t.Errorf("marks left after the clear: %+v", ks)
	}
	if ks, _ := ReadMarks(ctx, s, "72"); len(ks) != 1 {
		t.Errorf("group 72's mark was touched: %+v", ks)
	}
}

// BenchmarkReadMarks is what admission costs a process start on each
// member (in parallel over the members): one search among n objects when
// no member is behind.
//
//	go test -run '^$' -bench ReadMarks ./pkg/sync
func BenchmarkReadMarks(b *testing.B) {
	ctx := context.Background()
	tok := testhsm.Take(b, 1)[0]
	s, err := slot.Open(ctx, slot.Spec{Name: tok.Name, Module: tok.Module, ModuleEnv: tok.ModuleEnv, TokenLabel: tok.Label,
		PIN: secret.PINFromString(tok.UserPIN), CommandTimeout: 20 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for i := range 1000 {
		if _, err := s.CreateObject(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, true),
			attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_LABEL, fmt.Sprintf("filler-%d", i)), attr(pkcs11.CKA_VALUE, []byte("v"))}); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		if ks, err := ReadMarks(ctx, s, "73"); err != nil || len(ks) != 0 {
			b.Fatal(err, ks)
		}
	}
}
