package slot_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/dispatch"
	"github.com/miekg/pkcs11"
)

// margin is how late after its deadline a timed-out call may return.
const margin = 2 * time.Second

// checkTimeout asserts err is a timeout that came between d and d+margin.
func checkTimeout(t *testing.T, what string, err error, elapsed, d time.Duration) {
	t.Helper()
	if !errors.Is(err, slot.ErrTimeout) {
		t.Fatalf("%s: %v, want ErrTimeout", what, err)
	}
	if slot.ClassOf(err) != slot.ClassHealth || slot.CodeOf(err) != pkcs11.CKR_DEVICE_ERROR {
		t.Fatalf("%s: class %v, code %#x; want health, CKR_DEVICE_ERROR", what, slot.ClassOf(err), slot.CodeOf(err))
	}
	if elapsed < d || elapsed > d+margin {
		t.Fatalf("%s returned after %v; want between %v and %v", what, elapsed, d, d+margin)
	}
}

// eachDispatch runs fn with each dispatch, in parallel.
func eachDispatch(t *testing.T, fn func(t *testing.T, d dispatch.Dispatch)) {
	for _, d := range dispatch.All {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			fn(t, d)
		})
	}
}

// Under handoff (the default) a hung call is abandoned at its deadline.
func TestHungCallTimesOut(t *testing.T) {
	t.Parallel()
	tok := testhsm.Take(t, 1)[0]
	spec := specOf(tok)
	spec.CommandTimeout = 200 * time.Millisecond
	spec.KeygenTimeout = 500 * time.Millisecond
	spec.MaxSessions = 2
	s, f := openFaulty(t, tok, spec)
	// The key is made under the default deadlines: a real EC key
	// generation on a loaded machine can outlast the 500ms this test
	// gives a hung one.
	_, priv := newECKey(t, open(t, specOf(tok)), "hang")
	ctx := ctxT(t)

	f.Hang(tok.Name, slot.OpSign)
	start := time.Now()
	_, err := signDigest(ctx, s, priv, []byte("x"))
	checkTimeout(t, "hung Sign", err, time.Since(start), spec.CommandTimeout)
	if !strings.Contains(err.Error(), "member "+tok.Name+": Sign:") {
		t.Fatalf("timeout error does not name member and op: %v", err)
	}
	if st := s.Stats(); st.Quarantined != 1 || st.Open != 0 {
		t.Fatalf("after the timeout: %+v; want the session quarantined, out of the pool", st)
	}

	// Key generation runs under the longer timeout.
	f.Hang(tok.Name, slot.OpGenerateKey)
	start = time.Now()
	_, err = s.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false), pkcs11.NewAttribute(pkcs11.CKA_VALUE_LEN, 16)})
	checkTimeout(t, "hung GenerateKey", err, time.Since(start), spec.KeygenTimeout)

	// With as many calls hung as the pool holds, calls fail at once.
	start = time.Now()
	_, err = s.GenerateRandom(ctx, 4)
	if !errors.Is(err, slot.ErrTimeout) || time.Since(start) > margin || !strings.Contains(err.Error(), "2 calls still hung") {
		t.Fatalf("call with the pool's worth of calls hung: %v after %v; want an immediate ErrTimeout", err, time.Since(start))
	}
	if got := f.Calls(tok.Name, slot.OpGenerateRandom); got != 0 {
		t.Fatalf("GenerateRandom reached the module %d times", got)
	}

	// The hung calls return: their sessions are closed, never reused.
	f.Release(tok.Name)
	if err := slot.WaitQuarantine(ctx, s); err != nil {
		t.Fatalf("quarantined calls never returned: %v", err)
	}
	sig, err := signDigest(ctx, s, priv, []byte("y"))
	if err != nil || len(sig) != 64 {
		t.Fatalf("Sign after release: %v", err)
	}
	if st := s.Stats(); st.Opened != 3 || st.QuarantinedTotal != 2 || st.Quarantined != 0 {
		t.Fatalf("after release: %+v; want a third session opened, two quarantined in all", st)
	}
}

