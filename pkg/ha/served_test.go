package ha

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/group/signer"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/recover"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/miekg/pkcs11"
)

func findKey(t testing.TB, s *group.Session, label string) group.ObjectHandle {
	t.Helper()
	hs, err := s.Find(testCtx(t), []*pkcs11.Attribute{a(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY), a(pkcs11.CKA_LABEL, label)})
	if err != nil || len(hs) != 1 {
		t.Fatalf("find %s: %v (%d found)", label, err, len(hs))
	}
	return hs[0]
}

func signOnce(ctx context.Context, s *group.Session, key group.ObjectHandle) error {
	if err := s.SignInit(ctx, pkcs11.NewMechanism(pkcs11.CKM_ECDSA, nil), key); err != nil {
		return err
	}
	_, err := s.Sign(ctx, make([]byte, 32))
	return err
}

// Every member is a real token behind a p11-kit server. Both servers are
// killed (SIGKILL); one is restarted and recovered automatically. In
// activeEnhanced the session opened before the outage signs again without
// a new login; in activeBasic it answers CKR_SESSION_HANDLE_INVALID and a
// fresh session, after a new login, signs.
func TestFullOutageOfServedMembers(t *testing.T) {
	for _, mode := range []string{config.RecoveryActiveEnhanced, config.RecoveryActiveBasic} {
		t.Run(mode, func(t *testing.T) {
			srvs := []*testhsm.Served{testhsm.Serve(t, "out-a-"+mode[6:]), testhsm.Serve(t, "out-b-"+mode[6:])}
			toks := []testhsm.Token{srvs[0].Token(), srvs[1].Token()}
			importEC(t, toks, "outage")
			r := newRig(t, rigOpts{toks: toks, noDomain: true, mode: mode})
			ctx := testCtx(t)
			s := r.session()
			key := findKey(t, s, "outage")
			if err := signOnce(ctx, s, key); err != nil {
				t.Fatal(err)
			}
			for _, srv := range srvs {
				srv.Kill()
			}
			err := signOnce(ctx, s, key)
			if code := group.CodeOf(err); code != pkcs11.CKR_DEVICE_ERROR {
				t.Fatalf("sign with every server killed: %v (0x%x), want CKR_DEVICE_ERROR", err, code)
			}
			r.ev.waitFor(t, "group down", func() bool { return len(r.ev.groupEvents(group.GroupDown, "")) == 1 })
			srvs[0].Restart(t)
			back := toks[0].Name
			r.ev.waitFor(t, back+" recovered", func() bool { return r.state(back) == member.Active })

			err = signOnce(ctx, s, key)
			if mode == config.RecoveryActiveEnhanced {
				if err != nil {
					t.Fatalf("the session from before the outage: %v", err)
				}
				if _, ok := r.g.Engine().LoggedIn(); !ok {
					t.Fatal("the login was lost")
				}
				return
			}
			if code := group.CodeOf(err); code != pkcs11.CKR_SESSION_HANDLE_INVALID {
				t.Fatalf("the session from before the outage: %v (0x%x), want CKR_SESSION_HANDLE_INVALID", err, code)
			}
			fresh := r.session()
			if err := r.g.Engine().Login(ctx, pkcs11.CKU_USER, secret.PINFromString(testhsm.UserPIN)); err != nil {
				t.Fatalf("login after the outage: %v", err)
			}
			if err := signOnce(ctx, fresh, key); err != nil {
				t.Fatalf("a fresh session after the outage: %v", err)
			}
		})
	}
}

