package group

import (
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/miekg/pkcs11"
)

// TestRefusalsOutsideTheUserLogin: what a token refuses outside the
// user's login is the request's answer, never a member's fault. Logged in
// as the SO, a private object answers CKR_USER_NOT_LOGGED_IN as on the
// bare token (the group took it for a lost login, failed the member and
// ended the session); before any login a secret key on several members is
// refused with CKR_USER_NOT_LOGGED_IN before anything is made (it could
// not reach the other members: the domain key is private), where it made
// it on one member and failed the others (issue 30, sessions in every
// state).
func TestRefusalsOutsideTheUserLogin(t *testing.T) {
	f := setup(t, setupOpts{noLogin: true})
	ctx := testContext(t)
	s := openSession(t, f.g)
	allActive := func(when string) {
		t.Helper()
		for _, tok := range f.toks {
			if st := memberState(f.g, tok.Name); st != member.Active {
				t.Errorf("%s: member %s is %v, want active", when, tok.Name, st)
			}
		}
	}
	key := []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
		attr(pkcs11.CKA_TOKEN, false), attr(pkcs11.CKA_PRIVATE, false), attr(pkcs11.CKA_LABEL, "before-login"),
		attr(pkcs11.CKA_VALUE, make([]byte, 16))}
	if _, err := s.CreateObject(ctx, key); CodeOf(err) != pkcs11.CKR_USER_NOT_LOGGED_IN {
		t.Errorf("a public secret key before login on 3 members: %v, want CKR_USER_NOT_LOGGED_IN", err)
	}
	allActive("after a key made before login")

	if err := f.g.Login(ctx, pkcs11.CKU_SO, secret.PINFromString(testhsm.SOPIN)); err != nil {
		t.Fatalf("SO login: %v", err)
	}
	t.Cleanup(func() { f.g.Logout(testContext(t)) })
	private := []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, false),
		attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_LABEL, "so-private")}
	if _, err := s.CreateObject(ctx, private); CodeOf(err) != pkcs11.CKR_USER_NOT_LOGGED_IN {
		t.Errorf("a private object as the SO: %v, want CKR_USER_NOT_LOGGED_IN as the token answers", err)
	}
	allActive("after the SO's private object")
	public := []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, false),
		attr(pkcs11.CKA_PRIVATE, false), attr(pkcs11.CKA_LABEL, "so-public")}
	if _, err := s.CreateObject(ctx, public); err != nil {
		t.Errorf("a public object as the SO, after the refusal: %v (the session must live on)", err)
	}
}
