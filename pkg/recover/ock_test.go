package recover

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/miekg/pkcs11"
)

// addOCK adds to r an opencryptoki soft token served by hsmserve, with a
// PIN file of its own (its PINs are 4 to 8 characters), and returns it.
func addOCK(t testing.TB, r *rig, name string) testhsm.Token {
	t.Helper()
	tok := testhsm.ServeOCK(t, name).Token()
	tok.UserPIN = testhsm.OCKUserPIN
	pin := filepath.Join(t.TempDir(), "pin")
	if err := os.WriteFile(pin, []byte(testhsm.OCKUserPIN+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.g.AddMember(rigCtx(t), config.Member{Name: tok.Name, Module: tok.Module, TokenLabel: tok.Label, PINFile: pin}); err != nil {
		t.Fatalf("add %s: %v", tok.Name, err)
	}
	return tok
}

// genAESThrough makes n AES-256 token keys through r's group.
func genAESThrough(t testing.TB, r *rig, n int, prefix string) {
	t.Helper()
	s := r.session()
	for i := range n {
		if _, err := s.GenerateKey(rigCtx(t), pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), []*pkcs11.Attribute{
			rigA(pkcs11.CKA_TOKEN, true), rigA(pkcs11.CKA_VALUE_LEN, 32), rigA(pkcs11.CKA_ENCRYPT, true),
			rigA(pkcs11.CKA_LABEL, fmt.Sprintf("%s-%d", prefix, i))}); err != nil {
			t.Fatal(err)
		}
	}
}

// A catch-up onto an opencryptoki soft token from a group of one SoftHSM
// member copies the secret keys (RSA-OAEP under the soft token's transport
// key, the one way the two makes share) and leaves out the RSA key pair,
// which no way carries into it (its public half stays with it): the member
// is admitted, and the keys it received are the group's.
func TestCatchUpOntoOCK(t *testing.T) {
	r := newRig(t, rigOpts{n: 1})
	ctx := rigCtx(t)
	genAESThrough(t, r, 4, "cu-aes")
	genRSAThrough(t, r.session(), "cu-rsa", true)
	tok := addOCK(t, r, "ock-cu")
	name := tok.Name
	res, err := r.rec.Admit(ctx, name)
	if err != nil {
		t.Fatalf("admit %s: %+v, %v", name, res, err)
	}
	if res.CatchUp.Copied != 4 {
		t.Errorf("copied %d, want the 4 AES keys", res.CatchUp.Copied)
	}
	var left []string
	for _, a := range res.CatchUp.Unreplicable {
		left = append(left, fmt.Sprintf("%s %s", a.Identity.Label, pkcsClass(a.Identity.Class)))
	}
	if len(left) != 2 {
		t.Errorf("unreplicable %v, want the RSA pair (private and public halves)", left)
	}
	d := r.direct(tok, "-direct")
	if hs, err := d.FindObjects(ctx, []*pkcs11.Attribute{rigA(pkcs11.CKA_LABEL, "cu-rsa")}); err != nil || len(hs) != 0 {
		t.Errorf("%s holds %d halves of cu-rsa (%v), want none: a member holding the public half alone would seem to hold the key", name, len(hs), err)
	}
	for i := range 4 {
		hs, err := d.FindObjects(ctx, []*pkcs11.Attribute{rigA(pkcs11.CKA_LABEL, fmt.Sprintf("cu-aes-%d", i))})
		if err != nil || len(hs) != 1 {
			t.Errorf("%s holds %d copies of cu-aes-%d (%v), want 1", name, len(hs), i, err)
		}
	}
}

func pkcsClass(c uint) string {
	if c == pkcs11.CKO_PUBLIC_KEY {
		return "public"
	}
	return "private"
}

// BenchmarkCatchUpOntoOCK times the catch-up (Admit) of a new
// opencryptoki soft token (served by hsmserve) with a group of one
// SoftHSM member holding 100 AES-256 keys made through the group: the
// only kind of key that travels between the two makes.
func BenchmarkCatchUpOntoOCK(b *testing.B) {
	r := newRig(b, rigOpts{n: 1})
	ctx := rigCtx(b)
	genAESThrough(b, r, 100, "bench-aes")
	n := 0
	for b.Loop() {
		b.StopTimer()
		name := addOCK(b, r, fmt.Sprintf("ock-cu-%d", n)).Name
		n++
		b.StartTimer()
		res, err := r.rec.Admit(ctx, name)
		b.StopTimer()
		if err != nil || res.CatchUp.Copied != 100 {
			b.Fatalf("admit: copied %d, %v; want 100 copies", res.CatchUp.Copied, err)
		}
		if err := r.g.RemoveMember(ctx, name); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
