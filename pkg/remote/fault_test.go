package remote_test

import (
	"errors"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// A killed server makes every call fail at once with CKR_DEVICE_ERROR
// (a health error, not a timeout) until the server is back and the slot
// is re-initialised; then the token's keys work again.
func TestKillRestartReinit(t *testing.T) {
	srv := testhsm.ServeRemote(t, "kill")
	s := open(t, srv.Token(), 20*time.Second)
	if !s.OwnsContext() {
		t.Fatalf("a remote token's slot does not own its context")
	}
	pub, priv := genEC(t, s, "k1")
	signVerify(t, s, priv, s, pub)

	srv.Kill()
	for i := range 3 {
		_, err := s.GenerateRandom(ctxT(t), 16)
		if err == nil {
			t.Fatalf("call %d after kill succeeded", i)
		}
		if errors.Is(err, slot.ErrTimeout) {
			t.Fatalf("call %d after kill timed out instead of failing fast: %v", i, err)
		}
		if code := slot.CodeOf(err); code != pkcs11.CKR_DEVICE_ERROR {
			t.Fatalf("call %d after kill: code 0x%X (%v), want CKR_DEVICE_ERROR", i, code, err)
		}
		if c := slot.ClassOf(err); c != slot.ClassHealth {
			t.Fatalf("call %d after kill: class %v, want ClassHealth", i, c)
		}
		// The server is gone before the request is written: the call
		// did nothing, and says so (a generation may be made elsewhere).
		if !errors.Is(err, slot.ErrNotSent) {
			t.Fatalf("call %d after kill: %v, want ErrNotSent", i, err)
		}
	}
	// Still down: Reinit fails, as a health error.
	if err := s.Reinit(ctxT(t)); err == nil {
		t.Fatalf("Reinit with the server down succeeded")
	} else if c := slot.ClassOf(err); c != slot.ClassHealth {
		t.Fatalf("Reinit with the server down: class %v (%v), want ClassHealth", c, err)
	}
	if _, err := s.GenerateRandom(ctxT(t), 16); !errors.Is(err, slot.ErrNotSent) {
		t.Fatalf("call with the server refusing connections: %v, want ErrNotSent", err)
	}

	srv.Restart(t)
	// Without Reinit the old connection stays dead.
	if _, err := s.GenerateRandom(ctxT(t), 16); slot.CodeOf(err) != pkcs11.CKR_DEVICE_ERROR {
		t.Fatalf("call after restart without Reinit: %v, want CKR_DEVICE_ERROR", err)
	}
	if err := s.Reinit(ctxT(t)); err != nil {
		t.Fatalf("Reinit after restart: %v", err)
	}
	if !s.LoggedIn() {
		t.Fatalf("not logged in after Reinit")
	}
	pub, priv = findOne(t, s, "k1", pkcs11.CKO_PUBLIC_KEY), findOne(t, s, "k1", pkcs11.CKO_PRIVATE_KEY)
	signVerify(t, s, priv, s, pub)
}

// A stopped server makes calls time out at CommandTimeout; once it
// continues, calls work again on new sessions (the hung ones are
// quarantined).
func TestStopTimesOut(t *testing.T) {
	srv := testhsm.ServeRemote(t, "stop")
	const timeout = 300 * time.Millisecond
	s := open(t, srv.Token(), timeout)
	if _, err := s.GenerateRandom(ctxT(t), 16); err != nil {
		t.Fatalf("random before stop: %v", err)
	}
	srv.Stop()
	_, err := s.GenerateRandom(ctxT(t), 16)
	if !errors.Is(err, slot.ErrTimeout) {
		srv.Cont()
		t.Fatalf("call to a stopped server: %v, want ErrTimeout", err)
	}
	if c := slot.ClassOf(err); c != slot.ClassHealth {
		t.Errorf("timeout class %v, want ClassHealth", c)
	}
	srv.Cont()
	if _, err := s.GenerateRandom(ctxT(t), 16); err != nil {
		t.Fatalf("random after cont: %v", err)
	}
}
