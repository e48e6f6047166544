package slot_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/dispatch"
	"github.com/miekg/pkcs11"
)

// threadOf is an Interceptor that records the thread each Digest reaches
// the module on.
type threadOf struct{ tid chan int }

func (o threadOf) Before(_ context.Context, _ string, op slot.Op) error {
	if op == slot.OpDigest {
		o.tid <- syscall.Gettid()
	}
	return nil
}

// Inline calls run on the caller's thread, handoff calls on another; an
// Interceptor sees the call where the module does, under either dispatch.
func TestDispatchThread(t *testing.T) {
	t.Parallel()
	eachDispatch(t, func(t *testing.T, d dispatch.Dispatch) {
		spec := specOf(testhsm.Take(t, 1)[0])
		spec.Dispatch = d
		rec := threadOf{tid: make(chan int, 1)}
		spec.Interceptor = rec
		s := open(t, spec)

		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		caller := syscall.Gettid()
		if _, err := s.Digest(ctxT(t), pkcs11.NewMechanism(pkcs11.CKM_SHA256, nil), []byte("x")); err != nil {
			t.Fatalf("Digest: %v", err)
		}
		module := <-rec.tid
		if inline := d == dispatch.Inline; inline != (module == caller) {
			t.Fatalf("dispatch %s: the module call ran on thread %d, the caller is thread %d", d, module, caller)
		}
	})
}

// An inline call that hangs is not abandoned: its caller waits for the
// module's answer. Once it is past its deadline the watchdog fails every
// other call at once (health, so the group fails the member over), and
// when the call returns the member answers again.
func TestInlineWatchdog(t *testing.T) {
	t.Parallel()
	tok := testhsm.Take(t, 1)[0]
	spec := specOf(tok)
	spec.Dispatch = dispatch.Inline
	spec.CommandTimeout = 300 * time.Millisecond
	s, f := openFaulty(t, tok, spec)
	pub, priv := newECKey(t, s, "inline")
	ctx := ctxT(t)

	f.Hang(tok.Name, slot.OpSign)
	type result struct {
		sig []byte
		err error
	}
	hung := make(chan result, 1)
	start := time.Now()
	go func() {
		sig, err := signDigest(ctx, s, priv, []byte("hung"))
		hung <- result{sig, err}
	}()
	if err := f.WaitHung(ctx, tok.Name, 1); err != nil {
		t.Fatalf("the Sign never hung: %v", err)
	}

	// Another caller, on another session, until the watchdog fires.
	var err error
	for {
		_, err = s.GenerateRandom(ctx, 4)
		if err != nil || time.Since(start) > spec.CommandTimeout+margin {
			break
		}
		runtime.Gosched()
	}
	stalledAt := time.Since(start)
	if !errors.Is(err, slot.ErrTimeout) || slot.ClassOf(err) != slot.ClassHealth || !strings.Contains(err.Error(), "member "+tok.Name) {
		t.Fatalf("a call while an inline call hangs: %v after %v; want ErrTimeout (health) naming the member", err, stalledAt)
	}
	if stalledAt < spec.CommandTimeout {
		t.Fatalf("the member was failed after %v, before the hung call's deadline %v", stalledAt, spec.CommandTimeout)
	}
	calls := f.Calls(tok.Name, slot.OpGenerateRandom)
	for _, call := range []func() error{
		func() error { _, err := s.GenerateRandom(ctx, 4); return err },
		func() error { _, err := s.TokenInfo(ctx); return err },
		func() error { _, err := s.FindObjects(ctx, nil); return err },
	} {
		began := time.Now()
		if err := call(); !errors.Is(err, slot.ErrTimeout) || time.Since(began) > margin {
			t.Fatalf("a call while the member is stalled: %v after %v; want ErrTimeout at once", err, time.Since(began))
		}
	}
	if got := f.Calls(tok.Name, slot.OpGenerateRandom); got != calls {
		t.Fatalf("calls while the member is stalled reached the module (%d GenerateRandom, was %d)", got, calls)
	}
	select {
	case r := <-hung:
		t.Fatalf("the hung inline call returned (%v) before the module answered: it must not be abandoned", r.err)
	default:
	}

	// The module answers: the hung call gets its signature, and the
	// member serves again.
	f.Release(tok.Name)
	r := <-hung
	if r.err != nil {
		t.Fatalf("the released inline call: %v; want its signature", r.err)
	}
	checkSig(t, ecPublic(t, s, pub), []byte("hung"), r.sig)
	if _, err := s.GenerateRandom(ctx, 4); err != nil {
		t.Fatalf("a call once the hung one returned: %v", err)
	}
	if st := s.Stats(); st.QuarantinedTotal != 0 {
		t.Fatalf("an inline call was quarantined: %+v", st)
	}
}

