package slot_test

import (
	"crypto/sha256"
	"errors"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// A call whose Late fires and is overtaken returns ErrOvertaken while the
// module still holds it; a later call made with the same Late (a retry of
// the attempt) reaches no module; the abandoned call, once the module
// returns it, is reported back once.
func TestOvertakenCallIsLeftAndNotMadeAgain(t *testing.T) {
	t.Parallel()
	tok := testhsm.Take(t, 1)[0]
	s, f := openFaulty(t, tok, specOf(tok))
	ctx := ctxT(t)
	mech := pkcs11.NewMechanism(pkcs11.CKM_SHA256, nil)
	f.Hang(tok.Name, slot.OpDigest)
	l := &slot.Late{After: 20 * time.Millisecond}
	l.Fire = l.Overtake // another member answers at once
	lctx := slot.WithLate(ctx, l)
	if _, err := s.Digest(lctx, mech, []byte("x")); !errors.Is(err, slot.ErrOvertaken) || slot.ClassOf(err) != slot.ClassRequest {
		t.Fatalf("Digest overtaken: %v (class %v), want ErrOvertaken, a request error", err, slot.ClassOf(err))
	}
	before := f.Calls(tok.Name, slot.OpDigest)
	if _, err := s.Digest(lctx, mech, []byte("x")); !errors.Is(err, slot.ErrOvertaken) {
		t.Fatalf("a second call with the overtaken Late: %v, want ErrOvertaken", err)
	}
	if n := f.Calls(tok.Name, slot.OpDigest) - before; n != 0 {
		t.Errorf("the second call reached the module %d times, want none", n)
	}
	back, _, left := l.Overtaken()
	if !left {
		t.Fatal("the overtaken call was not reported abandoned")
	}
	f.Release(tok.Name)
	select {
	case <-back:
	case <-ctx.Done():
		t.Fatal("the abandoned call was never reported back")
	}
	want := sha256.Sum256([]byte("y"))
	if got, err := s.Digest(ctx, mech, []byte("y")); err != nil || string(got) != string(want[:]) {
		t.Fatalf("Digest after the overtaken call: %x, %v", got, err)
	}
}
