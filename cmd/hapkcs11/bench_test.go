package main

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/miekg/pkcs11"
)

// BenchmarkModuleSign is what one signature costs through the library
// (C_SignInit + C_Sign, the path of test/module/c's harness below the C
// ABI's two cgo crossings) on a group of one SoftHSM member, for each
// dispatch, against the same two calls straight to libsofthsm2.so through
// miekg/pkcs11. Its allocations per signature are the library's own (the
// direct line's are miekg's); cpu-ns/op is the process's CPU per
// signature. Compare the lines with
//
//	go test -run '^$' -bench ModuleSign -benchmem -cpuprofile cpu.out ./cmd/hapkcs11
func BenchmarkModuleSign(b *testing.B) {
	tok := testhsm.Take(b, 1)[0]
	p := pkcs11.New(tok.Module)
	if err := p.Initialize(); err != nil && err != pkcs11.Error(pkcs11.CKR_CRYPTOKI_ALREADY_INITIALIZED) {
		b.Fatal(err)
	}
	sh, key := benchKey(b, p, tok)
	digest := make([]byte, 32)
	mech := []*pkcs11.Mechanism{pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil)}
	b.Run("mode=direct", func(b *testing.B) {
		b.ReportAllocs()
		defer reportCPU(b)()
		for b.Loop() {
			if err := p.SignInit(sh, mech, key); err != nil {
				b.Fatal(err)
			}
			if _, err := p.Sign(sh, digest); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, d := range []string{"inline", "handoff"} {
		b.Run("mode="+d, func(b *testing.B) {
			l, h, vkey := benchLibrary(b, tok, d)
			var out benchOut
			b.ReportAllocs()
			defer reportCPU(b)()
			for b.Loop() {
				if err := l.opInit(h, group.OpSign, mech[0], vkey); err != nil {
					b.Fatal(err)
				}
				out.n = len(out.buf)
				sig, err := l.op(h, group.OpSign, group.StepSingle, digest, nil, out.room())
				if err != nil {
					b.Fatal(err)
				}
				out.put(sig)
			}
		})
	}
}

// reportCPU reports the CPU time of the whole process per operation
// (cpu-ns/op: every thread, a handoff member's workers and the Go
// runtime's included) from now until the returned function is called.
func reportCPU(b *testing.B) func() {
	start := cpuTime(b)
	return func() { b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N), "cpu-ns/op") }
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchOut is a caller's output buffer (abi.go's cOut without C).
type benchOut struct {
	buf [512]byte
	n   int
}

func (o *benchOut) room() group.Room { return group.Room(o.n) }
func (o *benchOut) put(b []byte)     { o.n = copy(o.buf[:], b) }

// benchKey logs in on tok through p and makes the P-256 key "bench".
func benchKey(b testing.TB, p *pkcs11.Ctx, tok testhsm.Token) (pkcs11.SessionHandle, pkcs11.ObjectHandle) {
	slots, err := p.GetSlotList(true)
	if err != nil {
		b.Fatal(err)
	}
	for _, id := range slots {
		ti, err := p.GetTokenInfo(id)
		if err != nil || ti.Label != tok.Label {
			continue
		}
		sh, err := p.OpenSession(id, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
		if err != nil {
			b.Fatal(err)
		}
		// An open session keeps the token from being recycled for the
		// next test (C_InitToken: CKR_SESSION_EXISTS).
		b.Cleanup(func() { _ = p.CloseSession(sh) })
		if err := p.Login(sh, pkcs11.CKU_USER, tok.UserPIN); err != nil && err != pkcs11.Error(pkcs11.CKR_USER_ALREADY_LOGGED_IN) {
			b.Fatal(err)
		}
		p256 := []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}
		_, priv, err := p.GenerateKeyPair(sh, []*pkcs11.Mechanism{pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil)},
			[]*pkcs11.Attribute{
				pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
				pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, p256),
				pkcs11.NewAttribute(pkcs11.CKA_LABEL, "bench"),
			},
			[]*pkcs11.Attribute{
				pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
				pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
				pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true),
				pkcs11.NewAttribute(pkcs11.CKA_SIGN, true),
				pkcs11.NewAttribute(pkcs11.CKA_LABEL, "bench"),
			})
		if err != nil {
			b.Fatal(err)
		}
		return sh, priv
	}
	b.Fatalf("no slot holds token %s", tok.Label)
	return 0, 0
}

// benchLibrary starts the library on a group of tok alone, dispatch d,
// logs in and returns a session and the virtual handle of key "bench".
func benchLibrary(b testing.TB, tok testhsm.Token, d string) (*library, uint, uint) {
	dir := b.TempDir()
	conf := filepath.Join(dir, "hagroup.toml")
	text := fmt.Sprintf(`[agent]
state_dir = %q

[[group]]
label = "bench"
serial = "1000001"
only = true

  [[group.member]]
  name = %q
  module = %q
  token_label = %q
  dispatch = %q
`, filepath.Join(dir, "state"), tok.Name, tok.Module, tok.Label, d)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		b.Fatal(err)
	}
	b.Setenv("HAGROUP_CONF", conf)
	l, err := newLibrary(false)
	if err != nil {
		b.Fatalf("newLibrary: %v", err)
	}
	b.Cleanup(func() { _ = l.finalize() })
	h, err := l.openSession(l.slots[0].id, true)
	if err != nil {
		b.Fatal(err)
	}
	if err := l.login(h, pkcs11.CKU_USER, secret.PINFromString(tok.UserPIN)); err != nil && codeOf(err) != pkcs11.CKR_USER_ALREADY_LOGGED_IN {
		b.Fatal(err)
	}
	tmpl := []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_LABEL, "bench"), pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY)}
	if err := l.findInit(h, tmpl); err != nil {
		b.Fatal(err)
	}
	keys, err := l.findNext(h, 2)
	if err != nil || len(keys) != 1 {
		b.Fatalf("find the key: %v, %d found", err, len(keys))
	}
	if err := l.findFinal(h); err != nil {
		b.Fatal(err)
	}
	return l, h, keys[0]
}
