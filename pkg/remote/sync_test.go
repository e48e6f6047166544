package remote_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/sync"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// A group's domain key is installed (trusted: SO ceremony with the nested
// CKA_UNWRAP_TEMPLATE) on a local member and a served one, and keys made
// on the local member are replicated to the served one, wrapped under the
// domain key with CKM_AES_KEY_WRAP_PAD: what p11-kit's RPC cannot carry.
func TestReplicateToRemoteMember(t *testing.T) {
	ltok := testhsm.Take(t, 1)[0]
	srv := testhsm.ServeRemote(t, "repl")
	rtok := srv.Token()
	local, rem := open(t, ltok, 20*time.Second), open(t, rtok, 20*time.Second)
	const serial = "4242"
	err := domainkey.Install(ctxT(t), []domainkey.Target{
		{Slot: local, SOPIN: secret.PINFromString(ltok.SOPIN), UserPIN: secret.PINFromString(ltok.UserPIN)},
		{Slot: rem, SOPIN: secret.PINFromString(rtok.SOPIN), UserPIN: secret.PINFromString(rtok.UserPIN)},
	}, serial)
	if err != nil {
		t.Fatalf("domainkey.Install on a local and a served member: %v", err)
	}
	if _, err := domainkey.Find(ctxT(t), rem, serial); err != nil {
		t.Fatalf("served member: domain key: %v", err)
	}

	r := &sync.Replicator{GroupSerial: serial}
	pub, priv := genEC(t, local, "replicated")
	rpriv, err := r.Replicate(ctxT(t), local, priv, sync.Target{Slot: rem})
	if err != nil {
		t.Fatalf("replicate the EC private key to the served member: %v", err)
	}
	rpub, err := r.Replicate(ctxT(t), local, pub, sync.Target{Slot: rem})
	if err != nil {
		t.Fatalf("replicate the EC public key to the served member: %v", err)
	}
	signVerify(t, rem, rpriv, local, pub)
	signVerify(t, local, priv, rem, rpub)
	for _, h := range [][2]pkcs11.ObjectHandle{{priv, rpriv}, {pub, rpub}} {
		a, err := object.Fingerprint(ctxT(t), local, h[0])
		if err != nil {
			t.Fatalf("local fingerprint: %v", err)
		}
		b, err := object.Fingerprint(ctxT(t), rem, h[1])
		if err != nil {
			t.Fatalf("served fingerprint: %v", err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("fingerprints differ: local %x, served %x", a, b)
		}
	}
	// The copy is as private as the original: sensitive, and it cannot be
	// read out through the served token.
	as, err := rem.GetAttributes(ctxT(t), rpriv, []uint{pkcs11.CKA_SENSITIVE, pkcs11.CKA_VALUE})
	if err != nil {
		t.Fatalf("read the copy's attributes: %v", err)
	}
	if !bytes.Equal(as[0].Value, []byte{1}) || as[1].Status != pkcs11.CKR_ATTRIBUTE_SENSITIVE {
		t.Errorf("copy: CKA_SENSITIVE=%x, CKA_VALUE status 0x%X; want 01 and CKR_ATTRIBUTE_SENSITIVE", as[0].Value, as[1].Status)
	}
}
