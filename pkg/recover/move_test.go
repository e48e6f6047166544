package recover

import (
	"context"
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/miekg/pkcs11"
)

// A group moves from one make to another without downtime: a group on
// two SoftHSM members (a trusted domain key) gains two NSS members (each
// served by its own hsmserve: NSS initialises once per process), each is
// caught up (Admit), a synchronize finds them in sync for what can move,
// and the SoftHSM members are removed, while an application signs with
// an RSA key through the group all along: every signature verifies and
// none fails. A key that cannot move stays where it is and the operator is
// told: an EC private key (no way carries one into NSS) is named by
// CannotHold, and a synchronize reports it unreplicable, not failed.
func TestMoveGroupFromSoftHSMToNSS(t *testing.T) {
	r := newRig(t, rigOpts{n: 2})
	ctx := rigCtx(t)
	s := r.session()
	rsaPub, rsaPriv := genRSAThrough(t, s, "move-rsa", true)
	if _, _, err := s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{rigA(pkcs11.CKA_TOKEN, true), rigA(pkcs11.CKA_EC_PARAMS, rigP256), rigA(pkcs11.CKA_VERIFY, true), rigA(pkcs11.CKA_LABEL, "stay-ec")},
		[]*pkcs11.Attribute{rigA(pkcs11.CKA_TOKEN, true), rigA(pkcs11.CKA_PRIVATE, true), rigA(pkcs11.CKA_SIGN, true),
			rigA(pkcs11.CKA_EXTRACTABLE, true), rigA(pkcs11.CKA_LABEL, "stay-ec")}); err != nil {
		t.Fatalf("generate the EC key through the SoftHSM group: %v", err)
	}
	pub := rsaPublicKey(t, s, rsaPub)

	// The application signs through the group until told to stop.
	stop := make(chan struct{})
	var sigs, failures atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			ss := r.session()
			msg := []byte(fmt.Sprintf("move %d", w))
			digest := sha256.Sum256(msg)
			for {
				select {
				case <-stop:
					return
				default:
				}
				sig, err := signOnce(ctx, ss, rsaPriv, msg)
				if err == nil {
					err = rsa.VerifyPKCS1v15(pub, crypto.SHA256, digest[:], sig)
				}
				if err != nil {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				sigs.Add(1)
			}
		})
	}
	waitSigs := func(n int64) {
		t.Helper()
		want := sigs.Load() + n
		for sigs.Load() < want {
			select {
			case <-ctx.Done():
				t.Fatalf("signing stalled at %d signatures", sigs.Load())
			case <-r.gev.changed:
			default:
			}
		}
	}

	softs := []string{r.toks[0].Name, r.toks[1].Name}
	var nss []string
	for i := range 2 {
		srv := testhsm.ServeNSS(t, fmt.Sprintf("nss-move-%d", i))
		tok := srv.Token()
		r.servers[tok.Name] = srv
		if err := r.g.AddMember(ctx, config.Member{Name: tok.Name, Module: tok.Module, TokenLabel: tok.Label}); err != nil {
			t.Fatalf("add %s: %v", tok.Name, err)
		}
		res, err := r.rec.Admit(ctx, tok.Name)
		if err != nil {
			t.Fatalf("admit %s: %+v, %v", tok.Name, res, err)
		}
		nss = append(nss, tok.Name)
		waitSigs(20)
	}
	seen := strings.Join(r.g.CannotHold(nss[0]), "; ")
	if !strings.Contains(seen, "private keys from "+softs[0]+" (no proven way)") {
		t.Errorf("CannotHold(%s) = %q, want EC private keys from %s named", nss[0], seen, softs[0])
	}
	rep, err := r.rec.Synchronize(ctx, SyncOptions{})
	if err != nil {
		t.Fatalf("synchronize: %v", err)
	}
	var stay []string
	for _, a := range rep.Unreplicable {
		stay = append(stay, a.Identity.Label+" to "+a.Member)
	}
	slices.Sort(stay)
	if want := []string{"stay-ec to " + nss[0], "stay-ec to " + nss[1]}; !slices.Equal(slices.Compact(stay), want) {
		t.Errorf("synchronize: unreplicable %v, want %v", stay, want)
	}
	waitSigs(20)
	for _, name := range softs {
		if err := r.g.RemoveMember(ctx, name); err != nil {
			t.Fatalf("remove %s: %v", name, err)
		}
		waitSigs(20)
	}
	waitSigs(50)
	close(stop)
	wg.Wait()
	if n := failures.Load(); n != 0 {
		t.Errorf("%d signatures failed during the move (first: %v), want 0", n, firstErr.Load())
	}
	t.Logf("%d signatures through the move", sigs.Load())

	// What moved is on both NSS members; what could not is on neither,
	// and the operator is told why.
	for _, name := range nss {
		d := r.direct(r.tokenOf(name), "-check")
		for label, want := range map[string]int{"move-rsa": 2, "stay-ec": 0} {
			hs, err := d.FindObjects(ctx, []*pkcs11.Attribute{rigA(pkcs11.CKA_LABEL, label)})
			if err != nil {
				t.Fatal(err)
			}
			if len(hs) != want {
				t.Errorf("%s holds %d objects labelled %s, want %d", name, len(hs), label, want)
			}
		}
	}
}

