package sync

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

func TestIdentityTemplate(t *testing.T) {
	has := func(tmpl []*pkcs11.Attribute, typ uint) bool {
		for _, a := range tmpl {
			if a.Type == typ {
				return true
			}
		}
		return false
	}
	for _, c := range []struct {
		name           string
		id             object.Identity
		withID, withKT bool
	}{
		// SoftHSM refuses CKA_ID on data objects, and a token matches no
		// object on an attribute the object lacks.
		{"data", object.Identity{Class: pkcs11.CKO_DATA, KeyType: object.NoKeyType, Label: "d"}, false, false},
		{"data with an ID", object.Identity{Class: pkcs11.CKO_DATA, KeyType: object.NoKeyType, ID: []byte{1}, Label: "d"}, true, false},
		{"certificate", object.Identity{Class: pkcs11.CKO_CERTIFICATE, KeyType: object.NoKeyType, Label: "c"}, true, false},
		{"key without ID", object.Identity{Class: pkcs11.CKO_SECRET_KEY, KeyType: pkcs11.CKK_AES, Label: "k"}, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			tmpl := c.id.Template()
			if has(tmpl, pkcs11.CKA_ID) != c.withID || has(tmpl, pkcs11.CKA_KEY_TYPE) != c.withKT {
				t.Errorf("template of %s: CKA_ID %v, CKA_KEY_TYPE %v; want %v, %v", c.id, has(tmpl, pkcs11.CKA_ID), has(tmpl, pkcs11.CKA_KEY_TYPE), c.withID, c.withKT)
			}
		})
	}
}

// TestReplicateDataObjectTwice: a data object's identity search finds the
// copy, so replicating it again makes nothing, and Destroy finds it.
func TestReplicateDataObjectTwice(t *testing.T) {
	src, dst := pair(t, false)
	ctx := testContext(t)
	h, err := src.CreateObject(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA),
		attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_VALUE, []byte("settings")),
		attr(pkcs11.CKA_LABEL, "twice"), attr(pkcs11.CKA_APPLICATION, "hagroup-test")})
	if err != nil {
		t.Fatal(err)
	}
	first := replicate(t, src, h, Target{Slot: dst})
	second := replicate(t, src, h, Target{Slot: dst})
	if second != first {
		t.Errorf("second replication made handle %d, want the first copy %d", second, first)
	}
	if n := len(findByLabel(t, dst, "twice")); n != 1 {
		t.Fatalf("%d data objects labelled twice on %s, want 1", n, dst.Name())
	}
	sameObject(t, src, h, dst, first, pkcs11.CKA_VALUE, pkcs11.CKA_APPLICATION, pkcs11.CKA_PRIVATE)
	o, err := object.ReadObject(ctx, src, h)
	if err != nil {
		t.Fatal(err)
	}
	if err := (&Replicator{GroupSerial: testSerial}).Destroy(ctx, dst, o.Identity, o.Fingerprint); err != nil {
		t.Fatal(err)
	}
	if n := len(findByLabel(t, dst, "twice")); n != 0 {
		t.Errorf("%d data objects labelled twice left on %s after Destroy", n, dst.Name())
	}
}

