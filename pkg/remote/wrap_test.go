package remote_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// kek creates the same AES-256 key-encryption key (value kv) on s.
func kek(t *testing.T, s *slot.Slot, kv []byte) pkcs11.ObjectHandle {
	t.Helper()
	h, err := s.CreateObject(ctxT(t), []*pkcs11.Attribute{
		attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
		attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SENSITIVE, true),
		attr(pkcs11.CKA_WRAP, true), attr(pkcs11.CKA_UNWRAP, true), attr(pkcs11.CKA_VALUE, kv),
		attr(pkcs11.CKA_LABEL, "kek"),
	})
	if err != nil {
		t.Fatalf("%s: create KEK: %v", s.Name(), err)
	}
	return h
}

// unwrapEC unwraps an EC private key blob on s under k.
func unwrapEC(t *testing.T, s *slot.Slot, k pkcs11.ObjectHandle, blob []byte, label string) pkcs11.ObjectHandle {
	t.Helper()
	h, err := s.UnwrapKey(ctxT(t), pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP_PAD, nil), k, blob, []*pkcs11.Attribute{
		attr(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_EC),
		attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SENSITIVE, true),
		attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_EXTRACTABLE, true), attr(pkcs11.CKA_LABEL, label),
	})
	if err != nil {
		t.Fatalf("%s: unwrap EC private key with CKM_AES_KEY_WRAP_PAD: %v", s.Name(), err)
	}
	return h
}

// An EC private key moves, wrapped with CKM_AES_KEY_WRAP_PAD, from a local
// token to a served one and back; each copy signs what the original's
// public key verifies. (p11-kit's RPC refuses this mechanism.)
func TestWrapPadLocalRemote(t *testing.T) {
	local := open(t, testhsm.Take(t, 1)[0], 20*time.Second)
	srv := testhsm.ServeRemote(t, "wrap")
	rem := open(t, srv.Token(), 20*time.Second)

	kv := bytes.Repeat([]byte{0x5a}, 32)
	kl, kr := kek(t, local, kv), kek(t, rem, kv)
	wrap := pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP_PAD, nil)

	// Local to remote.
	pub, priv := genEC(t, local, "from-local")
	blob, err := local.WrapKey(ctxT(t), wrap, kl, priv)
	if err != nil {
		t.Fatalf("local: wrap: %v", err)
	}
	got := unwrapEC(t, rem, kr, blob, "from-local")
	signVerify(t, rem, got, local, pub)

	// Remote to local.
	pub, priv = genEC(t, rem, "from-remote")
	blob, err = rem.WrapKey(ctxT(t), wrap, kr, priv)
	if err != nil {
		t.Fatalf("remote: wrap: %v", err)
	}
	got = unwrapEC(t, local, kl, blob, "from-remote")
	signVerify(t, local, got, rem, pub)

	// The copy's material is the original's: the same blob again.
	again, err := local.WrapKey(ctxT(t), wrap, kl, got)
	if err != nil {
		t.Fatalf("local: rewrap: %v", err)
	}
	if !bytes.Equal(again, blob) {
		t.Errorf("rewrapped copy differs from the original's blob")
	}
}

// CKA_UNWRAP_TEMPLATE travels as an attribute array: it is created over
// the remote, read back, and enforced by the served token on unwrap.
func TestNestedTemplateRemote(t *testing.T) {
	srv := testhsm.ServeRemote(t, "nested")
	s := open(t, srv.Token(), 20*time.Second)
	tmpl := []*pkcs11.Attribute{
		attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
		attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SENSITIVE, true),
		attr(pkcs11.CKA_WRAP, true), attr(pkcs11.CKA_UNWRAP, true), attr(pkcs11.CKA_LABEL, "kek-nested"),
		attr(pkcs11.CKA_VALUE, bytes.Repeat([]byte{7}, 32)),
	}
	unwrapTmpl := []*pkcs11.Attribute{attr(pkcs11.CKA_SENSITIVE, true), attr(pkcs11.CKA_EXTRACTABLE, false)}
	k, err := s.CreateObjectNested(ctxT(t), tmpl, map[uint][]*pkcs11.Attribute{pkcs11.CKA_UNWRAP_TEMPLATE: unwrapTmpl})
	if err != nil {
		t.Fatalf("CreateObjectNested over the remote: %v", err)
	}
	back, err := s.GetNestedAttribute(ctxT(t), k, pkcs11.CKA_UNWRAP_TEMPLATE)
	if err != nil {
		t.Fatalf("GetNestedAttribute over the remote: %v", err)
	}
	if len(back) != len(unwrapTmpl) {
		t.Fatalf("unwrap template read back has %d attributes, want %d", len(back), len(unwrapTmpl))
	}
	for i, a := range back {
		if a.Type != unwrapTmpl[i].Type || !bytes.Equal(a.Value, unwrapTmpl[i].Value) {
			t.Errorf("unwrap template attribute %d: 0x%X=%x, want 0x%X=%x", i, a.Type, a.Value, unwrapTmpl[i].Type, unwrapTmpl[i].Value)
		}
	}

	// The served token enforces the template on unwrap: asking for an
	// extractable key contradicts it and fails; a request matching it
	// yields a sensitive, non-extractable key.
	_, priv := genEC(t, s, "nested-src")
	blob, err := s.WrapKey(ctxT(t), pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP_PAD, nil), k, priv)
	if err != nil {
		t.Fatalf("wrap: %v", err)
	}
	base := []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_EC),
		attr(pkcs11.CKA_TOKEN, false), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SIGN, true)}
	if _, err := s.UnwrapKey(ctxT(t), pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP_PAD, nil), k, blob,
		append(base, attr(pkcs11.CKA_EXTRACTABLE, true), attr(pkcs11.CKA_SENSITIVE, true))); err == nil {
		t.Errorf("unwrap contradicting CKA_UNWRAP_TEMPLATE succeeded")
	}
	h, err := s.UnwrapKey(ctxT(t), pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP_PAD, nil), k, blob,
		append(base, attr(pkcs11.CKA_EXTRACTABLE, false), attr(pkcs11.CKA_SENSITIVE, true)))
	if err != nil {
		t.Fatalf("unwrap: %v", err)
	}
	as, err := s.GetAttributes(ctxT(t), h, []uint{pkcs11.CKA_EXTRACTABLE, pkcs11.CKA_SENSITIVE})
	if err != nil {
		t.Fatalf("read unwrapped key: %v", err)
	}
	if !bytes.Equal(as[0].Value, []byte{0}) || !bytes.Equal(as[1].Value, []byte{1}) {
		t.Errorf("unwrapped key: CKA_EXTRACTABLE=%x CKA_SENSITIVE=%x, want 00 and 01 from the unwrap template", as[0].Value, as[1].Value)
	}
}
