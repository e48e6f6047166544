package group

import (
	"slices"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/hagroup/hagroup/pkg/sync"
	"github.com/miekg/pkcs11"
)

var edKind = sync.Kind{Class: pkcs11.CKO_PRIVATE_KEY, KeyType: slot.CKKECEdwards}

func genEd25519(t testing.TB, s *Session, label string) error {
	t.Helper()
	_, _, err := s.GenerateKeyPair(testContext(t), pkcs11.NewMechanism(slot.CKMECEdwardsKeyPairGen, nil),
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_EC_PARAMS, ed25519Params), attr(pkcs11.CKA_VERIFY, true), attr(pkcs11.CKA_LABEL, label)},
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SENSITIVE, true), attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_LABEL, label)})
	return err
}

// bareRefusesEd25519 reports whether a bare token of the pool refuses to
// wrap an EdDSA private key (SoftHSM 2.6 does), as the probe finds out.
func bareRefusesEd25519(t testing.TB, tok testhsm.Token) bool {
	t.Helper()
	ctx := testContext(t)
	d := openDirect(t, tok)
	mechs, err := d.Mechanisms(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(mechs, slot.CKMECEdwardsKeyPairGen) {
		t.Fatalf("token %s does not generate Ed25519 keys; the test needs one that does", tok.Name)
	}
	c, err := sync.ProbeWrap(ctx, d, mechs)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(c.Probed, edKind) {
		t.Fatalf("the probe did not try EdDSA private keys on %s: %v", tok.Name, c.Probed)
	}
	return c.Holds(edKind) != nil
}

// TestEd25519OnThreeSoftHSMMembers: SoftHSM 2.6 generates Ed25519 keys but
// cannot wrap their private halves, so a group of three cannot replicate
// them. The virtual slot does not offer the generation mechanism (nor its
// information), a generation answers CKR_MECHANISM_INVALID — a valid code
// of C_GenerateKeyPair, never CKR_KEY_NOT_WRAPPABLE — leaves nothing on any
// member, blames no member, and says which members and why; EC keys are
// still generated and on every member. A token that can wrap them gets
// them generated and replicated instead.
func TestEd25519OnThreeSoftHSMMembers(t *testing.T) {
	f := setup(t, setupOpts{})
	ctx := testContext(t)
	refuses := bareRefusesEd25519(t, f.toks[0])
	mechs, err := f.g.Mechanisms(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := openSession(t, f.g)
	err = genEd25519(t, s, "ed-gen")
	if !refuses {
		if err != nil || !slices.Contains(mechs, slot.CKMECEdwardsKeyPairGen) {
			t.Fatalf("the members wrap EdDSA keys, yet generation is offered %v and answers %v", slices.Contains(mechs, slot.CKMECEdwardsKeyPairGen), err)
		}
		for _, tok := range f.toks {
			if n := len(findDirect(t, openDirect(t, tok), "ed-gen")); n != 2 {
				t.Errorf("%s holds %d halves of the generated key, want 2", tok.Name, n)
			}
		}
		return
	}
	if slices.Contains(mechs, slot.CKMECEdwardsKeyPairGen) {
		t.Error("the virtual slot lists CKM_EC_EDWARDS_KEY_PAIR_GEN, whose keys it cannot replicate")
	}
	if !slices.Contains(mechs, pkcs11.CKM_EC_KEY_PAIR_GEN) || !slices.Contains(mechs, pkcs11.CKM_AES_KEY_GEN) {
		t.Error("the virtual slot dropped CKM_EC_KEY_PAIR_GEN or CKM_AES_KEY_GEN, whose keys it replicates")
	}
	if _, err := f.g.MechanismInfo(ctx, slot.CKMECEdwardsKeyPairGen); CodeOf(err) != pkcs11.CKR_MECHANISM_INVALID {
		t.Errorf("MechanismInfo(CKM_EC_EDWARDS_KEY_PAIR_GEN): %v, want CKR_MECHANISM_INVALID", err)
	}
	if code := CodeOf(err); code != pkcs11.CKR_MECHANISM_INVALID {
		t.Fatalf("Ed25519 generation through the group: %v (0x%x), want CKR_MECHANISM_INVALID", err, code)
	}
	for _, tok := range f.toks {
		if n := len(findDirect(t, openDirect(t, tok), "ed-gen")); n != 0 {
			t.Errorf("%s holds %d ed-gen objects after the refusal, want 0", tok.Name, n)
		}
		if st := memberState(f.g, tok.Name); st != member.Active {
			t.Errorf("%s is %v: a key type its token cannot wrap is not a member's fault", tok.Name, st)
		}
		refused := f.events.byKind(CreationRefused, tok.Name)
		if len(refused) != 1 || !strings.Contains(refused[0].Err.Error(), "EC_EDWARDS private key") || !strings.Contains(refused[0].Err.Error(), "CKR_KEY_NOT_WRAPPABLE") {
			t.Errorf("creation_refused events for %s: %v; want one naming the EdDSA private key and CKR_KEY_NOT_WRAPPABLE", tok.Name, refused)
		}
		if n := f.events.count(KeysUnholdable, tok.Name); n != 1 {
			t.Errorf("%d keys_unholdable events for %s, want 1 saying it cannot hold EdDSA keys", n, tok.Name)
		}
	}
	for _, m := range f.g.view().members {
		if !slices.Contains(f.g.capability(m).Unholdable(), edKind) {
			t.Errorf("member %s was not probed to refuse EdDSA private keys", m.Name())
		}
	}
	genEC(t, s, "ec-still")
	for _, tok := range f.toks {
		if n := len(findDirect(t, openDirect(t, tok), "ec-still")); n != 2 {
			t.Errorf("%s holds %d halves of an EC key pair, want 2", tok.Name, n)
		}
	}
}

// TestEd25519OnOneMember: with one member nothing is replicated, so the
// group offers and makes whatever its token makes, as the bare token does.
func TestEd25519OnOneMember(t *testing.T) {
	f := setup(t, setupOpts{n: 1})
	ctx := testContext(t)
	mechs, err := f.g.Mechanisms(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(mechs, slot.CKMECEdwardsKeyPairGen) {
		t.Fatal("a one-member group does not offer CKM_EC_EDWARDS_KEY_PAIR_GEN, which its token has")
	}
	if err := genEd25519(t, openSession(t, f.g), "ed-one"); err != nil {
		t.Fatalf("Ed25519 generation on one member: %v", err)
	}
	if n := len(findDirect(t, openDirect(t, f.toks[0]), "ed-one")); n != 2 {
		t.Errorf("the member holds %d halves, want 2", n)
	}
}

// TestServedMemberCannotTakeKeys: a member behind p11-kit 0.24 (no
// CKM_AES_KEY_WRAP_PAD through its RPC) cannot receive private or secret
// keys, so while it serves no such key is made through the group: key
// generation is not offered and answers CKR_MECHANISM_INVALID, a secret key
// from a template answers CKR_TEMPLATE_INCONSISTENT, each naming the
// member in a creation_refused event, and nothing stays on the member
// that would have made it (the first one that can wrap). Public objects
// still reach every member. Once the member is removed, EC and RSA keys
// are made and replicated again.
func TestServedMemberCannotTakeKeys(t *testing.T) {
	srv := testhsm.Serve(t, "nowrap-create")
	toks := append([]testhsm.Token{srv.Token()}, testhsm.Take(t, 2)...)
	f := setup(t, setupOpts{toks: toks, noDomain: true})
	installDomain(t, f.g.Serial(), toks[1:], true)
	ctx := testContext(t)
	served := toks[0].Name
	mechs, err := f.g.Mechanisms(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []uint{pkcs11.CKM_EC_KEY_PAIR_GEN, pkcs11.CKM_RSA_PKCS_KEY_PAIR_GEN, pkcs11.CKM_AES_KEY_GEN} {
		if slices.Contains(mechs, m) {
			t.Errorf("the virtual slot offers mechanism 0x%x, whose keys cannot reach %s", m, served)
		}
	}
	s := openSession(t, f.g)
	_, _, err = s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_EC_PARAMS, p256), attr(pkcs11.CKA_VERIFY, true), attr(pkcs11.CKA_LABEL, "nowrap-ec")},
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SENSITIVE, true), attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_LABEL, "nowrap-ec")})
	if code := CodeOf(err); code != pkcs11.CKR_MECHANISM_INVALID {
		t.Fatalf("EC generation with %s serving: %v (0x%x), want CKR_MECHANISM_INVALID", served, err, code)
	}
	_, err = s.CreateObject(ctx, []*pkcs11.Attribute{
		attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES), attr(pkcs11.CKA_TOKEN, true),
		attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SENSITIVE, true), attr(pkcs11.CKA_ENCRYPT, true),
		attr(pkcs11.CKA_LABEL, "nowrap-aes"), attr(pkcs11.CKA_VALUE, make([]byte, 32)),
	})
	if code := CodeOf(err); code != pkcs11.CKR_TEMPLATE_INCONSISTENT {
		t.Fatalf("AES key from a template with %s serving: %v (0x%x), want CKR_TEMPLATE_INCONSISTENT", served, err, code)
	}
	refused := f.events.byKind(CreationRefused, served)
	if len(refused) != 2 || !strings.Contains(refused[0].Err.Error(), MechWrapPad) {
		t.Errorf("creation_refused events for %s: %v; want 2 naming %s", served, refused, MechWrapPad)
	}
	if n := f.events.count(CreationRefused, ""); n != 2 {
		t.Errorf("%d creation_refused events, want 2 (the other members can hold keys)", n)
	}
	for _, tok := range toks {
		d := openDirect(t, tok)
		for _, label := range []string{"nowrap-ec", "nowrap-aes"} {
			if n := len(findDirect(t, d, label)); n != 0 {
				t.Errorf("%s holds %d %s objects after the refusal, want 0", tok.Name, n, label)
			}
		}
		if st := memberState(f.g, tok.Name); st != member.Active {
			t.Errorf("%s is %v after a refused creation", tok.Name, st)
		}
	}
	if _, err := s.CreateObject(ctx, []*pkcs11.Attribute{
		attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, false),
		attr(pkcs11.CKA_LABEL, "nowrap-data"), attr(pkcs11.CKA_VALUE, []byte("public")),
	}); err != nil {
		t.Fatalf("a data object: %v", err)
	}
	for _, tok := range toks {
		if n := len(findDirect(t, openDirect(t, tok), "nowrap-data")); n != 1 {
			t.Errorf("%s holds %d copies of the data object, want 1", tok.Name, n)
		}
	}

	if err := f.g.RemoveMember(ctx, served); err != nil {
		t.Fatal(err)
	}
	genEC(t, s, "wrap-ec")
	genRSA(t, s, "wrap-rsa")
	for _, tok := range toks[1:] {
		d := openDirect(t, tok)
		for _, label := range []string{"wrap-ec", "wrap-rsa"} {
			if n := len(findDirect(t, d, label)); n != 2 {
				t.Errorf("%s holds %d halves of %s, want 2", tok.Name, n, label)
			}
		}
	}
}