// TestReplicateDerivedKey: SoftHSM 2.6.1 stores the SHA-1 check value of
// generic secrets on an ECDH-derived AES key, not the AES one its
// copies get. The copy is proven by its material, and afterwards the
// source, the copy and a second copy all show the AES check value.
func TestReplicateDerivedKey(t *testing.T) {
	ss, toks := openN(t, 3)
	installDomain(t, testSerial, false, ss, toks)
	src := ss[0]
	ctx := testContext(t)
	kp := genEC(t, src, "ecdh", randomID(t), attr(pkcs11.CKA_DERIVE, true))
	point, _ := getAttr(t, src, kp.Pub, pkcs11.CKA_EC_POINT)
	h, err := src.DeriveKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_ECDH1_DERIVE, pkcs11.NewECDH1DeriveParams(pkcs11.CKD_NULL, nil, point)),
		kp.Priv, []*pkcs11.Attribute{
			attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES), attr(pkcs11.CKA_VALUE_LEN, 32),
			attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SENSITIVE, true),
			attr(pkcs11.CKA_EXTRACTABLE, true), attr(pkcs11.CKA_ENCRYPT, true), attr(pkcs11.CKA_DECRYPT, true),
			attr(pkcs11.CKA_LABEL, "derived")})
	if err != nil {
		t.Fatal(err)
	}
	block, err := src.Encrypt(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_ECB, nil), h, make([]byte, 16))
	if err != nil {
		t.Fatal(err)
	}
	kcv := block[:3]
	if stored, _ := getAttr(t, src, h, pkcs11.CKA_CHECK_VALUE); bytes.Equal(stored, kcv) {
		t.Logf("this SoftHSM stores the right check value on derived keys (%x): the repair is not exercised", stored)
	}
	r := &Replicator{GroupSerial: testSerial}
	var copies []pkcs11.ObjectHandle
	for _, dst := range ss[1:] {
		c, err := r.Replicate(ctx, src, h, Target{Slot: dst})
		if err != nil {
			t.Fatalf("replicate the derived key to %s: %v", dst.Name(), err)
		}
		copies = append(copies, c)
		if again, err := r.Replicate(ctx, src, h, Target{Slot: dst}); err != nil || again != c {
			t.Errorf("second replication to %s: %d, %v; want %d", dst.Name(), again, err, c)
		}
	}
	for i, s := range ss {
		k := h
		if i > 0 {
			k = copies[i-1]
		}
		if fp := mustFingerprint(t, s, k); !bytes.Equal(fp, kcv) {
			t.Errorf("fingerprint on %s %x, want the AES check value %x", s.Name(), fp, kcv)
		}
		got, err := s.Encrypt(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_ECB, nil), k, make([]byte, 16))
		if err != nil || !bytes.Equal(got, block) {
			t.Errorf("%s encrypts a zero block to %x (%v), the source to %x", s.Name(), got, err, block)
		}
	}
}

// TestDomainKeyOverP11Kit: p11-kit 0.24's client carries neither
// CKM_AES_KEY_WRAP_PAD nor the domain key's nested unwrap template.
// domainkey.Install refuses such a member by name before making anything;
// Replicate of a key to or from it fails with ErrMechanismUnavailable, a
// request error (the member is healthy), and public objects still go.
func TestDomainKeyOverP11Kit(t *testing.T) {
	local := openSlot(t, testhsm.Take(t, 1)[0], nil)
	remote := openSlot(t, testhsm.Serve(t, "remote-kit").Token(), nil)
	ctx := testContext(t)

	t.Run("install", func(t *testing.T) {
		err := domainkey.Install(ctx, []domainkey.Target{{Slot: local}, {Slot: remote}}, testSerial)
		t.Log(err)
		var me *domainkey.MechanismError
		if !errors.Is(err, domainkey.ErrMechanismUnavailable) || !errors.As(err, &me) || me.Member != remote.Name() {
			t.Fatalf("install with a p11-kit member: %v, want a MechanismError naming %s", err, remote.Name())
		}
		for _, s := range []string{remote.Name(), "CKM_AES_KEY_WRAP_PAD"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error %q does not name %s", err, s)
			}
		}
		if strings.Contains(err.Error(), local.Name()) {
			t.Errorf("error %q blames %s too", err, local.Name())
		}
		for _, s := range []*slot.Slot{local, remote} {
			if n := len(findByLabel(t, s, domainkey.Label(testSerial))); n != 0 {
				t.Errorf("%d domain keys left on %s", n, s.Name())
			}
		}
	})

	// A flat domain key on both (no unwrap template), as the p11-kit
	// transport can create it.
	plainDomainKey(t, testSerial, local, remote)
	r := &Replicator{GroupSerial: testSerial}
	for _, c := range []struct {
		name     string
		from, to *slot.Slot
		use      string
	}{{"to", local, remote, "unwrap"}, {"from", remote, local, "wrap"}} {
		t.Run("key "+c.name+" p11-kit", func(t *testing.T) {
			k := genAES(t, c.from, "kit-"+c.name, randomID(t))
			_, err := r.Replicate(ctx, c.from, k, Target{Slot: c.to})
			t.Log(err)
			var me *domainkey.MechanismError
			if !errors.As(err, &me) || me.Member != remote.Name() || me.Use != c.use || me.Mechanism != pkcs11.CKM_AES_KEY_WRAP_PAD {
				t.Fatalf("replicate %s p11-kit: %v, want a MechanismError: %s cannot %s", c.name, err, remote.Name(), c.use)
			}
			if cl := slot.ClassOf(err); cl != slot.ClassRequest {
				t.Errorf("class %v, want %v: the member is healthy", cl, slot.ClassRequest)
			}
			if !strings.Contains(err.Error(), remote.Name()) || !strings.Contains(err.Error(), "CKM_AES_KEY_WRAP_PAD") {
				t.Errorf("error %q does not name the member and the mechanism", err)
			}
			if n := len(findByLabel(t, c.to, "kit-"+c.name)); n != 0 {
				t.Errorf("%d objects left on %s", n, c.to.Name())
			}
		})
	}
	t.Run("public key to p11-kit", func(t *testing.T) {
		kp := genEC(t, local, "kit-public", randomID(t))
		h := replicate(t, local, kp.Pub, Target{Slot: remote})
		sameObject(t, local, kp.Pub, remote, h, pkcs11.CKA_EC_PARAMS, pkcs11.CKA_EC_POINT)
	})
}