// lockRig opens a p11-kit member (SoftHSM behind p11-kit server, as its
// token info says) and stops its server; a key generation then hangs in
// the module holding the token's object lock for writing. keygen is the key
// generation timeout, and kctx the key generation's context. The dedicated
// session it returns was opened before the stop.
func lockRig(t *testing.T, kctx context.Context, keygen time.Duration) (*slot.Slot, *slot.Session, *testhsm.Served, <-chan error) {
	t.Helper()
	srv := testhsm.Serve(t, "lock")
	spec := specOf(srv.Token())
	spec.CommandTimeout = 300 * time.Millisecond
	spec.KeygenTimeout = keygen
	s := open(t, spec)
	ctx := ctxT(t)
	if _, err := s.GenerateRandom(ctx, 4); err != nil { // a pooled session, open before the stop
		t.Fatal(err)
	}
	ss, err := s.OpenSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	srv.Stop()
	t.Cleanup(srv.Cont)
	done := make(chan error, 1)
	go func() {
		_, err := s.GenerateKey(kctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), []*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false), pkcs11.NewAttribute(pkcs11.CKA_VALUE_LEN, 16)})
		done <- err
	}()
	waitWriting(t, s)
	return s, ss, srv, done
}

// waitWriting waits until a call of s holds its token's object lock for
// writing.
func waitWriting(t *testing.T, s *slot.Slot) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !slot.ObjectLockWriting(s) {
		if time.Now().After(deadline) {
			t.Fatal("the key generation never took the object lock")
		}
		time.Sleep(time.Millisecond)
	}
}

// On a token without SoftHSM's quirk a search does not wait for a key
// generation in flight: it goes to the module (where, the server being
// stopped, it times out at its own deadline).
func TestObjectLockOnlyWhereNeeded(t *testing.T) {
	t.Parallel()
	s, ss, srv, keygen := lockRig(t, ctxT(t), 20*time.Second)
	slot.SetTokenIdentity(s, "Example HSMs Inc.", "X1")
	start := time.Now()
	_, err := ss.FindObjects(ctxT(t), nil)
	checkTimeout(t, "FindObjects on a stopped server beside a key generation", err, time.Since(start), 300*time.Millisecond)
	srv.Cont()
	if err := <-keygen; err != nil {
		t.Fatalf("the key generation once the server runs again: %v", err)
	}
}

// queuedSearch starts a search in ss and checks that twice lockRig's
// command timeout passes with it still queued; its answer comes on the
// channel.
func queuedSearch(t *testing.T, ss *slot.Session, behind string) <-chan error {
	t.Helper()
	found := make(chan error, 1)
	go func() {
		_, err := ss.FindObjects(ctxT(t), nil)
		found <- err
	}()
	select {
	case err := <-found:
		t.Fatalf("FindObjects returned (%v) %s", err, behind)
	case <-time.After(2 * 300 * time.Millisecond):
	}
	return found
}

// On SoftHSM a search queued behind a key generation waits for the token's
// object lock, and that wait does not count against command_timeout.
func TestObjectLockWaitIsNotCharged(t *testing.T) {
	t.Parallel()
	_, ss, srv, keygen := lockRig(t, ctxT(t), 20*time.Second)
	start := time.Now()
	found := queuedSearch(t, ss, "while a key generation held SoftHSM's object lock")
	srv.Cont()
	if err := <-keygen; err != nil {
		t.Fatalf("the key generation once the server runs again: %v", err)
	}
	if err := <-found; err != nil {
		t.Fatalf("FindObjects after waiting %v for the lock: %v; want success, the wait is not the member's", time.Since(start), err)
	}
}

// A call whose caller gave up before its deadline is not a hung token: a
// search queued behind it waits for it to return, and is not failed (a
// member failed because an application cancelled a write of its own would
// leave rotation for nothing).
func TestObjectLockHeldByCancelledCall(t *testing.T) {
	t.Parallel()
	kctx, cancel := context.WithCancel(ctxT(t))
	s, ss, srv, keygen := lockRig(t, kctx, 20*time.Second)
	cancel()
	if err := <-keygen; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled key generation on a stopped server: %v, want context.Canceled", err)
	}
	found := queuedSearch(t, ss, "behind a cancelled key generation still in the module, before its deadline")
	srv.Cont()
	if err := <-found; err != nil {
		t.Fatalf("FindObjects once the cancelled call returned: %v; want success", err)
	}
	if err := slot.WaitQuarantine(ctxT(t), s); err != nil {
		t.Fatal(err)
	}
}

// Once the call holding the lock is past its deadline the token is hung:
// a search fails at once, as a health error, rather than queue behind it.
func TestObjectLockHeldByHungCall(t *testing.T) {
	t.Parallel()
	s, ss, srv, keygen := lockRig(t, ctxT(t), 300*time.Millisecond)
	if err := <-keygen; !errors.Is(err, slot.ErrTimeout) {
		t.Fatalf("key generation on a stopped server: %v, want ErrTimeout", err)
	}
	start := time.Now()
	_, err := ss.FindObjects(ctxT(t), nil)
	if !errors.Is(err, slot.ErrTimeout) || slot.ClassOf(err) != slot.ClassHealth || time.Since(start) > margin {
		t.Fatalf("FindObjects behind a hung key generation: %v after %v; want ErrTimeout (health) at once", err, time.Since(start))
	}
	srv.Cont()
	if err := slot.WaitQuarantine(ctxT(t), s); err != nil {
		t.Fatal(err)
	}
	if _, err := s.FindObjects(ctxT(t), nil); err != nil {
		t.Fatalf("FindObjects once the hung call returned: %v", err)
	}
}