// A member served by p11-kit 0.24 (whose RPC cannot carry
// CKM_AES_KEY_WRAP_PAD) stays in service: it is reported once when the
// group opens and its health is never charged. It cannot hold private or
// secret keys, so while it serves with the others the group makes none
// (Luna's promise: success only once the object is on every serving
// member): a key generation answers CKR_MECHANISM_INVALID, a
// creation_refused event names the member, and no member keeps anything.
// A key the other members hold signs; Synchronize reports the private key
// the member cannot take without failing on it, and a recovery of the
// member succeeds without it.
func TestMemberWithoutWrapMechanism(t *testing.T) {
	srv := testhsm.Serve(t, "nowrap")
	toks := append([]testhsm.Token{srv.Token()}, testhsm.Take(t, 2)...)
	importEC(t, toks[1:], "wrapless")
	r := newRig(t, rigOpts{toks: toks, plainDomain: true, manual: true})
	ctx := testCtx(t)
	served := toks[0].Name
	missing := r.ev.groupEvents(group.MechanismMissing, served)
	if len(missing) != 1 || !strings.Contains(missing[0].Err.Error(), served) || !strings.Contains(missing[0].Err.Error(), "CKM_AES_KEY_WRAP_PAD") {
		t.Fatalf("MechanismMissing events for %s: %v", served, missing)
	}
	for _, other := range toks[1:] {
		if n := len(r.ev.groupEvents(group.MechanismMissing, other.Name)); n != 0 {
			t.Errorf("%d MechanismMissing events for %s, which has the mechanism", n, other.Name)
		}
	}
	if r.g.Engine().Primary() != served {
		t.Fatalf("primary is %s, want the served member (first in order)", r.g.Engine().Primary())
	}
	s := r.session()
	_, _, err := s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{a(pkcs11.CKA_EC_PARAMS, p256), a(pkcs11.CKA_TOKEN, true), a(pkcs11.CKA_VERIFY, true), a(pkcs11.CKA_LABEL, "made-here")},
		[]*pkcs11.Attribute{a(pkcs11.CKA_TOKEN, true), a(pkcs11.CKA_PRIVATE, true), a(pkcs11.CKA_SIGN, true), a(pkcs11.CKA_SENSITIVE, true), a(pkcs11.CKA_LABEL, "made-here")})
	if code := group.CodeOf(err); code != pkcs11.CKR_MECHANISM_INVALID {
		t.Fatalf("EC key generation with %s serving: %v (0x%x), want CKR_MECHANISM_INVALID", served, err, code)
	}
	refused := r.ev.groupEvents(group.CreationRefused, served)
	if len(refused) != 1 || !strings.Contains(refused[0].Err.Error(), "CKM_AES_KEY_WRAP_PAD") {
		t.Errorf("creation_refused events for %s: %v; want one naming CKM_AES_KEY_WRAP_PAD", served, refused)
	}
	for _, tok := range toks {
		if n := len(findLabelled(t, direct(t, tok), "made-here")); n != 0 {
			t.Errorf("%s holds %d objects of the refused generation, want 0", tok.Name, n)
		}
	}
	signer, err := signer.New(ctx, r.g.Engine(), signer.KeySelector{Label: "wrapless"})
	if err != nil {
		t.Fatal(err)
	}
	load := startSigning(signer, 2)
	for range 3 {
		if err := signOnce(ctx, s, signer.Handle()); err != nil {
			t.Errorf("sign: %v", err)
		}
	}
	load.finish(t)
	if st := r.state(served); st != member.Active {
		t.Fatalf("the served member is %v after a refused creation and signatures", st)
	}
	if ms := memberStatus(t, r.g.Status(testCtx(t)), served); len(ms.MissingMechanisms) != 1 {
		t.Errorf("status of %s: missing %v, want [CKM_AES_KEY_WRAP_PAD]", served, ms.MissingMechanisms)
	}

	rep, err := r.g.Synchronize(ctx, recover.SyncOptions{Check: true})
	if err != nil {
		t.Fatal(err)
	}
	// The key pair's two halves, held back together: a public half is
	// never copied without its private half.
	if rep.InSync() || len(rep.Unreplicable) != 2 {
		t.Fatalf("check: in sync %v, unreplicable %v; want the key pair's two halves", rep.InSync(), rep.Unreplicable)
	}
	for _, u := range rep.Unreplicable {
		if u.Member != served {
			t.Errorf("check: %v is unreplicable to %s, want %s", u, u.Member, served)
		}
	}
	rep, err = r.g.Synchronize(ctx, recover.SyncOptions{})
	if err != nil {
		t.Fatalf("Synchronize with an unreplicable difference: %v", err)
	}
	if rep.Applied != nil && len(rep.Applied.Failed) != 0 {
		t.Errorf("Synchronize tried what cannot work: %v", rep.Applied.Failed)
	}
	if ms := memberStatus(t, r.g.Status(testCtx(t)), served); ms.OutOfSync != 2 {
		t.Errorf("out of sync after Synchronize: %d, want 2 (the key pair's halves)", ms.OutOfSync)
	}
	if st := r.state(served); st != member.Active {
		t.Fatalf("the served member is %v after Synchronize", st)
	}

	if err := r.g.Engine().FailMember(served, errors.New("test")); err != nil {
		t.Fatal(err)
	}
	res, err := r.g.Recover(ctx, served)
	if err != nil {
		t.Fatalf("recovering the member that cannot take the key: %v", err)
	}
	if len(res.CatchUp.Unreplicable) != 2 {
		t.Errorf("catch-up left out %v, want the key pair (its public half goes with its private half)", res.CatchUp.Unreplicable)
	}
	if ms := memberStatus(t, r.g.Status(testCtx(t)), served); ms.State != member.Active || ms.OutOfSync != 2 {
		t.Errorf("after recovery: %v, out of sync %d", ms.State, ms.OutOfSync)
	}
	if n := len(r.ev.groupEvents(group.MechanismMissing, served)); n != 1 {
		t.Errorf("%d MechanismMissing events after the re-open, want still 1", n)
	}
}

func memberStatus(t testing.TB, st Status, name string) MemberStatus {
	t.Helper()
	for _, m := range st.Members {
		if m.Name == name {
			return m
		}
	}
	t.Fatalf("no member %s in the status", name)
	return MemberStatus{}
}
