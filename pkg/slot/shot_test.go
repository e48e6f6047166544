package slot_test

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
)

// Under handoff a signature is made by the session's worker in C: the
// caller's post and wait are the process's only crossings of cgo per
// signature (a worker coming back to Go for each call adds three: its
// wait for the post, the module call and its answer). Not parallel: the
// count is the whole process's.
func TestSignStaysInC(t *testing.T) {
	tok := testhsm.Take(t, 1)[0]
	s := open(t, specOf(tok)) // the default dispatch, handoff
	pub, priv := newECKey(t, s, "shot")
	ctx := ctxT(t)
	if _, err := signDigest(ctx, s, priv, []byte("warm")); err != nil {
		t.Fatalf("Sign: %v", err)
	}
	const n = 300
	before := runtime.NumCgoCall()
	sigs := make([][]byte, n)
	for i := range sigs {
		sig, err := signDigest(ctx, s, priv, []byte(fmt.Sprint(i)))
		if err != nil {
			t.Fatalf("Sign %d: %v", i, err)
		}
		sigs[i] = sig
	}
	per := float64(runtime.NumCgoCall()-before) / n
	key := ecPublic(t, s, pub)
	for i, sig := range sigs {
		checkSig(t, key, []byte(fmt.Sprint(i)), sig)
	}
	// 2 per signature, and room for the odd call of a background probe.
	if per > 3 {
		t.Fatalf("%.2f crossings of cgo per signature under handoff, want about 2 (post and wait)", per)
	}
}
