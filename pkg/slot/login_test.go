package slot_test

import (
	"errors"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

func TestLogoutThenLoginRefindsHandles(t *testing.T) {
	t.Parallel()
	tok := testhsm.Take(t, 1)[0]
	s := open(t, specOf(tok))
	ctx := ctxT(t)
	pub, priv := newECKey(t, s, "relogin")
	e0 := s.Epoch()

	if err := s.Logout(ctx); err != nil {
		t.Fatalf("Logout: %v", err)
	}
	if s.LoggedIn() || s.Epoch() == e0 {
		t.Fatalf("after Logout: LoggedIn %v, Epoch %d (was %d); want false and a new epoch", s.LoggedIn(), s.Epoch(), e0)
	}
	if _, err := signDigest(ctx, s, priv, []byte("x")); err == nil {
		t.Fatalf("Sign with a private key after Logout succeeded")
	}
	hs, err := s.FindObjects(ctx, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY)})
	if err != nil || len(hs) != 0 {
		t.Fatalf("private keys visible after Logout: %v, %v", hs, err)
	}
	// Logged out stays logged out: no automatic login after an explicit Logout.
	if s.Stats().Relogins != 0 || s.LoggedIn() {
		t.Fatalf("the slot logged in by itself after an explicit Logout")
	}
	if err := s.Logout(ctx); err != nil {
		t.Fatalf("second Logout: %v", err)
	}

	if err := s.Login(ctx, pkcs11.CKU_USER, secret.PINFromString(tok.UserPIN)); err != nil {
		t.Fatalf("Login: %v", err)
	}
	if err := s.Login(ctx, pkcs11.CKU_USER, secret.PINFromString(tok.UserPIN)); err != nil {
		t.Fatalf("Login when already logged in: %v", err)
	}
	priv2 := findOne(t, s, pkcs11.CKO_PRIVATE_KEY, "relogin")
	msg := []byte("after re-login")
	sig, err := signDigest(ctx, s, priv2, msg)
	if err != nil {
		t.Fatalf("Sign with the re-found key: %v", err)
	}
	checkSig(t, ecPublic(t, s, pub), msg, sig)
}

// Someone else in the process logs the token out (a C_Logout on another
// context of the same module): the slot notices, logs in again with its
// kept PIN and says so through Epoch; handles looked up again work.
func TestAutomaticReloginAfterForeignLogout(t *testing.T) {
	t.Parallel()
	tok := testhsm.Take(t, 1)[0]
	s := open(t, specOf(tok))
	ctx := ctxT(t)
	pub, priv := newECKey(t, s, "foreign")
	if _, err := signDigest(ctx, s, priv, []byte("warm")); err != nil {
		t.Fatalf("Sign: %v", err)
	}
	e0 := s.Epoch()

	raw := pkcs11.New(tok.Module)
	if raw == nil {
		t.Fatalf("load %s", tok.Module)
	}
	defer raw.Destroy() // never Finalize: the context is shared
	if err := raw.Initialize(); !errors.Is(err, pkcs11.Error(pkcs11.CKR_CRYPTOKI_ALREADY_INITIALIZED)) {
		t.Fatalf("raw Initialize: %v, want CKR_CRYPTOKI_ALREADY_INITIALIZED", err)
	}
	h, err := raw.OpenSession(s.SlotID(), pkcs11.CKF_SERIAL_SESSION)
	if err != nil {
		t.Fatalf("raw OpenSession: %v", err)
	}
	if err := raw.Logout(h); err != nil {
		t.Fatalf("raw Logout: %v", err)
	}
	raw.CloseSession(h)

	_, err = signDigest(ctx, s, priv, []byte("x"))
	if err == nil {
		t.Fatalf("Sign with a handle from before the logout succeeded; the test did not log the token out")
	}
	if slot.ClassOf(err) != slot.ClassRequest {
		t.Fatalf("Sign after a foreign logout: %v is class %v; the member is healthy (want request)", err, slot.ClassOf(err))
	}
	if s.Epoch() == e0 || !s.LoggedIn() || s.Stats().Relogins != 1 {
		t.Fatalf("after the failed call: Epoch %d (was %d), LoggedIn %v, relogins %d; want a new epoch, logged in, 1",
			s.Epoch(), e0, s.LoggedIn(), s.Stats().Relogins)
	}
	priv2 := findOne(t, s, pkcs11.CKO_PRIVATE_KEY, "foreign")
	msg := []byte("after automatic re-login")
	sig, err := signDigest(ctx, s, priv2, msg)
	if err != nil {
		t.Fatalf("Sign with the re-found key: %v", err)
	}
	checkSig(t, ecPublic(t, s, pub), msg, sig)
}

