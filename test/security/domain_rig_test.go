package security

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/miekg/pkcs11"
)

// domainPool is the two tokens every domain test shares: each test works
// under a serial (and object labels) of its own, so the tests need no
// fresh tokens, and -count=N takes no more from the package's pool.
var domainPool struct {
	sync.Mutex
	toks []testhsm.Token
}

// domainTokens returns n (at most 2) of the shared tokens.
func domainTokens(t testing.TB, n int) []testhsm.Token {
	t.Helper()
	domainPool.Lock()
	defer domainPool.Unlock()
	if domainPool.toks == nil {
		domainPool.toks = testhsm.Take(t, 2)
	}
	return slices.Clone(domainPool.toks[:n])
}

// domainSerials makes each test's group serial unique in the process.
var domainSerials atomic.Int64

func domainSerial() string { return fmt.Sprintf("%d", 4100000+domainSerials.Add(1)) }

func domainContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// domainOpenUser opens tok directly, logged in as its user: the attacker,
// who holds the user PIN and talks to the member without the group.
func domainOpenUser(t testing.TB, tok testhsm.Token, name string) *slot.Slot {
	t.Helper()
	s, err := slot.Open(domainContext(t), slot.Spec{
		Name: tok.Name + "-" + name, Module: tok.Module, ModuleEnv: tok.ModuleEnv, TokenLabel: tok.Label,
		PIN: secret.PINFromString(tok.UserPIN), CommandTimeout: 20 * time.Second,
	})
	if err != nil {
		t.Fatalf("open %s: %v", tok.Name, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// domainInstall runs the ceremony (domainkey.Install) on toks.
func domainInstall(t testing.TB, serial string, toks []testhsm.Token, trusted bool) {
	t.Helper()
	var targets []domainkey.Target
	for _, tok := range toks {
		dt := domainkey.Target{Slot: domainOpenUser(t, tok, "ceremony")}
		if trusted {
			dt.SOPIN = secret.PINFromString(tok.SOPIN)
			dt.UserPIN = secret.PINFromString(tok.UserPIN)
		}
		targets = append(targets, dt)
	}
	if err := domainkey.Install(domainContext(t), targets, serial); err != nil {
		t.Fatalf("install domain key: %v", err)
	}
}

// domainOldTemplate is the domain key as the ceremony made it before it
// was hardened: wrap and unwrap only, sensitive, unextractable, with the
// unwrap template, but modifiable and copyable (the token's defaults) and
// any mechanism allowed.
func domainOldTemplate(label string, value []byte) []*pkcs11.Attribute {
	return []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY),
		pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
		pkcs11.NewAttribute(pkcs11.CKA_VALUE, value),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, label),
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
		pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
		pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true),
		pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, false),
		pkcs11.NewAttribute(pkcs11.CKA_WRAP, true),
		pkcs11.NewAttribute(pkcs11.CKA_UNWRAP, true),
		pkcs11.NewAttribute(pkcs11.CKA_ENCRYPT, false),
		pkcs11.NewAttribute(pkcs11.CKA_DECRYPT, false),
		pkcs11.NewAttribute(pkcs11.CKA_SIGN, false),
		pkcs11.NewAttribute(pkcs11.CKA_VERIFY, false),
		pkcs11.NewAttribute(pkcs11.CKA_DERIVE, false),
	}
}

// domainHardTemplate is a domain key with the protection the ceremony
// gives it now, for a test that needs a sound key of a known value.
func domainHardTemplate(label string, value []byte) []*pkcs11.Attribute {
	mechs := binary.NativeEndian.AppendUint64(nil, uint64(pkcs11.CKM_AES_KEY_WRAP_PAD))
	return append(domainOldTemplate(label, value),
		pkcs11.NewAttribute(pkcs11.CKA_MODIFIABLE, false),
		pkcs11.NewAttribute(pkcs11.CKA_COPYABLE, false),
		pkcs11.NewAttribute(pkcs11.CKA_ALLOWED_MECHANISMS, mechs))
}

// domainCreate creates a domain key from tmpl, with the unwrap template
// forcing CKA_SENSITIVE, on s as the user.
func domainCreate(t testing.TB, s *slot.Slot, tmpl []*pkcs11.Attribute) pkcs11.ObjectHandle {
	t.Helper()
	h, err := s.CreateObjectNested(domainContext(t), tmpl, map[uint][]*pkcs11.Attribute{
		pkcs11.CKA_UNWRAP_TEMPLATE: {pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true)},
	})
	if err != nil {
		t.Fatalf("%s: create domain key: %v", s.Name(), err)
	}
	return h
}

// domainValue is a fresh AES-256 value.
func domainValue(t testing.TB) []byte {
	v := make([]byte, 32)
	if _, err := rand.Read(v); err != nil {
		t.Fatal(err)
	}
	return v
}

// domainFind returns the one domain key of serial on s.
func domainFind(t testing.TB, s *slot.Slot, serial string) pkcs11.ObjectHandle {
	t.Helper()
	h, err := domainkey.Find(domainContext(t), s, serial)
	if err != nil {
		t.Fatalf("%s: %v", s.Name(), err)
	}
	return h
}