func TestCancelledCallIsQuarantined(t *testing.T) {
	t.Parallel()
	tok := testhsm.Take(t, 1)[0]
	spec := specOf(tok)
	spec.CommandTimeout = 20 * time.Second
	s, f := openFaulty(t, tok, spec)

	f.Hang(tok.Name, slot.OpDigest)
	ctx, cancel := context.WithTimeout(ctxT(t), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.Digest(ctx, pkcs11.NewMechanism(pkcs11.CKM_SHA256, nil), []byte("x"))
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, slot.ErrTimeout) || time.Since(start) > margin {
		t.Fatalf("Digest with a ctx ending first: %v after %v; want the ctx's error, promptly", err, time.Since(start))
	}
	if slot.ClassOf(err) != slot.ClassRequest {
		t.Fatalf("ClassOf(caller's deadline) = %v, want request: the member is not charged for it", slot.ClassOf(err))
	}
	if st := s.Stats(); st.Quarantined != 1 {
		t.Fatalf("the abandoned session is not quarantined: %+v", st)
	}
	f.Release(tok.Name)
	if err := slot.WaitQuarantine(ctxT(t), s); err != nil {
		t.Fatal(err)
	}
	// Abandoned before the module was called: the module never saw it.
	if _, err := s.Digest(ctxT(t), pkcs11.NewMechanism(pkcs11.CKM_SHA256, nil), []byte("x")); err != nil {
		t.Fatalf("Digest after release: %v", err)
	}
}

func TestDelayAndCapacity(t *testing.T) {
	t.Parallel()
	tok := testhsm.Take(t, 1)[0]
	spec := specOf(tok)
	spec.CommandTimeout = 150 * time.Millisecond
	s, f := openFaulty(t, tok, spec)
	ctx := ctxT(t)

	f.Delay(tok.Name, slot.OpGenerateRandom, 30*time.Millisecond)
	start := time.Now()
	if _, err := s.GenerateRandom(ctx, 4); err != nil {
		t.Fatalf("slow GenerateRandom: %v", err)
	}
	if time.Since(start) < 30*time.Millisecond {
		t.Fatalf("Delay did not slow the call")
	}
	f.Delay(tok.Name, slot.OpGenerateRandom, time.Second)
	start = time.Now()
	_, err := s.GenerateRandom(ctx, 4)
	checkTimeout(t, "too slow GenerateRandom", err, time.Since(start), spec.CommandTimeout)
	f.Heal(tok.Name)
}

// A real remote token whose server is stopped (SIGSTOP): calls hang in the
// module, and only our deadline bounds them.
func TestStoppedServerTimesOut(t *testing.T) {
	t.Parallel()
	srv := testhsm.Serve(t, "stopped")
	spec := specOf(srv.Token())
	spec.CommandTimeout = 300 * time.Millisecond
	s := open(t, spec)
	pub, priv := newECKey(t, s, "stop")
	ctx := ctxT(t)

	srv.Stop()
	start := time.Now()
	_, err := signDigest(ctx, s, priv, []byte("x"))
	elapsed := time.Since(start)
	stopped := s.Stats()
	srv.Cont()
	checkTimeout(t, "Sign on a stopped server", err, elapsed, spec.CommandTimeout)
	if stopped.Quarantined != 1 {
		t.Fatalf("after the timeout: %+v; want the session quarantined", stopped)
	}

	// Once the server runs again the hung call returns and its session is
	// closed; the member works again.
	if err := slot.WaitQuarantine(ctx, s); err != nil {
		t.Fatalf("the hung call never returned after SIGCONT: %v", err)
	}
	msg := []byte("after SIGCONT")
	sig, err := signDigest(ctx, s, priv, msg)
	if err != nil {
		t.Fatalf("Sign after SIGCONT: %v", err)
	}
	checkSig(t, ecPublic(t, s, pub), msg, sig)

	// The caller's context ends the wait before the deadline does.
	srv.Stop()
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	start = time.Now()
	_, err = signDigest(short, s, priv, msg)
	elapsed = time.Since(start)
	cancel()
	quarantined := s.Stats().Quarantined
	srv.Cont()
	if !errors.Is(err, context.DeadlineExceeded) || elapsed >= spec.CommandTimeout {
		t.Fatalf("Sign with a 50ms context on a stopped server: %v after %v; want the context's error before %v", err, elapsed, spec.CommandTimeout)
	}
	if quarantined != 1 {
		t.Fatalf("%d calls quarantined after the cancelled one, want 1", quarantined)
	}
	if err := slot.WaitQuarantine(ctx, s); err != nil {
		t.Fatalf("the cancelled call never returned after SIGCONT: %v", err)
	}
	if _, err := signDigest(ctx, s, priv, msg); err != nil {
		t.Fatalf("Sign after the second SIGCONT: %v", err)
	}
}

