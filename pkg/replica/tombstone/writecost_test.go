package tombstone

import (
	"bytes"
	"context"
	"fmt"
	"testing"

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
