package group

import (
	"bytes"
	"errors"
	"testing"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group/opstate"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
)

// importedMACKey makes the fixture's members hold one HMAC key and returns its
// handle in the group.
func importedMACKey(t *testing.T, f *fixture, s *Session) ObjectHandle {
	t.Helper()
	importSecret(t, f.toks, "mac")
	keys, err := s.Find(testContext(t), []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, "mac")})
	if err != nil || len(keys) != 1 {
		t.Fatalf("find the MAC key: %v, %d found", err, len(keys))
	}
	return keys[0]
}

// TestInitFailsOverBeforeOutput: SignInit goes to the primary at once;
// the primary then dies before the operation produced anything, and Sign
// still succeeds: the Init is sent again, with its parameters, to the
// next member, in one call with the Sign (the single-part route a proven
// Init takes). The MAC is the one the key gives.
func TestInitFailsOverBeforeOutput(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{interceptor: faults, policy: config.PolicyPrimaryBackup})
	ctx := testContext(t)
	s := openSession(t, f.g)
	key := importedMACKey(t, f, s)
	mech := pkcs11.NewMechanism(pkcs11.CKM_SHA256_HMAC, nil)
	primary := f.g.Primary()
	if err := s.SignInit(ctx, mech, key); err != nil {
		t.Fatal(err)
	}
	if n := faults.Calls(primary, slot.OpSignInit); n != 1 {
		t.Fatalf("the primary took %d SignInit calls at SignInit, want 1", n)
	}
	faults.FailAll(primary, errDevice)
	mac, err := s.Sign(ctx, []byte("failover"))
	if err != nil {
		t.Fatalf("Sign after the Init's member died: %v", err)
	}
	inits, signs := 0, 0
	for _, tok := range f.toks {
		if tok.Name != primary {
			inits += faults.Calls(tok.Name, slot.OpSignInit)
			signs += faults.Calls(tok.Name, slot.OpSign)
		}
	}
	if inits != 0 || signs != 1 {
		t.Errorf("the other members took %d SignInit and %d Sign calls, want 0 and 1 (the re-sent Init and the Sign in one call)", inits, signs)
	}
	if err := s.VerifyInit(ctx, mech, key); err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(ctx, []byte("failover"), mac); err != nil {
		t.Errorf("the MAC made after the failover does not verify: %v", err)
	}
}