// genRSAThrough generates an RSA-2048 pair through the group, extractable
// or not.
func genRSAThrough(t testing.TB, s *group.Session, label string, extractable bool) (pub, priv group.ObjectHandle) {
	t.Helper()
	pub, priv, err := s.GenerateKeyPair(rigCtx(t), pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{rigA(pkcs11.CKA_TOKEN, true), rigA(pkcs11.CKA_MODULUS_BITS, 2048), rigA(pkcs11.CKA_PUBLIC_EXPONENT, []byte{1, 0, 1}),
			rigA(pkcs11.CKA_VERIFY, true), rigA(pkcs11.CKA_LABEL, label)},
		[]*pkcs11.Attribute{rigA(pkcs11.CKA_TOKEN, true), rigA(pkcs11.CKA_PRIVATE, true), rigA(pkcs11.CKA_SIGN, true),
			rigA(pkcs11.CKA_SENSITIVE, true), rigA(pkcs11.CKA_EXTRACTABLE, extractable), rigA(pkcs11.CKA_LABEL, label)})
	if err != nil {
		t.Fatalf("generate %s through the group: %v", label, err)
	}
	return pub, priv
}

func rsaPublicKey(t testing.TB, s *group.Session, h group.ObjectHandle) *rsa.PublicKey {
	t.Helper()
	a, err := s.GetAttributes(rigCtx(t), h, []uint{pkcs11.CKA_MODULUS, pkcs11.CKA_PUBLIC_EXPONENT})
	if err != nil {
		t.Fatalf("read the RSA public key: %v", err)
	}
	return &rsa.PublicKey{N: new(big.Int).SetBytes(a[0].Value), E: int(new(big.Int).SetBytes(a[1].Value).Int64())}
}

func signOnce(ctx context.Context, s *group.Session, key group.ObjectHandle, msg []byte) ([]byte, error) {
	if err := s.SignInit(ctx, pkcs11.NewMechanism(pkcs11.CKM_SHA256_RSA_PKCS, nil), key); err != nil {
		return nil, err
	}
	return s.Sign(ctx, msg)
}

// tokenOf is the token of member name.
func (r *rig) tokenOf(name string) testhsm.Token {
	if srv, ok := r.servers[name]; ok {
		return srv.Token()
	}
	for _, tok := range r.toks {
		if tok.Name == name {
			return tok
		}
	}
	r.t.Fatalf("no member %s", name)
	return testhsm.Token{}
}

// BenchmarkCatchUpOntoNSS times the catch-up (Admit) of a new NSS member
// (served by hsmserve) with a group of one SoftHSM member holding 100 keys
// made through the group: 50 AES-256 keys and 25 RSA-2048 pairs.
func BenchmarkCatchUpOntoNSS(b *testing.B) {
	r := newRig(b, rigOpts{n: 1})
	ctx := rigCtx(b)
	s := r.session()
	for i := range 50 {
		if _, err := s.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), []*pkcs11.Attribute{
			rigA(pkcs11.CKA_TOKEN, true), rigA(pkcs11.CKA_VALUE_LEN, 32), rigA(pkcs11.CKA_EXTRACTABLE, true),
			rigA(pkcs11.CKA_LABEL, fmt.Sprintf("bench-aes-%d", i))}); err != nil {
			b.Fatal(err)
		}
	}
	for i := range 25 {
		genRSAThrough(b, s, fmt.Sprintf("bench-rsa-%d", i), true)
	}
	n := 0
	for b.Loop() {
		b.StopTimer()
		srv := testhsm.ServeNSS(b, fmt.Sprintf("nss-cu-%d", n))
		n++
		tok := srv.Token()
		if err := r.g.AddMember(ctx, config.Member{Name: tok.Name, Module: tok.Module, TokenLabel: tok.Label}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		res, err := r.rec.Admit(ctx, tok.Name)
		b.StopTimer()
		if err != nil || res.CatchUp.Copied != 100 {
			b.Fatalf("admit: copied %d, %v; want 100 copies", res.CatchUp.Copied, err)
		}
		if err := r.g.RemoveMember(ctx, tok.Name); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
