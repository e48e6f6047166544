package remote_test

import (
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/remote"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// BenchmarkSign compares an ECDSA P-256 signature through pkg/slot on an
// in-process SoftHSM token (direct) with one through hsmserve (remote) and
// one through `p11-kit server` (p11kit), from one goroutine and from many;
// random/… is the bare round trip (a 1-byte C_GenerateRandom).
//
//	go test -run '^$' -bench Sign -benchtime 2s ./pkg/remote
func BenchmarkSign(b *testing.B) {
	local := open(b, testhsm.Take(b, 1)[0], 20*time.Second)
	srv := testhsm.ServeRemote(b, "bench")
	rem := open(b, srv.Token(), 20*time.Second)
	pk := open(b, testhsm.Serve(b, "bench-p11kit").Token(), 20*time.Second)
	digest := make([]byte, 32)
	m := pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil)
	for _, c := range []struct {
		name string
		s    *slot.Slot
	}{{"direct", local}, {"remote", rem}, {"p11kit", pk}} {
		_, priv := genEC(b, c.s, "bench")
		ctx := ctxT(b)
		b.Run("sign/"+c.name, func(b *testing.B) {
			defer reportCPU(b, testhsm.ProcessCPU(b))
			for b.Loop() {
				if _, err := c.s.Sign(ctx, m, priv, digest); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("sign-parallel/"+c.name, func(b *testing.B) {
			defer reportCPU(b, testhsm.ProcessCPU(b))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.s.Sign(ctx, m, priv, digest); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
		b.Run("random/"+c.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := c.s.GenerateRandom(ctx, 1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// reportCPU reports this process's CPU per operation since cpu: with a
// served token, the client's share of a call (the server's is its own).
func reportCPU(b *testing.B, cpu time.Duration) {
	b.ReportMetric(float64((testhsm.ProcessCPU(b)-cpu).Microseconds())/float64(b.N), "cpu-us/op")
}

// BenchmarkConnect is the cost of one connection to hsmserve: dial, the
// server's check of the peer, the hand-over to the connection's own server
// process (started ahead; connections that follow each other closer than
// a process start and a module's initialisation wait for the rest of it),
// the handshake and a first call.
//
//	go test -run '^$' -bench Connect -benchtime 50x ./pkg/remote
func BenchmarkConnect(b *testing.B) {
	srv := testhsm.ServeRemote(b, "connect")
	for b.Loop() {
		c, err := remote.NewClient(srv.Token().Module, nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Initialize(); err != nil {
			b.Fatal(err)
		}
		if _, err := c.GetSlotList(true); err != nil {
			b.Fatal(err)
		}
		c.Finalize()
	}
}
