package login

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// Four tests of two tokens each, for -count=3.
func TestMain(m *testing.M) { os.Exit(testhsm.Main(m, 24)) }

// rig is two real members, logged out: m0 without a PIN source of its
// own, m1 with one holding the tokens' PIN. It counts each member's
// C_Logins.
type rig struct {
	ms     []*member.Member
	mu     sync.Mutex
	logins map[string]int
	// general holds the members whose C_Login answers CKR_GENERAL_ERROR
	// without reaching the token.
	general map[*member.Member]bool
	st      *State
}

func newRig(t *testing.T, guard Guard) *rig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := &rig{logins: map[string]int{}, general: map[*member.Member]bool{}}
	for i, tok := range testhsm.Take(t, 2) {
		s, err := slot.Open(ctx, slot.Spec{Name: tok.Name, Module: tok.Module, ModuleEnv: tok.ModuleEnv, TokenLabel: tok.Label, CommandTimeout: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		m, err := member.New(member.Config{Name: tok.Name, Index: i}, s, member.Active, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.ms = append(r.ms, m)
	}
	r.st = New(guard, Members{
		OwnPIN: func(m *member.Member) func() (secret.PIN, error) {
			if m != r.ms[1] {
				return nil
			}
			return func() (secret.PIN, error) { return secret.PINFromString(testhsm.UserPIN), nil }
		},
		Login: func(ctx context.Context, m *member.Member, userType uint, pin secret.PIN) error {
			r.mu.Lock()
			r.logins[m.Name()]++
			general := r.general[m]
			r.mu.Unlock()
			if general {
				return pkcs11.Error(pkcs11.CKR_GENERAL_ERROR)
			}
			err := m.Slot().Login(ctx, userType, pin)
			if slot.CodeOf(err) == pkcs11.CKR_USER_ALREADY_LOGGED_IN {
				return nil
			}
			return err
		},
		Fail: func(m *member.Member, err error) { m.Fail(err) },
	})
	return r
}

func (r *rig) count(m *member.Member) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.logins[m.Name()]
}

// A wrong PIN is tried on one member only — the one without a PIN source
// of its own — and its refusal is final: no other token sees the PIN.
func TestWrongPINReachesOneMember(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, nil)
	r.st.Lock()
	defer r.st.Unlock()
	_, err := r.st.Prove(ctx, r.ms, pkcs11.CKU_USER, secret.PINFromString("wrong-pin-0000"))
	var refused *RefusedError
	if !errors.As(err, &refused) || refused.Member != r.ms[0].Name() || !slot.PINRefused(err) {
		t.Fatalf("Prove with a wrong PIN: %v; want %s's refusal", err, r.ms[0].Name())
	}
	if n0, n1 := r.count(r.ms[0]), r.count(r.ms[1]); n0 != 1 || n1 != 0 {
		t.Fatalf("C_Logins: %s %d, %s %d; want 1 and 0", r.ms[0].Name(), n0, r.ms[1].Name(), n1)
	}
	checked, err := r.st.Prove(ctx, r.ms, pkcs11.CKU_USER, secret.PINFromString(testhsm.UserPIN))
	if err != nil || checked != r.ms[0] {
		t.Fatalf("Prove with the PIN: %v, %v; want %s", checked, err, r.ms[0].Name())
	}
	if n, err := r.st.LoginAll(ctx, r.ms[1:], pkcs11.CKU_USER, secret.PIN{}, true); n != 1 || err != nil {
		t.Fatalf("LoginAll of the member with its own PIN source: %d, %v", n, err)
	}
	if !r.ms[1].Slot().LoggedIn() {
		t.Fatal("the member with its own PIN source is not logged in")
	}
}

// The application's PIN is kept only while a member without its own PIN
// source needs it, and a member without one gets ErrNoPIN when none is
// kept.
func TestPINKeptOnlyWhenNeeded(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, nil)
	r.st.Lock()
	defer r.st.Unlock()
	pin := secret.PINFromString(testhsm.UserPIN)
	r.st.Set(pkcs11.CKU_USER, pin, true, r.ms[1:])
	if r.st.KeepsPIN() {
		t.Fatal("the PIN is kept though every member has its own source")
	}
	if err := r.st.Relogin(ctx, r.ms[0], pkcs11.CKU_USER); !errors.Is(err, ErrNoPIN) {
		t.Fatalf("Relogin of a member without a PIN source, none kept: %v, want ErrNoPIN", err)
	}
	if n := r.count(r.ms[0]); n != 0 {
		t.Fatalf("%d C_Logins without a PIN", n)
	}
	r.st.Set(pkcs11.CKU_USER, pin, true, r.ms)
	if !r.st.KeepsPIN() {
		t.Fatal("the PIN is not kept though a member has no source of its own")
	}
	if err := r.st.Relogin(ctx, r.ms[0], pkcs11.CKU_USER); err != nil || !r.ms[0].Slot().LoggedIn() {
		t.Fatalf("Relogin with the kept PIN: %v", err)
	}
	r.st.Clear()
	if _, in := r.st.LoggedIn(); in || r.st.KeepsPIN() {
		t.Fatalf("after Clear: logged in %v, PIN kept %v", in, r.st.KeepsPIN())
	}
}