// TestInstallDomainKeyNestedRefused: a module that answers a nested
// template with CKR_DEVICE_ERROR but other calls normally (p11-kit 0.24's
// behaviour, injected here on a member that offers the mechanism) is
// named with ErrNestedTemplates, and no member keeps a domain key.
func TestInstallDomainKeyNestedRefused(t *testing.T) {
	toks := testhsm.Take(t, 2)
	f := slottest.NewFaults()
	a, b := openSlot(t, toks[0], nil), openSlot(t, toks[1], f)
	f.Fail(b.Name(), slot.OpCreateObject, pkcs11.Error(pkcs11.CKR_DEVICE_ERROR))
	err := domainkey.Install(testContext(t), []domainkey.Target{{Slot: a}, {Slot: b}}, testSerial)
	f.Heal(b.Name())
	t.Log(err)
	if !errors.Is(err, domainkey.ErrNestedTemplates) || !strings.Contains(err.Error(), "member "+b.Name()) {
		t.Fatalf("install on a module refusing nested templates: %v, want ErrNestedTemplates naming %s", err, b.Name())
	}
	if strings.Contains(err.Error(), "member "+a.Name()) {
		t.Errorf("error %q blames %s too", err, a.Name())
	}
	for _, s := range []*slot.Slot{a, b} {
		if n := len(findByLabel(t, s, domainkey.Label(testSerial))); n != 0 {
			t.Errorf("%d domain keys left on %s", n, s.Name())
		}
	}
}

// TestCopyTypesExist: the attributes read from a public key to copy it
// all exist on it, so the read is one module call (pkg/slot falls back to
// one call per attribute when any is missing).
func TestCopyTypesExist(t *testing.T) {
	s := openSlot(t, testhsm.Take(t, 1)[0], nil)
	for _, c := range []struct {
		name string
		kp   keyPair
		kt   uint
	}{
		{"EC", genEC(t, s, "types-ec", randomID(t)), pkcs11.CKK_EC},
		{"RSA", genRSA(t, s, "types-rsa", randomID(t)), pkcs11.CKK_RSA},
		{"Ed25519", genEd25519(t, s, "types-ed", randomID(t)), slot.CKKECEdwards},
	} {
		t.Run(c.name, func(t *testing.T) {
			types, err := object.CopyTypes(pkcs11.CKO_PUBLIC_KEY, c.kt)
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.GetAttributes(testContext(t), c.kp.Pub, types)
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range got {
				if a.Status == pkcs11.CKR_ATTRIBUTE_TYPE_INVALID {
					t.Errorf("%s public key has no attribute 0x%x", c.name, a.Type)
				}
			}
		})
	}
}