// More signing callers than CPUs: signatures stay right, and a stopped
// server still times every caller out at the deadline.
func TestSaturatedCallersTimeOut(t *testing.T) {
	t.Parallel()
	srv := testhsm.Serve(t, "saturated")
	spec := specOf(srv.Token())
	spec.CommandTimeout = 500 * time.Millisecond
	callers := runtime.NumCPU() + 1
	spec.MaxSessions = callers
	s := open(t, spec)
	pub, priv := newECKey(t, s, "saturated")
	key := ecPublic(t, s, pub)
	ctx := ctxT(t)

	each := func(fn func(i int) error) []error {
		errs := make([]error, callers)
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() { errs[i] = fn(i) })
		}
		wg.Wait()
		return errs
	}
	for i, err := range each(func(i int) error {
		for n := range 50 {
			msg := fmt.Appendf(nil, "caller %d, signature %d", i, n)
			sig, err := signDigest(ctx, s, priv, msg)
			if err != nil {
				return err
			}
			checkSig(t, key, msg, sig)
		}
		return nil
	}) {
		if err != nil {
			t.Fatalf("caller %d: %v", i, err)
		}
	}

	srv.Stop()
	elapsed := make([]time.Duration, callers)
	errs := each(func(i int) error {
		start := time.Now()
		_, err := signDigest(ctx, s, priv, []byte("stopped"))
		elapsed[i] = time.Since(start)
		return err
	})
	srv.Cont()
	for i, err := range errs {
		checkTimeout(t, fmt.Sprintf("caller %d's Sign on a stopped server", i), err, elapsed[i], spec.CommandTimeout)
	}
	if err := slot.WaitQuarantine(ctx, s); err != nil {
		t.Fatalf("the hung calls never returned after SIGCONT: %v", err)
	}
	msg := []byte("after SIGCONT")
	sig, err := signDigest(ctx, s, priv, msg)
	if err != nil {
		t.Fatalf("Sign after SIGCONT: %v", err)
	}
	checkSig(t, key, msg, sig)
}

// A killed remote token answers CKR_DEVICE_ERROR until its own context is
// finalized and initialised again: Reinit brings it back.
func TestReinitAfterKillAndRestart(t *testing.T) {
	t.Parallel()
	srv := testhsm.Serve(t, "killed")
	spec := specOf(srv.Token())
	spec.CommandTimeout = 5 * time.Second
	s := open(t, spec)
	if !s.OwnsContext() {
		t.Fatalf("served member does not own its context")
	}
	pub, priv := newECKey(t, s, "kill")
	ctx := ctxT(t)
	e0 := s.Epoch()

	srv.Kill()
	_, err := signDigest(ctx, s, priv, []byte("x"))
	if !errors.Is(err, slot.ErrDeviceFailure) || slot.ClassOf(err) != slot.ClassHealth {
		t.Fatalf("Sign on a killed server: %v (class %v); want ErrDeviceFailure, health", err, slot.ClassOf(err))
	}
	// Reinit while the server is down fails, as a health error.
	if err := s.Reinit(ctx); err == nil || slot.ClassOf(err) != slot.ClassHealth {
		t.Fatalf("Reinit with the server down: %v (class %v); want a health error", err, slot.ClassOf(err))
	}
	if _, err := signDigest(ctx, s, priv, []byte("x")); slot.ClassOf(err) != slot.ClassHealth {
		t.Fatalf("Sign after a failed Reinit: %v, want a health error", err)
	}

	srv.Restart(t)
	if err := s.Reinit(ctx); err != nil {
		t.Fatalf("Reinit after restart: %v", err)
	}
	if s.Epoch() == e0 || !s.LoggedIn() {
		t.Fatalf("after Reinit: Epoch %d (was %d), LoggedIn %v; want a new epoch, logged in", s.Epoch(), e0, s.LoggedIn())
	}
	priv2 := findOne(t, s, pkcs11.CKO_PRIVATE_KEY, "kill")
	pub2 := findOne(t, s, pkcs11.CKO_PUBLIC_KEY, "kill")
	msg := []byte("after reinit")
	sig, err := signDigest(ctx, s, priv2, msg)
	if err != nil {
		t.Fatalf("Sign after Reinit: %v", err)
	}
	checkSig(t, ecPublic(t, s, pub2), msg, sig)
	_ = pub
}