func TestSOLoginWhileUserLoggedIn(t *testing.T) {
	t.Parallel()
	tok := testhsm.Take(t, 1)[0]
	s := open(t, specOf(tok))
	ctx := ctxT(t)
	err := s.Login(ctx, pkcs11.CKU_SO, secret.PINFromString(tok.SOPIN))
	if !errors.Is(err, pkcs11.Error(pkcs11.CKR_USER_ANOTHER_ALREADY_LOGGED_IN)) || slot.ClassOf(err) != slot.ClassLogin {
		t.Fatalf("SO login while the user is logged in: %v (class %v); want CKR_USER_ANOTHER_ALREADY_LOGGED_IN, login", err, slot.ClassOf(err))
	}
	if err := s.Logout(ctx); err != nil {
		t.Fatalf("Logout: %v", err)
	}
	if err := s.Login(ctx, pkcs11.CKU_SO, secret.PINFromString(tok.SOPIN)); err != nil {
		t.Fatalf("SO login: %v", err)
	}
	if s.LoggedIn() {
		t.Fatalf("LoggedIn() reports a user login while the SO is logged in")
	}
}

// A SoftHSM login that meets another process's login rewriting the
// token's store (CKR_GENERAL_ERROR, CKR_USER_PIN_NOT_INITIALIZED: forked
// children that each start a helper log in at once) is asked again, and
// succeeds; a refused PIN is asked once only.
func TestTornLoginIsAskedAgain(t *testing.T) {
	t.Parallel()
	tok := testhsm.Take(t, 1)[0]
	spec := specOf(tok)
	spec.PIN = secret.PIN{}
	s, f := openFaulty(t, tok, spec)
	ctx := ctxT(t)
	for _, torn := range []uint{pkcs11.CKR_GENERAL_ERROR, pkcs11.CKR_USER_PIN_NOT_INITIALIZED} {
		f.FailN(tok.Name, slot.OpLogin, pkcs11.Error(torn), 2)
		before := f.Calls(tok.Name, slot.OpLogin)
		if err := s.Login(ctx, pkcs11.CKU_USER, secret.PINFromString(tok.UserPIN)); err != nil {
			t.Fatalf("Login after two torn reads (0x%x): %v", torn, err)
		}
		if n := f.Calls(tok.Name, slot.OpLogin) - before; n != 3 {
			t.Errorf("%d C_Login calls, want 3 (two torn reads, 0x%x, then the login)", n, torn)
		}
		if !s.LoggedIn() {
			t.Errorf("not logged in after the torn reads (0x%x)", torn)
		}
		if err := s.Logout(ctx); err != nil {
			t.Fatal(err)
		}
	}
	f.FailN(tok.Name, slot.OpLogin, pkcs11.Error(pkcs11.CKR_PIN_INCORRECT), 1)
	before := f.Calls(tok.Name, slot.OpLogin)
	if err := s.Login(ctx, pkcs11.CKU_USER, secret.PINFromString(tok.UserPIN)); slot.CodeOf(err) != pkcs11.CKR_PIN_INCORRECT {
		t.Fatalf("Login with the PIN refused: %v, want CKR_PIN_INCORRECT", err)
	}
	if n := f.Calls(tok.Name, slot.OpLogin) - before; n != 1 {
		t.Errorf("a refused PIN was offered %d times, want once", n)
	}
}
