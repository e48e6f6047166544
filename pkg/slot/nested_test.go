package slot_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// unwrapTemplate is the template of a domain key as DESIGN.md describes it:
// whatever it unwraps is sensitive and may be wrapped again only under a
// trusted key.
var unwrapTemplate = []*pkcs11.Attribute{
	pkcs11.NewAttribute(pkcs11.CKA_WRAP_WITH_TRUSTED, true),
	pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true),
}

func aesTemplate(label string, token bool) []*pkcs11.Attribute {
	v := make([]byte, 32)
	rand.Read(v)
	return []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY),
		pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, token),
		pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
		pkcs11.NewAttribute(pkcs11.CKA_WRAP, true),
		pkcs11.NewAttribute(pkcs11.CKA_UNWRAP, true),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, label),
		pkcs11.NewAttribute(pkcs11.CKA_VALUE, v),
	}
}

// attrMap turns attributes into a type → value map.
func attrMap(as []*pkcs11.Attribute) map[uint][]byte {
	m := make(map[uint][]byte, len(as))
	for _, a := range as {
		m[a.Type] = a.Value
	}
	return m
}

func TestCreateObjectNested(t *testing.T) {
	t.Parallel()
	s := open(t, specOf(testhsm.Take(t, 1)[0]))
	ctx := ctxT(t)
	if err := slot.CheckFunctionList(s); err != nil {
		t.Fatalf("the function list used for nested templates is not SoftHSM's: %v", err)
	}
	ss, err := s.OpenSession(ctx)
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	defer ss.Close()

	kek, err := ss.CreateObjectNested(ctx, aesTemplate("kek", false), map[uint][]*pkcs11.Attribute{
		pkcs11.CKA_UNWRAP_TEMPLATE: unwrapTemplate,
	})
	if err != nil {
		t.Fatalf("CreateObjectNested: %v", err)
	}

	// Read back with a raw C_GetAttributeValue of the attribute array.
	got, err := ss.GetNestedAttribute(ctx, kek, pkcs11.CKA_UNWRAP_TEMPLATE)
	if err != nil {
		t.Fatalf("GetNestedAttribute: %v", err)
	}
	m := attrMap(got)
	if len(got) != 2 || !bytes.Equal(m[pkcs11.CKA_WRAP_WITH_TRUSTED], []byte{1}) || !bytes.Equal(m[pkcs11.CKA_SENSITIVE], []byte{1}) {
		t.Fatalf("CKA_UNWRAP_TEMPLATE read back as %v; want CKA_WRAP_WITH_TRUSTED=true, CKA_SENSITIVE=true", m)
	}
	// The plain attributes are there too.
	plain, err := ss.GetAttributes(ctx, kek, []uint{pkcs11.CKA_LABEL, pkcs11.CKA_UNWRAP})
	if err != nil || string(plain[0].Value) != "kek" || !bytes.Equal(plain[1].Value, []byte{1}) {
		t.Fatalf("plain attributes of the nested-template object: %+v, %v", plain, err)
	}

	// The token enforces the template: what the key unwraps is sensitive.
	victim, err := ss.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false),
		pkcs11.NewAttribute(pkcs11.CKA_VALUE_LEN, 32),
		pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, true),
		pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, false),
	})
	if err != nil {
		t.Fatalf("GenerateKey: %v", err)
	}
	wrap := pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP_PAD, nil)
	blob, err := ss.WrapKey(ctx, wrap, kek, victim)
	if err != nil {
		t.Fatalf("WrapKey: %v", err)
	}
	base := []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY),
		pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false),
	}
	_, err = ss.UnwrapKey(ctx, wrap, kek, blob, append(base[:3:3], pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, false)))
	if !errors.Is(err, pkcs11.Error(pkcs11.CKR_TEMPLATE_INCONSISTENT)) || slot.ClassOf(err) != slot.ClassRequest {
		t.Fatalf("unwrap as non-sensitive against the unwrap template: %v; want CKR_TEMPLATE_INCONSISTENT (request)", err)
	}
	// SoftHSM wants the unwrap template's attributes in the application's
	// template, with the same values.
	if _, err := ss.UnwrapKey(ctx, wrap, kek, blob, base); !errors.Is(err, pkcs11.Error(pkcs11.CKR_TEMPLATE_INCONSISTENT)) {
		t.Fatalf("unwrap without the unwrap template's attributes: %v; want CKR_TEMPLATE_INCONSISTENT", err)
	}
	k, err := ss.UnwrapKey(ctx, wrap, kek, blob, append(base[:3:3], unwrapTemplate...))
	if err != nil {
		t.Fatalf("UnwrapKey with the unwrap template's attributes: %v", err)
	}
	as, err := ss.GetAttributes(ctx, k, []uint{pkcs11.CKA_SENSITIVE, pkcs11.CKA_WRAP_WITH_TRUSTED, pkcs11.CKA_VALUE})
	if err != nil {
		t.Fatalf("GetAttributes: %v", err)
	}
	if !bytes.Equal(as[0].Value, []byte{1}) || !bytes.Equal(as[1].Value, []byte{1}) || as[2].Status != pkcs11.CKR_ATTRIBUTE_SENSITIVE {
		t.Fatalf("unwrapped key: sensitive %x, wrap-with-trusted %x, value status %#x; want 01, 01, CKR_ATTRIBUTE_SENSITIVE",
			as[0].Value, as[1].Value, as[2].Status)
	}

	// On the pool too, as a token object.
	tk, err := s.CreateObjectNested(ctx, aesTemplate("kek-token", true), map[uint][]*pkcs11.Attribute{
		pkcs11.CKA_UNWRAP_TEMPLATE: unwrapTemplate,
		pkcs11.CKA_WRAP_TEMPLATE:   {pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, true)},
	})
	if err != nil {
		t.Fatalf("Slot.CreateObjectNested: %v", err)
	}
	if h := findOne(t, s, pkcs11.CKO_SECRET_KEY, "kek-token"); h != tk {
		t.Fatalf("token object found as %d, created as %d", h, tk)
	}
	wt, err := s.GetNestedAttribute(ctx, tk, pkcs11.CKA_WRAP_TEMPLATE)
	if err != nil || len(wt) != 1 || wt[0].Type != pkcs11.CKA_EXTRACTABLE || !bytes.Equal(wt[0].Value, []byte{1}) {
		t.Fatalf("CKA_WRAP_TEMPLATE read back as %v, %v", wt, err)
	}

	// Misuse is a request error that never reaches the module.
	_, err = s.CreateObjectNested(ctx, aesTemplate("bad", false), map[uint][]*pkcs11.Attribute{pkcs11.CKA_LABEL: unwrapTemplate})
	if !errors.Is(err, slot.ErrInvalidSpec) || slot.ClassOf(err) != slot.ClassRequest {
		t.Fatalf("nested value for CKA_LABEL: %v, want ErrInvalidSpec", err)
	}
	_, err = s.CreateObjectNested(ctx, aesTemplate("bad", false), map[uint][]*pkcs11.Attribute{pkcs11.CKA_VALUE: unwrapTemplate})
	if !errors.Is(err, slot.ErrInvalidSpec) {
		t.Fatalf("nested value for CKA_VALUE: %v, want ErrInvalidSpec", err)
	}
}

