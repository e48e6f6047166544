package ha

import (
	"context"
	"fmt"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/miekg/pkcs11"
)

// BenchmarkStartToFirstSignature is a process start against a 3-member
// group of 1,000 objects: open the group with a state directory of its
// own, log in (which reads the behind marks on every member), find a key
// and make the first signature. Closing is not timed.
//
//	go test -run '^$' -bench StartToFirstSignature -benchtime 20x ./pkg/ha
func BenchmarkStartToFirstSignature(b *testing.B) {
	ctx := context.Background()
	toks := testhsm.Take(b, 3)
	cfg := groupOn(b, toks)
	set := config.Defaults()
	set.Retries = 0
	importEC(b, toks, "first")
	for _, tok := range toks {
		s := direct(b, tok)
		for i := range 998 {
			if _, err := s.CreateObject(ctx, dataTemplate(fmt.Sprintf("filler-%d", i))); err != nil {
				b.Fatal(err)
			}
		}
	}
	pin := secret.PINFromString(testhsm.UserPIN)
	for b.Loop() {
		g, err := Open(ctx, cfg, set, Options{StateDir: b.TempDir()})
		if err != nil {
			b.Fatal(err)
		}
		if err := g.Engine().Login(ctx, pkcs11.CKU_USER, pin); err != nil {
			b.Fatal(err)
		}
		s, err := g.Engine().OpenSession(ctx, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
		if err != nil {
			b.Fatal(err)
		}
		hs, err := s.Find(ctx, []*pkcs11.Attribute{a(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY), a(pkcs11.CKA_LABEL, "first")})
		if err != nil || len(hs) != 1 {
			b.Fatalf("find: %v (%d)", err, len(hs))
		}
		if err := signOnce(ctx, s, hs[0]); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		s.Close()
		g.Close()
		b.StartTimer()
	}
}
