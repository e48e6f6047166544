package group

import (
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
)

// The probe's doubt is SoftHSM's (it answers C_GetTokenInfo with
// CKR_GENERAL_ERROR while another process logs in): there one such
// answer fails nobody and a second does; from another make (NSS softokn)
// the first fails the member, as any device error would.
func TestProbeDoubtIsSoftHSMs(t *testing.T) {
	soft := testhsm.Take(t, 1)[0]
	nss := testhsm.NSS(t, "nss-probe")
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{toks: []testhsm.Token{soft, nss}, noDomain: true, policy: config.PolicyRoundRobin, interceptor: faults})
	ctx := testContext(t)
	general := pkcs11.Error(pkcs11.CKR_GENERAL_ERROR)
	for _, name := range []string{soft.Name, nss.Name} {
		faults.FailN(name, slot.OpTokenInfo, general, 1)
		if _, err := f.g.Probe(ctx, name); CodeOf(err) != pkcs11.CKR_GENERAL_ERROR {
			t.Fatalf("probe of %s: %v, want CKR_GENERAL_ERROR", name, err)
		}
	}
	if st := memberState(f.g, soft.Name); st != member.Active {
		t.Errorf("SoftHSM member after one ambiguous probe: %v, want active (doubted)", st)
	}
	if st := memberState(f.g, nss.Name); st != member.Failed {
		t.Errorf("NSS member after one ambiguous probe: %v, want failed", st)
	}
	faults.FailN(soft.Name, slot.OpTokenInfo, general, 1)
	f.g.Probe(ctx, soft.Name)
	if st := memberState(f.g, soft.Name); st != member.Failed {
		t.Errorf("SoftHSM member after a second ambiguous probe: %v, want failed", st)
	}
}

// NSS softokn answers CKR_HOST_MEMORY to an Init it cannot make a context
// for (CKM_AES_CBC_PAD without an IV): through a group of one NSS member
// the application gets that answer, as from the bare token, and the member
// serves on (it was failed, and every later call of a one-member group
// answered CKR_DEVICE_ERROR). From SoftHSM the same code is a health
// answer: the member is failed.
func TestHostMemoryIsNSSsRequestAnswer(t *testing.T) {
	ctx := testContext(t)
	nss := testhsm.NSS(t, "nss-hostmem")
	f := setup(t, setupOpts{toks: []testhsm.Token{nss}, noDomain: true})
	s := openSession(t, f.g)
	aes, err := s.CreateObject(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
		attr(pkcs11.CKA_TOKEN, false), attr(pkcs11.CKA_ENCRYPT, true), attr(pkcs11.CKA_VALUE, make([]byte, 16))})
	if err != nil {
		t.Fatal(err)
	}
	err = s.EncryptInit(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_CBC_PAD, nil), aes)
	if code := CodeOf(err); code != pkcs11.CKR_HOST_MEMORY {
		t.Fatalf("CBC-PAD without an IV through a group of one NSS member: %v (0x%x), want CKR_HOST_MEMORY as the bare token", err, code)
	}
	if st := memberState(f.g, nss.Name); st != member.Active {
		t.Fatalf("the NSS member is %v after answering a request CKR_HOST_MEMORY, want active", st)
	}
	if err := s.EncryptInit(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_CBC_PAD, make([]byte, 16)), aes); err != nil {
		t.Fatalf("a good Init after it: %v", err)
	}

	soft := testhsm.Take(t, 1)[0]
	faults := slottest.NewFaults()
	fs := setup(t, setupOpts{toks: []testhsm.Token{soft}, noDomain: true, interceptor: faults})
	ss := openSession(t, fs.g)
	key, err := ss.CreateObject(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
		attr(pkcs11.CKA_TOKEN, false), attr(pkcs11.CKA_ENCRYPT, true), attr(pkcs11.CKA_VALUE, make([]byte, 16))})
	if err != nil {
		t.Fatal(err)
	}
	faults.FailN(soft.Name, slot.OpEncryptInit, pkcs11.Error(pkcs11.CKR_HOST_MEMORY), 1)
	if err := ss.EncryptInit(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_ECB, nil), key); err == nil {
		t.Fatal("an Init the SoftHSM member answered CKR_HOST_MEMORY succeeded")
	}
	if st := memberState(fs.g, soft.Name); st == member.Active {
		t.Errorf("the SoftHSM member is still active after CKR_HOST_MEMORY, want it failed (a health answer there)")
	}
}

