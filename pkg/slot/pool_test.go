package slot_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

func TestPoolBoundsSessions(t *testing.T) {
	t.Parallel()
	tok := testhsm.Take(t, 1)[0]
	spec := specOf(tok)
	spec.MaxSessions = 4
	s, f := openFaulty(t, tok, spec)
	_, priv := newECKey(t, s, "pool")
	if s.Capacity() != 4 {
		t.Fatalf("Capacity() = %d, want 4", s.Capacity())
	}
	ctx := ctxT(t)

	// The first signs hang, so that the pool is seen fully lent out.
	f.Hang(tok.Name, slot.OpSign)
	const borrowers, rounds = 32, 5
	var wg sync.WaitGroup
	errs := make(chan error, borrowers*rounds)
	for i := range borrowers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				msg := []byte(fmt.Sprintf("borrower %d round %d", i, r))
				if _, err := signDigest(ctx, s, priv, msg); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	if err := f.WaitHung(ctx, tok.Name, 4); err != nil {
		t.Fatalf("four signs never ran at once: %v", err)
	}
	st := s.Stats()
	if st.InUse != 4 || st.Open != 4 {
		t.Fatalf("with 32 borrowers: %+v; want all 4 sessions lent out", st)
	}
	// Where the token counts sessions, it agrees: the pool's 4 plus the
	// long-lived session. (SoftHSM 2.6 says CK_UNAVAILABLE_INFORMATION.)
	ti, err := s.TokenInfo(ctx)
	if err != nil {
		t.Fatalf("TokenInfo: %v", err)
	}
	if ti.SessionCount != pkcs11.CK_UNAVAILABLE_INFORMATION && ti.SessionCount != 5 {
		t.Fatalf("token reports %d sessions open; want 4 pooled + 1 long-lived", ti.SessionCount)
	}
	f.Release(tok.Name)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("borrower failed: %v", err)
	}
	st = s.Stats()
	if st.MaxOpen != 4 || st.Opened != 4 || st.InUse != 0 {
		t.Fatalf("pool of 4 after 32 borrowers: %+v; want 4 opened in all, 4 at most at once", st)
	}
	if got := f.Calls(tok.Name, slot.OpSign); got != borrowers*rounds {
		t.Fatalf("%d signs reached the module, want %d", got, borrowers*rounds)
	}
}

func TestPoolWaitHonoursContext(t *testing.T) {
	t.Parallel()
	tok := testhsm.Take(t, 1)[0]
	spec := specOf(tok)
	spec.MaxSessions = 1
	spec.CommandTimeout = 20 * time.Second
	s, f := openFaulty(t, tok, spec)

	// Hold the only session in a hung GenerateRandom.
	f.Hang(tok.Name, slot.OpGenerateRandom)
	done := make(chan error, 1)
	go func() {
		_, err := s.GenerateRandom(context.Background(), 8)
		done <- err
	}()
	if err := f.WaitHung(ctxT(t), tok.Name, 1); err != nil {
		t.Fatalf("the call never hung: %v", err)
	}
	// A second borrower waits for the session until its ctx ends.
	ctx, cancel := context.WithTimeout(ctxT(t), 50*time.Millisecond)
	defer cancel()
	_, err := s.Digest(ctx, pkcs11.NewMechanism(pkcs11.CKM_SHA256, nil), []byte("x"))
	if !errors.Is(err, context.DeadlineExceeded) || slot.ClassOf(err) != slot.ClassRequest {
		t.Fatalf("borrow from an exhausted pool: %v (class %v); want the ctx's deadline, class request", err, slot.ClassOf(err))
	}
	if got := f.Calls(tok.Name, slot.OpDigest); got != 0 {
		t.Fatalf("the waiting borrower reached the module %d times", got)
	}
	f.Release(tok.Name)
	if err := <-done; err != nil {
		t.Fatalf("released call: %v", err)
	}
	// The session is back in the pool.
	if _, err := s.Digest(ctxT(t), pkcs11.NewMechanism(pkcs11.CKM_SHA256, nil), []byte("x")); err != nil {
		t.Fatalf("Digest after release: %v", err)
	}
	if st := s.Stats(); st.Opened != 1 {
		t.Fatalf("pool of 1 opened %d sessions", st.Opened)
	}
}

func TestSessionErrorDiscardsSession(t *testing.T) {
	t.Parallel()
	tok := testhsm.Take(t, 1)[0]
	spec := specOf(tok)
	spec.MaxSessions = 1
	s, f := openFaulty(t, tok, spec)
	ctx := ctxT(t)
	_, priv := newECKey(t, s, "discard")
	if _, err := signDigest(ctx, s, priv, []byte("warm")); err != nil {
		t.Fatalf("Sign: %v", err)
	}
	before := s.Stats()
	if before.Opened != 1 || before.Open != 1 {
		t.Fatalf("before: %+v, want one session opened and open", before)
	}

	f.Fail(tok.Name, slot.OpSign, pkcs11.Error(pkcs11.CKR_SESSION_HANDLE_INVALID))
	_, err := signDigest(ctx, s, priv, []byte("x"))
	if !errors.Is(err, slot.ErrSessionLost) || slot.ClassOf(err) != slot.ClassHealth || slot.CodeOf(err) != pkcs11.CKR_SESSION_HANDLE_INVALID {
		t.Fatalf("Sign with a lost session: %v (class %v); want ErrSessionLost, health", err, slot.ClassOf(err))
	}
	var pe pkcs11.Error
	if !errors.As(err, &pe) || pe != pkcs11.CKR_SESSION_HANDLE_INVALID {
		t.Fatalf("the original pkcs11.Error is not reachable with errors.As: %v", err)
	}
	var se *slot.Error
	if !errors.As(err, &se) || se.Member != tok.Name || se.Op != slot.OpSign {
		t.Fatalf("error does not name member and op: %#v", se)
	}
	mid := s.Stats()
	if mid.Discarded != 1 || mid.Open != 0 {
		t.Fatalf("after a session error: %+v; want the session discarded", mid)
	}

	f.Heal(tok.Name)
	if _, err := signDigest(ctx, s, priv, []byte("y")); err != nil {
		t.Fatalf("Sign after heal: %v", err)
	}
	after := s.Stats()
	if after.Opened != 2 || after.Open != 1 {
		t.Fatalf("after heal: %+v; want the next call on a newly opened session", after)
	}

	// A request error keeps the session.
	f.FailN(tok.Name, slot.OpSign, pkcs11.Error(pkcs11.CKR_KEY_HANDLE_INVALID), 1)
	if _, err := signDigest(ctx, s, priv, []byte("z")); slot.ClassOf(err) != slot.ClassRequest {
		t.Fatalf("Sign with a bad key: %v, want a request error", err)
	}
	if _, err := signDigest(ctx, s, priv, []byte("z")); err != nil {
		t.Fatalf("Sign after a request error: %v", err)
	}
	if st := s.Stats(); st.Opened != 2 || st.Discarded != 1 {
		t.Fatalf("a request error discarded the session: %+v", st)
	}
}