// TestReplicaRefusalUndoesCreation: a replica that refuses its copy as a
// request (not a health failure) will never hold the key, so the creation
// fails and nothing stays on any member, the primary included; the member
// stays in service and is named in a creation_refused event.
func TestReplicaRefusalUndoesCreation(t *testing.T) {
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{interceptor: faults})
	ctx := testContext(t)
	s := openSession(t, f.g)
	victim := f.toks[2].Name
	faults.Fail(victim, slot.OpUnwrapKey, pkcs11.Error(pkcs11.CKR_TEMPLATE_INCONSISTENT))
	_, _, err := s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_EC_PARAMS, p256), attr(pkcs11.CKA_VERIFY, true), attr(pkcs11.CKA_LABEL, "refused")},
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SENSITIVE, true), attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_LABEL, "refused")})
	faults.Heal(victim)
	if code := CodeOf(err); code != pkcs11.CKR_MECHANISM_INVALID {
		t.Fatalf("generation a replica refuses: %v (0x%x), want CKR_MECHANISM_INVALID", err, code)
	}
	for _, tok := range f.toks {
		if n := len(findDirect(t, openDirect(t, tok), "refused")); n != 0 {
			t.Errorf("%s holds %d objects of the refused creation, want 0", tok.Name, n)
		}
		if st := memberState(f.g, tok.Name); st != member.Active {
			t.Errorf("%s is %v after a refusal", tok.Name, st)
		}
	}
	if n := f.events.count(CreationRefused, victim); n != 1 {
		t.Errorf("%d creation_refused events for %s, want 1", n, victim)
	}
	genEC(t, s, "after-refusal")
	for _, tok := range f.toks {
		if n := len(findDirect(t, openDirect(t, tok), "after-refusal")); n != 2 {
			t.Errorf("%s holds %d halves of a key made after the refusal, want 2", tok.Name, n)
		}
	}
}

func (l *eventLog) byKind(kind EventKind, memberName string) []Event {
	var out []Event
	for _, e := range l.all() {
		if e.Kind == kind && e.Member == memberName {
			out = append(out, e)
		}
	}
	return out
}

// genRSA makes a 2048-bit RSA token key pair through the group.
func genRSA(t testing.TB, s *Session, label string) {
	t.Helper()
	if _, _, err := s.GenerateKeyPair(testContext(t), pkcs11.NewMechanism(pkcs11.CKM_RSA_PKCS_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_MODULUS_BITS, 2048), attr(pkcs11.CKA_PUBLIC_EXPONENT, []byte{1, 0, 1}),
			attr(pkcs11.CKA_VERIFY, true), attr(pkcs11.CKA_LABEL, label)},
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SENSITIVE, true),
			attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_LABEL, label)}); err != nil {
		t.Fatalf("GenerateKeyPair RSA %s: %v", label, err)
	}
}