// A dedicated Session does not survive its slot's Reinit.
func TestSessionLostAfterReinit(t *testing.T) {
	t.Parallel()
	s := open(t, specOf(testhsm.Take(t, 1)[0]))
	ctx := ctxT(t)
	ss, err := s.OpenSession(ctx)
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	defer ss.Close()
	if err := s.Reinit(ctx); err != nil {
		t.Fatalf("Reinit of a shared-context slot: %v", err)
	}
	if _, err := ss.GenerateRandom(ctx, 4); !errors.Is(err, slot.ErrSessionLost) || slot.ClassOf(err) != slot.ClassHealth {
		t.Fatalf("Session call after Reinit: %v, want ErrSessionLost (health)", err)
	}
	if _, err := s.GenerateRandom(ctx, 4); err != nil {
		t.Fatalf("pooled call after Reinit: %v", err)
	}
	if !s.LoggedIn() {
		t.Fatalf("not logged in after Reinit")
	}
}

// A member whose server is down when it is opened shows no token.
func TestOpenWithServerDown(t *testing.T) {
	t.Parallel()
	srv := testhsm.Serve(t, "down")
	srv.Kill()
	_, err := slot.Open(ctxT(t), specOf(srv.Token()))
	if !errors.Is(err, slot.ErrTokenNotFound) || slot.ClassOf(err) != slot.ClassHealth {
		t.Fatalf("Open with the server down: %v (class %v); want ErrTokenNotFound, health", err, slot.ClassOf(err))
	}
	if !strings.HasSuffix(err.Error(), "tokens there: none") {
		t.Fatalf("error does not say no token is there: %v", err)
	}
}

// Reinit while calls run: calls in flight finish first, calls that come
// during it wait, and afterwards callers that follow Epoch carry on.
func TestReinitUnderLoad(t *testing.T) {
	t.Parallel()
	tok := testhsm.Take(t, 1)[0]
	spec := specOf(tok)
	spec.MaxSessions = 3
	s := open(t, spec)
	newECKey(t, s, "busy")
	ctx := ctxT(t)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var signed atomic.Int64
	progress := make(chan struct{}, 1)
	errs := make(chan error, 16)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			epoch := ^uint64(0)
			var key pkcs11.ObjectHandle
			for {
				select {
				case <-stop:
					return
				default:
				}
				if e := s.Epoch(); e != epoch {
					hs, err := s.FindObjects(ctx, []*pkcs11.Attribute{
						pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY),
						pkcs11.NewAttribute(pkcs11.CKA_LABEL, "busy")})
					if err != nil || len(hs) != 1 {
						errs <- fmt.Errorf("FindObjects: %v (%d found)", err, len(hs))
						return
					}
					epoch, key = e, hs[0]
				}
				if _, err := signDigest(ctx, s, key, []byte("load")); err != nil {
					// A handle from before a re-login may be gone: a request
					// error, after which Epoch has moved on.
					if slot.ClassOf(err) != slot.ClassRequest {
						errs <- err
						return
					}
					continue
				}
				signed.Add(1)
				select {
				case progress <- struct{}{}:
				default:
				}
			}
		}()
	}
	for range 5 {
		before := signed.Load()
		if err := s.Reinit(ctx); err != nil {
			t.Fatalf("Reinit under load: %v", err)
		}
		// Wait (bounded) until signing has resumed after this Reinit.
		for signed.Load() < before+20 {
			select {
			case <-progress:
			case err := <-errs:
				t.Fatalf("signer failed: %v", err)
			case <-ctx.Done():
				t.Fatalf("signing did not resume after Reinit")
			}
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("signer failed: %v", err)
	}
	if st := s.Stats(); st.MaxOpen > 3 {
		t.Fatalf("pool of 3 had %d sessions open at once", st.MaxOpen)
	}
}
