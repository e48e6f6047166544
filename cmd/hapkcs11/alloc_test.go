package main

import (
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/miekg/pkcs11"
)

// signAllocs is what a signature may allocate through the library below
// the C ABI on an inline member (docs/BENCHMARKS.md, "Inline, fourth
// round", lists them): pkg/slot's one-shot call (its arguments and
// result), the output, and the attempt executor's object list and handle
// slice.
const signAllocs = 4

// TestInlineSignAllocations holds the inline sign path (C_SignInit +
// C_Sign as abi.go makes them, on a group of one SoftHSM member) to the
// allocations it has, and checks that what it signs verifies on the
// token itself.
func TestInlineSignAllocations(t *testing.T) {
	tok := testhsm.Take(t, 1)[0]
	p := pkcs11.New(tok.Module)
	if err := p.Initialize(); err != nil && err != pkcs11.Error(pkcs11.CKR_CRYPTOKI_ALREADY_INITIALIZED) {
		t.Fatal(err)
	}
	sh, _ := benchKey(t, p, tok)
	l, h, vkey := benchLibrary(t, tok, "inline")
	mech := pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil)
	digest := make([]byte, 32)
	var out benchOut
	sign := func() {
		if err := l.opInit(h, group.OpSign, mech, vkey); err != nil {
			t.Fatal(err)
		}
		out.n = len(out.buf)
		sig, err := l.op(h, group.OpSign, group.StepSingle, digest, nil, out.room())
		if err != nil {
			t.Fatal(err)
		}
		out.put(sig)
	}
	// AllocsPerRun counts the whole process's allocations: a goroutine of
	// the group, the runtime or the race detector allocating meanwhile
	// adds to one batch (seen: 6 in one run of five under -race). The
	// path's own allocations are in every batch, so the fewest counts.
	fewest := testing.AllocsPerRun(100, sign)
	for range 4 {
		fewest = min(fewest, testing.AllocsPerRun(100, sign))
	}
	if fewest > signAllocs {
		t.Errorf("a signature through an inline member allocates %v times (the fewest of five batches), want at most %d", fewest, signAllocs)
	}

	pub := findPublic(t, p, sh)
	if err := p.VerifyInit(sh, []*pkcs11.Mechanism{mech}, pub); err != nil {
		t.Fatal(err)
	}
	if err := p.Verify(sh, digest, out.buf[:out.n]); err != nil {
		t.Errorf("the token does not verify the library's last signature (%d bytes): %v", out.n, err)
	}
}

// findPublic is the public key "bench" in sh's token.
func findPublic(t *testing.T, p *pkcs11.Ctx, sh pkcs11.SessionHandle) pkcs11.ObjectHandle {
	tmpl := []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_LABEL, "bench"), pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_PUBLIC_KEY)}
	if err := p.FindObjectsInit(sh, tmpl); err != nil {
		t.Fatal(err)
	}
	hs, _, err := p.FindObjects(sh, 2)
	if ferr := p.FindObjectsFinal(sh); err == nil {
		err = ferr
	}
	if err != nil || len(hs) != 1 {
		t.Fatalf("find the public key: %v, %d found", err, len(hs))
	}
	return hs[0]
}

// op is what hapStep does below the C ABI (a test cannot use cgo): step st
// of an operation on the application's session h, in its engine session.
func (l *library) op(h uint, kind group.OpKind, st group.Step, in, sig []byte, room group.Room) ([]byte, error) {
	s, err := l.opSession(h)
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	return s.be.Do(l.ctx, kind, st, in, sig, room)
}