// guard is an in-memory PIN guard, as pkg/recover's PINBlocks is on disk.
type guard struct {
	mu      sync.Mutex
	refused map[string]error
}

func (g *guard) Blocked(m string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.refused[m]
}

func (g *guard) Refused(m string, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.refused[m] = err
}

// A token that refuses the PIN a member is logged in with is told to the
// guard, and the member is not offered a PIN again.
func TestRefusedPINNotOfferedAgain(t *testing.T) {
	ctx := context.Background()
	g := &guard{refused: map[string]error{}}
	r := newRig(t, g)
	r.st.Lock()
	defer r.st.Unlock()
	m := r.ms[0]
	if err := r.st.Member(ctx, m, pkcs11.CKU_USER, secret.PINFromString("wrong-pin-0000")); !slot.PINRefused(err) {
		t.Fatalf("Member with a wrong PIN: %v", err)
	}
	if g.Blocked(m.Name()) == nil {
		t.Fatal("the guard was not told of the refusal")
	}
	if err := r.st.Member(ctx, m, pkcs11.CKU_USER, secret.PINFromString(testhsm.UserPIN)); err == nil {
		t.Fatal("a blocked member was logged in")
	}
	if n := r.count(m); n != 1 {
		t.Fatalf("%d C_Logins, want 1: a blocked member is not asked", n)
	}
}

// An ambiguous answer to a login (CKR_GENERAL_ERROR) fails a member only
// once another member took the same login: the PIN's proof passes on to
// the next member and fails the first when the next takes it; when every
// member answers so, no member is failed and the token's answer is final.
// The same for the members' own logins with nothing proved before.
func TestAmbiguousLoginFailsAMemberOnlyWhenAnotherServes(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, nil)
	r.st.Lock()
	defer r.st.Unlock()
	pin := secret.PINFromString(testhsm.UserPIN)
	serving := func(when string, want ...bool) {
		t.Helper()
		for i, m := range r.ms {
			if got := m.State().Serving(); got != want[i] {
				t.Fatalf("%s: member %s serving %v, want %v", when, m.Name(), got, want[i])
			}
		}
	}
	r.general[r.ms[0]], r.general[r.ms[1]] = true, true
	_, err := r.st.Prove(ctx, r.ms, pkcs11.CKU_USER, pin)
	var refused *RefusedError
	if !errors.As(err, &refused) || slot.CodeOf(err) != pkcs11.CKR_GENERAL_ERROR {
		t.Fatalf("Prove answered CKR_GENERAL_ERROR by every member: %v, want the token's answer", err)
	}
	if n0, n1 := r.count(r.ms[0]), r.count(r.ms[1]); n0 != 1 || n1 != 1 {
		t.Fatalf("C_Logins: %d and %d, want the proof passed on once", n0, n1)
	}
	serving("after every member answered CKR_GENERAL_ERROR to the proof", true, true)
	if n, err := r.st.LoginAll(ctx, r.ms[1:], pkcs11.CKU_USER, secret.PIN{}, false); n != 0 || slot.CodeOf(err) != pkcs11.CKR_GENERAL_ERROR {
		t.Fatalf("LoginAll answered CKR_GENERAL_ERROR, nothing proved: %d, %v", n, err)
	}
	serving("after the own-PIN login every member answered CKR_GENERAL_ERROR", true, true)

	r.general[r.ms[1]] = false
	checked, err := r.st.Prove(ctx, r.ms, pkcs11.CKU_USER, pin)
	if err != nil || checked != r.ms[1] {
		t.Fatalf("Prove with %s answering CKR_GENERAL_ERROR: %v, %v; want %s to prove it", r.ms[0].Name(), checked, err, r.ms[1].Name())
	}
	serving("after another member proved the PIN", false, true)

	r.general[r.ms[1]] = true
	if n, err := r.st.LoginAll(ctx, r.ms[1:], pkcs11.CKU_USER, secret.PIN{}, true); n != 0 || err == nil {
		t.Fatalf("LoginAll answered CKR_GENERAL_ERROR after the proof: %d, %v", n, err)
	}
	serving("after a CKR_GENERAL_ERROR to a login another member took", false, false)
}
