package tombstone

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// BenchmarkStateObjectWrite is what the token charges for the ways a
// tombstone object could be rewritten (docs/BENCHMARKS.md, "Write cost of
// a replicated create-copy-destroy"): a create and a destroy (Shared's
// fallback, and what it did before registers) by value size, and changing
// the only attribute of a data object SoftHSM lets change, CKA_LABEL
// (a register's update). It logs the token's answer to a
// change of CKA_VALUE and CKA_APPLICATION in place.
func BenchmarkStateObjectWrite(b *testing.B) {
	ctx := context.Background()
	s := openTokens(b, 1)[0]
	tmpl := func(v []byte) []*pkcs11.Attribute {
		return []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
			pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true), pkcs11.NewAttribute(pkcs11.CKA_MODIFIABLE, true),
			pkcs11.NewAttribute(pkcs11.CKA_LABEL, "writecost"), pkcs11.NewAttribute(pkcs11.CKA_VALUE, v)}
	}
	create := func(b *testing.B, v []byte) pkcs11.ObjectHandle {
		h, err := s.CreateObject(ctx, tmpl(v))
		if err != nil {
			b.Fatal(err)
		}
		return h
	}
	for _, size := range []int{100, 4000, 40000, 400000} {
		val := bytes.Repeat([]byte{'x'}, size)
		b.Run(fmt.Sprintf("create+destroy/bytes=%d", size), func(b *testing.B) {
			h := create(b, val)
			for b.Loop() {
				n := create(b, val)
				if err := s.DestroyObject(ctx, h); err != nil {
					b.Fatal(err)
				}
				h = n
			}
		})
		b.Run(fmt.Sprintf("set-label/bytes=%d", size), func(b *testing.B) {
			h := create(b, nil)
			label := append([]byte("writecost"), val...)
			for b.Loop() {
				label[len(label)-1]++
				if err := s.SetAttributes(ctx, h, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_LABEL, label)}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	h := create(b, []byte("v"))
	for name, a := range map[string]*pkcs11.Attribute{"CKA_VALUE": pkcs11.NewAttribute(pkcs11.CKA_VALUE, []byte("w")),
		"CKA_APPLICATION": pkcs11.NewAttribute(pkcs11.CKA_APPLICATION, "a")} {
		b.Logf("%s changed in place: %v", name, s.SetAttributes(ctx, h, []*pkcs11.Attribute{a}))
	}
}

// BenchmarkRecordWithHistory is the cost of recording one destroy when
// the group already holds n tombstones within the horizon (a fleet that
// destroys token objects daily keeps thousands for 90 days): the local
// record (memory, the Go API's default) and every member hold them, as
// after any catch-up, and this process has written there before. cpu-ns/op is the whole process's
// CPU per destroy, SoftHSM's included.
func BenchmarkRecordWithHistory(b *testing.B) {
	ctx := context.Background()
	for _, members := range []int{1, 3} {
		slots := openTokens(b, members)
		for _, n := range []int{0, 1000, 5000, 10000} {
			b.Run(fmt.Sprintf("members=%d/existing=%d", members, n), func(b *testing.B) {
				serial := fmt.Sprintf("%d%d", 70+members, n)
				local := &Memory{}
				start := time.Now().Add(-DefaultHorizon / 2)
				for i := range n {
					t := tomb(fmt.Sprintf("seed-%d", i), make([]byte, 32))
					t.Identity.ID, t.Time, t.GroupSerial = make([]byte, 16), start.Add(time.Duration(i)*time.Second), serial
					local.Record(ctx, t)
				}
				sh := NewShared(local, serial, SharedOptions{OnError: func(m string, err error) { b.Error(m, err) }})
				sh.SetMembers(func(bool) []*slot.Slot { return slots })
				record := func(i int) {
					t := tomb(fmt.Sprintf("new-%d", i), make([]byte, 32))
					t.Identity.ID = make([]byte, 16)
					if err := sh.Record(ctx, t); err != nil {
						b.Fatal(err)
					}
				}
				// A plan's read spreads the history to the members, as
				// any catch-up does; then a first destroy.
				if _, err := sh.Snapshot(ctx); err != nil {
					b.Fatal(err)
				}
				record(0)
				for _, m := range slots {
					held, err := sh.read(ctx, m)
					if err != nil || len(held.records) < n {
						b.Fatalf("member %s holds %d records (%v), want at least %d", m.Name(), len(held.records), err, n)
					}
				}
				cpu := testhsm.ProcessCPU(b)
				i := 0
				for b.Loop() {
					i++
					record(i)
				}
				b.ReportMetric(float64(testhsm.ProcessCPU(b)-cpu)/float64(b.N), "cpu-ns/op")
			})
		}
	}
}

// BenchmarkFirstRecordWithHistory is BenchmarkRecordWithHistory for a
// process's first destroy (a per-task tool: one destroy per process, the
// host's journal shared): a fresh writer reads the members' registers
// before it writes.
func BenchmarkFirstRecordWithHistory(b *testing.B) {
	ctx := context.Background()
	slots := openTokens(b, 3)
	for _, n := range []int{0, 1000, 10000} {
		b.Run(fmt.Sprintf("members=3/existing=%d", n), func(b *testing.B) {
			serial := fmt.Sprintf("9%d", n)
			local, err := Open(b.TempDir(), serial, Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer local.Close()
			start := time.Now().Add(-DefaultHorizon / 2)
			for i := range n {
				t := tomb(fmt.Sprintf("seed-%d", i), make([]byte, 32))
				t.Identity.ID, t.Time, t.GroupSerial = make([]byte, 16), start.Add(time.Duration(i)*time.Second), serial
				if err := local.Record(ctx, t); err != nil {
					b.Fatal(err)
				}
			}
			seed := NewShared(local, serial, SharedOptions{OnError: func(m string, err error) { b.Error(m, err) }})
			seed.SetMembers(func(bool) []*slot.Slot { return slots })
			if _, err := seed.Snapshot(ctx); err != nil {
				b.Fatal(err)
			}
			cpu := testhsm.ProcessCPU(b)
			i := 0
			for b.Loop() {
				i++
				sh := NewShared(local, serial, SharedOptions{OnError: func(m string, err error) { b.Error(m, err) }})
				sh.SetMembers(func(bool) []*slot.Slot { return slots })
				t := tomb(fmt.Sprintf("new-%d", i), make([]byte, 32))
				t.Identity.ID = make([]byte, 16)
				if err := sh.Record(ctx, t); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(testhsm.ProcessCPU(b)-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}