// domainCode is the CKR code of err (CKR_OK for nil).
func domainCode(err error) uint {
	var e pkcs11.Error
	if errors.As(err, &e) {
		return uint(e)
	}
	if err == nil {
		return pkcs11.CKR_OK
	}
	return slot.CodeOf(err)
}

// domainWantCode fails the test unless err carries the CKR code want.
func domainWantCode(t testing.TB, what string, err error, want uint) {
	t.Helper()
	if got := domainCode(err); got != want {
		t.Errorf("%s: CKR 0x%x (%v), want 0x%x (%v)", what, got, err, want, pkcs11.Error(want))
	}
}

// domainEvents keeps a group's events.
type domainEvents struct {
	mu  sync.Mutex
	all []group.Event
}

func (l *domainEvents) Event(e group.Event) {
	l.mu.Lock()
	l.all = append(l.all, e)
	l.mu.Unlock()
}

func (l *domainEvents) of(kind group.EventKind) []group.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []group.Event
	for _, e := range l.all {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// domainOpenGroup opens a group of toks (in order: the first is the
// primary) for serial, logged in with the user PIN.
func domainOpenGroup(t testing.TB, serial string, toks []testhsm.Token) (*group.Group, *domainEvents) {
	t.Helper()
	cfg := config.Group{Label: "domain-" + serial, Serial: serial}
	for _, tok := range toks {
		cfg.Members = append(cfg.Members, config.Member{Name: tok.Name, Module: tok.Module, ModuleEnv: tok.ModuleEnv, TokenLabel: tok.Label})
	}
	set := config.Defaults()
	set.CommandTimeout = 20 * time.Second
	ev := &domainEvents{}
	g, err := group.Open(domainContext(t), cfg, set, group.Options{Events: ev})
	if err != nil {
		t.Fatalf("open group: %v", err)
	}
	t.Cleanup(func() { g.Close() })
	if err := g.Login(domainContext(t), pkcs11.CKU_USER, secret.PINFromString(toks[0].UserPIN)); err != nil {
		t.Fatalf("group login: %v", err)
	}
	return g, ev
}

var domainP256 = []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}

// domainGenEC makes a P-256 token key pair labelled label through the
// group, as an application would.
func domainGenEC(ctx context.Context, g *group.Group, label string) error {
	s, err := g.OpenSession(ctx, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		return err
	}
	defer s.Close()
	_, _, err = s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, domainP256), pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
			pkcs11.NewAttribute(pkcs11.CKA_VERIFY, true), pkcs11.NewAttribute(pkcs11.CKA_LABEL, label)},
		[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true), pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
			pkcs11.NewAttribute(pkcs11.CKA_SIGN, true), pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true), pkcs11.NewAttribute(pkcs11.CKA_LABEL, label)})
	return err
}

// domainFindKey lists the objects of class labelled label on s.
func domainFindKey(t testing.TB, s *slot.Slot, class uint, label string) []pkcs11.ObjectHandle {
	t.Helper()
	hs, err := s.FindObjects(domainContext(t), []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, class), pkcs11.NewAttribute(pkcs11.CKA_LABEL, label)})
	if err != nil {
		t.Fatalf("%s: find %q: %v", s.Name(), label, err)
	}
	return hs
}

// domainUnwrapWithOracle undoes RFC 5649 (AES key wrap with padding) on
// blob with nothing but a raw AES block decryption: the attacker's
// C_Decrypt(CKM_AES_ECB) under a domain key given CKA_DECRYPT. It returns
// the wrapped key's bytes, or an error at the first refused step.
func domainUnwrapWithOracle(blob []byte, decrypt func(block []byte) ([]byte, error)) ([]byte, error) {
	if len(blob) < 16 || len(blob)%8 != 0 {
		return nil, fmt.Errorf("blob of %d bytes is no RFC 5649 blob", len(blob))
	}
	n := len(blob)/8 - 1
	var a [8]byte
	r := make([][8]byte, n)
	if n == 1 {
		b, err := decrypt(blob)
		if err != nil {
			return nil, err
		}
		copy(a[:], b[:8])
		copy(r[0][:], b[8:16])
	} else {
		copy(a[:], blob[:8])
		for i := range r {
			copy(r[i][:], blob[8*(i+1):])
		}
		for j := 5; j >= 0; j-- {
			for i := n; i >= 1; i-- {
				t := uint64(n*j + i)
				var in [16]byte
				binary.BigEndian.PutUint64(in[:8], binary.BigEndian.Uint64(a[:])^t)
				copy(in[8:], r[i-1][:])
				b, err := decrypt(in[:])
				if err != nil {
					return nil, err
				}
				copy(a[:], b[:8])
				copy(r[i-1][:], b[8:16])
			}
		}
	}
	if !bytes.Equal(a[:4], []byte{0xa6, 0x59, 0x59, 0xa6}) {
		return nil, fmt.Errorf("integrity check %x: not the key the blob was wrapped under", a[:4])
	}
	mli := int(binary.BigEndian.Uint32(a[4:]))
	var out []byte
	for _, b := range r {
		out = append(out, b[:]...)
	}
	if mli > len(out) {
		return nil, fmt.Errorf("message length %d beyond the %d bytes unwrapped", mli, len(out))
	}
	return out[:mli], nil
}