// NSS softokn cuts a MAC to the buffer it is given, with CKR_OK: through a
// group, an HMAC signed in a session whose last output was a 16-byte AES
// block is the whole 32-byte MAC, as on the bare token given room for it
// (the one-shot's first buffer was the session's last output length).
func TestNSSMACNotCutToTheLastOutput(t *testing.T) {
	ctx := testContext(t)
	nss := testhsm.NSS(t, "nss-mac")
	f := setup(t, setupOpts{toks: []testhsm.Token{nss}, noDomain: true})
	s := openSession(t, f.g)
	secret := func(kt uint, usage uint, value []byte) ObjectHandle {
		h, err := s.CreateObject(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, kt),
			attr(pkcs11.CKA_TOKEN, false), attr(usage, true), attr(pkcs11.CKA_VALUE, value)})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	aes := secret(pkcs11.CKK_AES, pkcs11.CKA_ENCRYPT, make([]byte, 16))
	hmac := secret(pkcs11.CKK_GENERIC_SECRET, pkcs11.CKA_SIGN, make([]byte, 32))
	for i := range 2 {
		if err := s.EncryptInit(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_ECB, nil), aes); err != nil {
			t.Fatal(err)
		}
		if ct, err := s.Encrypt(ctx, make([]byte, 16)); err != nil || len(ct) != 16 {
			t.Fatalf("AES-ECB of one block: %d bytes, %v", len(ct), err)
		}
		if err := s.SignInit(ctx, pkcs11.NewMechanism(pkcs11.CKM_SHA256_HMAC, nil), hmac); err != nil {
			t.Fatal(err)
		}
		mac, err := s.Sign(ctx, []byte("data"))
		if err != nil {
			t.Fatal(err)
		}
		if len(mac) != 32 {
			t.Fatalf("round %d: an HMAC-SHA256 through a group of one NSS member is %d bytes, want 32", i, len(mac))
		}
	}
}

// The virtual slot refuses at the Init only what the group withholds: a
// mechanism some serving members list and others do not, or a generation
// a member cannot hold. One no member lists is the members' to answer, as
// on the bare token (NSS softokn's database slot lists no digest and
// serves CKM_SHA256).
func TestWithholdsOnlyWhatTheGroupLeavesOut(t *testing.T) {
	ctx := testContext(t)
	soft := testhsm.Take(t, 1)[0]
	nss := testhsm.NSS(t, "nss-withholds")
	f := setup(t, setupOpts{toks: []testhsm.Token{soft, nss}, noDomain: true})
	one := setup(t, setupOpts{toks: []testhsm.Token{testhsm.Take(t, 1)[0]}, noDomain: true})
	cases := []struct {
		name string
		g    *Group
		mech uint
		want bool
	}{
		{"listed by SoftHSM only", f.g, pkcs11.CKM_SHA256, true},
		{"a generation NSS cannot hold from SoftHSM", f.g, pkcs11.CKM_EC_KEY_PAIR_GEN, true},
		{"listed by no member", f.g, 0x8fffff01, false},
		{"listed by every member", f.g, pkcs11.CKM_SHA256_HMAC, false},
		{"one member, unlisted", one.g, 0x8fffff01, false},
	}
	for _, c := range cases {
		got, err := c.g.Withholds(ctx, c.mech)
		if err != nil || got != c.want {
			t.Errorf("%s: Withholds(0x%x) = %v, %v; want %v", c.name, c.mech, got, err, c.want)
		}
	}
}