// TestProvenInitIsNotSent: an Init a member accepted is not sent again
// until the data call (which then runs in one call from a pool), and is
// sent at the Init again after a logout and login, and after any object
// changed. A refused Init proves nothing.
func TestProvenInitIsNotSent(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{interceptor: faults, policy: config.PolicyPrimaryBackup})
	ctx := testContext(t)
	s := openSession(t, f.g)
	key := importedMACKey(t, f, s)
	primary := f.g.Primary()
	mech := pkcs11.NewMechanism(pkcs11.CKM_SHA256_HMAC, nil)
	initsAt := func(what string, want int) {
		t.Helper()
		before := faults.Calls(primary, slot.OpSignInit)
		if err := s.SignInit(ctx, mech, key); err != nil {
			t.Fatalf("%s: SignInit: %v", what, err)
		}
		if got := faults.Calls(primary, slot.OpSignInit) - before; got != want {
			t.Errorf("%s: SignInit sent %d Init calls, want %d", what, got, want)
		}
		if _, err := s.Sign(ctx, []byte("data")); err != nil {
			t.Fatalf("%s: Sign: %v", what, err)
		}
	}
	initsAt("first Init", 1)
	signs := faults.Calls(primary, slot.OpSign)
	initsAt("the same Init again", 0)
	if faults.Calls(primary, slot.OpSign) != signs+1 {
		t.Errorf("the proven Init's Sign did not run as one pooled call")
	}
	if err := f.g.Logout(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.g.Login(ctx, pkcs11.CKU_USER, pinOf(f.toks[0].UserPIN)); err != nil {
		t.Fatal(err)
	}
	initsAt("after a new login", 1)
	if _, err := s.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), aesTemplate("change")); err != nil {
		t.Fatal(err)
	}
	initsAt("after an object was made", 1)

	short := pkcs11.NewMechanism(pkcs11.CKM_SHA256_HMAC_GENERAL, []byte{1}) // a parameter: never proven
	for range 2 {
		before := faults.Calls(primary, slot.OpSignInit)
		err := s.SignInit(ctx, short, key)
		if got := faults.Calls(primary, slot.OpSignInit) - before; got != 1 {
			t.Errorf("an Init with a parameter sent %d Init calls, want 1 (%v)", got, err)
		}
		if err == nil {
			if _, err := s.Sign(ctx, []byte("data")); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestBufferConvention: a length query and a short buffer keep the
// output and the operation, through the virtual session and through a
// member's own session (the same state machine); the call with room
// delivers the same bytes and ends the operation; an empty output is
// delivered as empty, not as nothing.
func TestBufferConvention(t *testing.T) {
	f := setup(t, setupOpts{})
	ctx := testContext(t)
	s := openSession(t, f.g)
	key := importedMACKey(t, f, s)
	ss, err := f.g.view().members[0].Slot().OpenSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d := opstate.NewDirect(ctx, ss)
	defer d.Close()
	hs, err := ss.FindObjects(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, "mac")})
	if err != nil || len(hs) != 1 {
		t.Fatalf("find the MAC key on the member: %v, %d", err, len(hs))
	}
	mech := pkcs11.NewMechanism(pkcs11.CKM_SHA256_HMAC, nil)
	inits := map[string]func() error{
		"virtual": func() error { return s.Init(ctx, OpSign, mech, key) },
		"direct":  func() error { return d.Init(ctx, OpSign, mech, hs[0]) },
	}
	dos := map[string]func(Room) ([]byte, error){
		"virtual": func(r Room) ([]byte, error) { return s.Do(ctx, OpSign, StepSingle, []byte("data"), nil, r) },
		"direct":  func(r Room) ([]byte, error) { return d.Do(ctx, OpSign, StepSingle, []byte("data"), nil, r) },
	}
	var macs [][]byte
	for _, kind := range []string{"virtual", "direct"} {
		if err := inits[kind](); err != nil {
			t.Fatalf("%s: Init: %v", kind, err)
		}
		q, err := dos[kind](RoomQuery)
		if err != nil || len(q) != 32 {
			t.Fatalf("%s: length query: %d bytes, %v; want 32, nil", kind, len(q), err)
		}
		short, err := dos[kind](Room(31))
		if !errors.Is(err, opstate.ErrBufferTooSmall) || len(short) != 32 {
			t.Fatalf("%s: a 31-byte buffer: %d bytes, %v; want 32, opstate.ErrBufferTooSmall", kind, len(short), err)
		}
		mac, err := dos[kind](Room(32))
		if err != nil || !bytes.Equal(mac, q) {
			t.Fatalf("%s: the delivery %x, %v; want the queried %x", kind, mac, err, q)
		}
		if _, err := dos[kind](RoomAny); !errors.Is(err, opstate.ErrNotInitialized) {
			t.Errorf("%s: Sign after the delivery: %v, want opstate.ErrNotInitialized", kind, err)
		}
		macs = append(macs, mac)
	}
	if !bytes.Equal(macs[0], macs[1]) {
		t.Errorf("the virtual session's MAC %x differs from the member's %x", macs[0], macs[1])
	}

	// AES-CBC-PAD decryption of one whole block: the Update holds it
	// back and yields nothing; the Final yields the 0-byte plaintext.
	aes, err := s.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), aesTemplate("conv"))
	if err != nil {
		t.Fatal(err)
	}
	cbc := pkcs11.NewMechanism(pkcs11.CKM_AES_CBC_PAD, make([]byte, 16))
	if err := s.EncryptInit(ctx, cbc, aes); err != nil {
		t.Fatal(err)
	}
	ct, err := s.Encrypt(ctx, nil)
	if err != nil || len(ct) != 16 {
		t.Fatalf("encrypt nothing: %d bytes, %v", len(ct), err)
	}
	if err := s.DecryptInit(ctx, cbc, aes); err != nil {
		t.Fatal(err)
	}
	out, err := s.Do(ctx, OpDecrypt, StepUpdate, ct, nil, RoomQuery)
	if err != nil || out == nil || len(out) != 0 {
		t.Fatalf("DecryptUpdate length query: %v (nil: %t), %v; want empty", out, out == nil, err)
	}
	if out, err = s.DecryptUpdate(ctx, ct); err != nil || len(out) != 0 {
		t.Fatalf("DecryptUpdate: %x, %v", out, err)
	}
	out, err = s.Do(ctx, OpDecrypt, StepFinal, nil, nil, RoomQuery)
	if err != nil || out == nil || len(out) != 0 {
		t.Fatalf("DecryptFinal length query: %v (nil: %t), %v; want empty", out, out == nil, err)
	}
	if _, err := s.Do(ctx, OpDecrypt, StepFinal, nil, nil, Room(0)); err != nil {
		t.Fatalf("DecryptFinal into no room: %v", err)
	}
	if _, err := s.DecryptFinal(ctx); !errors.Is(err, opstate.ErrNotInitialized) {
		t.Errorf("DecryptFinal after the delivery: %v, want opstate.ErrNotInitialized", err)
	}
}