// Through p11-kit-client the module's function list is one per context,
// which the nested helper must reach as well. p11-kit before 0.25 cannot
// carry attribute arrays over its RPC (p11-glue/p11-kit#624) and answers
// CKR_DEVICE_ERROR; the member keeps working.
func TestCreateObjectNestedServed(t *testing.T) {
	t.Parallel()
	srv := testhsm.Serve(t, "nested")
	s := open(t, specOf(srv.Token()))
	ctx := ctxT(t)

	// Through the raw function list, without arrays: proves it is this
	// context's (another would be uninitialised or another connection).
	plain, err := s.CreateObjectNested(ctx, aesTemplate("plain", true), nil)
	if err != nil {
		t.Fatalf("CreateObjectNested without arrays through p11-kit: %v", err)
	}
	if h := findOne(t, s, pkcs11.CKO_SECRET_KEY, "plain"); h != plain {
		t.Fatalf("object created through the raw function list found as %d, created as %d", h, plain)
	}

	h, err := s.CreateObjectNested(ctx, aesTemplate("kek", true), map[uint][]*pkcs11.Attribute{
		pkcs11.CKA_UNWRAP_TEMPLATE: unwrapTemplate,
	})
	if err != nil {
		if !errors.Is(err, pkcs11.Error(pkcs11.CKR_DEVICE_ERROR)) {
			t.Fatalf("CreateObjectNested through p11-kit: %v; want success or (p11-kit < 0.25) CKR_DEVICE_ERROR", err)
		}
		t.Logf("p11-kit cannot carry attribute arrays: %v", err)
		if _, err := s.GenerateRandom(ctx, 4); err != nil {
			t.Fatalf("member unusable after p11-kit refused an attribute array: %v", err)
		}
		return
	}
	got, err := s.GetNestedAttribute(ctx, h, pkcs11.CKA_UNWRAP_TEMPLATE)
	if err != nil {
		t.Fatalf("GetNestedAttribute through p11-kit: %v", err)
	}
	m := attrMap(got)
	if len(got) != 2 || !bytes.Equal(m[pkcs11.CKA_WRAP_WITH_TRUSTED], []byte{1}) || !bytes.Equal(m[pkcs11.CKA_SENSITIVE], []byte{1}) {
		t.Fatalf("CKA_UNWRAP_TEMPLATE through p11-kit read back as %v", m)
	}
}
