package sync

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/miekg/pkcs11"
)

// countedPair opens two fresh tokens, each holding extra data objects,
// through one testhsm.CallClock, and installs a domain key.
func countedPair(t *testing.T, trusted bool, extra int) (src, dst *slot.Slot, log *testhsm.CallClock, toks []testhsm.Token) {
	t.Helper()
	log = &testhsm.CallClock{}
	toks = testhsm.Take(t, 2)
	src, dst = openSlot(t, toks[0], log), openSlot(t, toks[1], log)
	installDomain(t, testSerial, trusted, []*slot.Slot{src, dst}, toks)
	for _, s := range []*slot.Slot{src, dst} {
		for i := range extra {
			if _, err := s.CreateObject(testContext(t), []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA),
				attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_VALUE, []byte("x")), attr(pkcs11.CKA_LABEL, fmt.Sprintf("filler-%d", i))}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return src, dst, log, toks
}

// TestReplicateSearchesOnce: once a Replicator knows both members, a
// copy makes no search on the source and one on the target (for an
// existing copy), none with Target.Absent, and reads no attribute one at
// a time. SoftHSM answers every FindObjects by visiting each object on
// the token, so a copy's cost no longer grows with the token.
func TestReplicateSearchesOnce(t *testing.T) {
	src, dst, log, _ := countedPair(t, false, 5)
	ctx := testContext(t)
	r := &Replicator{GroupSerial: testSerial}
	// Learn both members (domain key, mechanism).
	replicateWith(t, r, src, genAES(t, src, "warm-up", randomID(t)), Target{Slot: dst})

	kp := genEC(t, src, "counted-ec", randomID(t))
	rsa := genRSA(t, src, "counted-rsa", randomID(t))
	data, err := src.CreateObject(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA),
		attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_VALUE, []byte("payload")), attr(pkcs11.CKA_LABEL, "counted-data"),
		attr(pkcs11.CKA_APPLICATION, "app")})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		h    pkcs11.ObjectHandle
		// most GetAttributes calls on the source and on the target
		srcReads, dstReads int
		pub                pkcs11.ObjectHandle // the public half, for the private key's fingerprint on dst
	}{
		{"AES", genAES(t, src, "counted-aes", randomID(t)), 3, 1, 0},
		{"EC public", kp.Pub, 3, 2, 0},
		{"EC private", kp.Priv, 3, 1, kp.Pub},
		{"RSA public", rsa.Pub, 3, 2, 0},
		{"RSA private", rsa.Priv, 3, 1, rsa.Pub},
		// A data object lacks CKA_KEY_TYPE and CKA_ID: its identity read
		// costs one call per attribute (6) on each side.
		{"data", data, 9, 9, 0},
	} {
		for _, absent := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/absent=%v", c.name, absent), func(t *testing.T) {
				if c.pub != 0 {
					pub := replicateWith(t, r, src, c.pub, Target{Slot: dst})
					defer dst.DestroyObject(ctx, pub)
				}
				log.Reset()
				h := replicateWith(t, r, src, c.h, Target{Slot: dst, Absent: absent})
				finds := map[bool]int{false: 1, true: 0}[absent]
				if n := log.Count(src.Name(), slot.OpFindObjects); n != 0 {
					t.Errorf("%d searches on the source, want none\n%s", n, log)
				}
				if n := log.Count(dst.Name(), slot.OpFindObjects); n != finds {
					t.Errorf("%d searches on the target, want %d\n%s", n, finds, log)
				}
				if n := log.Count(src.Name(), slot.OpGetAttributes); n > c.srcReads {
					t.Errorf("%d reads on the source, want at most %d\n%s", n, c.srcReads, log)
				}
				if n := log.Count(dst.Name(), slot.OpGetAttributes); n > c.dstReads {
					t.Errorf("%d reads on the target, want at most %d\n%s", n, c.dstReads, log)
				}
				if n := log.Count(src.Name(), slot.OpMechanismInfo) + log.Count(dst.Name(), slot.OpMechanismInfo); n != 0 {
					t.Errorf("asked for the mechanism %d times again", n)
				}
				sameObject(t, src, c.h, dst, h)
				if err := dst.DestroyObject(ctx, h); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

func replicateWith(t *testing.T, r *Replicator, src *slot.Slot, h pkcs11.ObjectHandle, dst Target) pkcs11.ObjectHandle {
	t.Helper()
	got, err := r.Replicate(testContext(t), src, h, dst)
	if err != nil {
		t.Fatalf("replicate: %v", err)
	}
	return got
}

// TestReplicateRemembersPerEpoch: the remembered domain key is looked up
// again after a re-login (the handles of private objects die with the
// login on SoftHSM) and after the key was removed and installed again
// under the Replicator's feet (a new handle, same epoch).
func TestReplicateRemembersPerEpoch(t *testing.T) {
	src, dst, log, toks := countedPair(t, false, 0)
	ctx := testContext(t)
	r := &Replicator{GroupSerial: testSerial}
	replicateWith(t, r, src, genAES(t, src, "first", randomID(t)), Target{Slot: dst})

	t.Run("re-login", func(t *testing.T) {
		before := dst.Epoch()
		if err := dst.Logout(ctx); err != nil {
			t.Fatal(err)
		}
		if err := dst.Login(ctx, pkcs11.CKU_USER, secret.PINFromString(toks[1].UserPIN)); err != nil {
			t.Fatal(err)
		}
		if dst.Epoch() == before {
			t.Fatal("the epoch did not change with the login")
		}
		log.Reset()
		k := genAES(t, src, "after-relogin", randomID(t))
		h := replicateWith(t, r, src, k, Target{Slot: dst})
		sameObject(t, src, k, dst, h)
		// The identity search and the domain key's.
		if n := log.Count(dst.Name(), slot.OpFindObjects); n != 2 {
			t.Errorf("%d searches on %s after its re-login, want 2 (copy, domain key)\n%s", n, dst.Name(), log)
		}
	})
	t.Run("domain key installed again", func(t *testing.T) {
		for _, s := range []*slot.Slot{src, dst} {
			if err := domainkey.Remove(ctx, s, testSerial); err != nil {
				t.Fatal(err)
			}
		}
		installDomain(t, testSerial, false, []*slot.Slot{src, dst}, toks)
		k := genAES(t, src, "after-reinstall", randomID(t))
		log.Reset()
		h := replicateWith(t, r, src, k, Target{Slot: dst})
		sameObject(t, src, k, dst, h)
		// The remembered handles failed; both keys were found again.
		if n, m := log.Count(src.Name(), slot.OpFindObjects), log.Count(dst.Name(), slot.OpFindObjects); n != 1 || m != 2 {
			t.Errorf("%d searches on %s and %d on %s, want 1 (domain key) and 2 (copy, domain key)\n%s", n, src.Name(), m, dst.Name(), log)
		}
	})
	t.Run("domain key gone", func(t *testing.T) {
		if err := domainkey.Remove(ctx, dst, testSerial); err != nil {
			t.Fatal(err)
		}
		k := genAES(t, src, "no-domain", randomID(t))
		_, err := r.Replicate(ctx, src, k, Target{Slot: dst})
		if !errors.Is(err, domainkey.ErrNotFound) || !strings.Contains(err.Error(), dst.Name()) {
			t.Fatalf("replicate to a member without domain key: %v, want domainkey.ErrNotFound naming %s", err, dst.Name())
		}
		if n := len(findByLabel(t, dst, "no-domain")); n != 0 {
			t.Errorf("%d objects left on %s", n, dst.Name())
		}
	})
}

// TestReplicateDerivesUnwrapTemplate: the template forced on copies is
// known from the domain key's CKA_TRUSTED, not read back on every copy
// (the audit reads it once per login epoch): the copy of a sensitive key
// is sensitive, and after a trusted install a key marked
// CKA_WRAP_WITH_TRUSTED stays wrappable only by a trusted key. A key
// without the mark keeps its source's CKA_WRAP_WITH_TRUSTED=false, and a
// readable key (CKA_SENSITIVE=false) stays readable, with its source's
// value (both travel under a transit key, transit.go): the application
// made it so, as on its source.
func TestReplicateDerivesUnwrapTemplate(t *testing.T) {
	for _, c := range []struct {
		name    string
		trusted bool
	}{{"trusted", true}, {"untrusted", false}} {
		t.Run(c.name, func(t *testing.T) {
			src, dst, log, _ := countedPair(t, c.trusted, 0)
			r := &Replicator{GroupSerial: testSerial}
			replicateWith(t, r, src, genAES(t, src, "warm-up", randomID(t)), Target{Slot: dst})
			k, err := src.GenerateKey(testContext(t), pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), []*pkcs11.Attribute{
				attr(pkcs11.CKA_VALUE_LEN, 16), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true),
				attr(pkcs11.CKA_SENSITIVE, false), attr(pkcs11.CKA_EXTRACTABLE, true), attr(pkcs11.CKA_ENCRYPT, true),
				attr(pkcs11.CKA_LABEL, "readable")})
			if err != nil {
				t.Fatal(err)
			}
			log.Reset()
			h := replicateWith(t, r, src, k, Target{Slot: dst})
			// The copy's identity: the one read on the target.
			if n := log.Count(dst.Name(), slot.OpGetAttributes); n != 1 {
				t.Errorf("%d reads on the target, want 1 (no unwrap template read)\n%s", n, log)
			}
			if v, ok := getAttr(t, dst, h, pkcs11.CKA_SENSITIVE); !ok || v[0] != 0 {
				t.Errorf("copy of a readable key: CKA_SENSITIVE %x, want false as its source", v)
			}
			want, _ := getAttr(t, src, k, pkcs11.CKA_VALUE)
			if v, ok := getAttr(t, dst, h, pkcs11.CKA_VALUE); !ok || !bytes.Equal(v, want) || len(want) != 16 {
				t.Errorf("the copy of a readable key reads %x, want its source's %x", v, want)
			}
			if v, _ := getAttr(t, dst, h, pkcs11.CKA_WRAP_WITH_TRUSTED); len(v) != 1 || v[0] != 0 {
				t.Errorf("copy of a key without CKA_WRAP_WITH_TRUSTED: %x, want false as its source", v)
			}
			sk := genAES(t, src, "sensitive", randomID(t)) // sensitive and extractable, without CKA_WRAP_WITH_TRUSTED
			sh := replicateWith(t, r, src, sk, Target{Slot: dst})
			if v, ok := getAttr(t, dst, sh, pkcs11.CKA_SENSITIVE); !ok || v[0] != 1 {
				t.Errorf("copy of a sensitive key: CKA_SENSITIVE %x, want true", v)
			}
			if v, ok := getAttr(t, dst, sh, pkcs11.CKA_VALUE); ok {
				t.Errorf("the copy of a sensitive key is readable: %x", v)
			}
			if !c.trusted {
				return
			}
			marked := genAES(t, src, "marked", randomID(t), attr(pkcs11.CKA_WRAP_WITH_TRUSTED, true))
			if v, _ := getAttr(t, dst, replicateWith(t, r, src, marked, Target{Slot: dst}), pkcs11.CKA_WRAP_WITH_TRUSTED); len(v) != 1 || v[0] != 1 {
				t.Errorf("copy of a key marked CKA_WRAP_WITH_TRUSTED: %x, want true", v)
			}
		})
	}
}

// TestReplicateRefusesPlainDomainKey: a domain key made without an unwrap
// template (a user could unwrap a blob into a readable key) fails the
// audit: nothing is replicated under it, and the error says why.
func TestReplicateRefusesPlainDomainKey(t *testing.T) {
	toks := testhsm.Take(t, 2)
	src, dst := openSlot(t, toks[0], nil), openSlot(t, toks[1], nil)
	plainDomainKey(t, testSerial, src, dst)
	var reported []*domainkey.WeakError
	r := &Replicator{GroupSerial: testSerial, OnWeakDomainKey: func(e *domainkey.WeakError) { reported = append(reported, e) }}
	for range 2 {
		_, err := r.Replicate(testContext(t), src, genAES(t, src, fmt.Sprintf("plain-%x", randomID(t)), randomID(t)), Target{Slot: dst})
		var we *domainkey.WeakError
		if !errors.As(err, &we) || we.Member != src.Name() || !slices.Contains(we.Flaws, "CKA_UNWRAP_TEMPLATE does not force CKA_SENSITIVE=true") {
			t.Fatalf("replicate under a plain domain key: %v, want a *domainkey.WeakError for %s naming the unwrap template", err, src.Name())
		}
		if slot.ClassOf(err) != slot.ClassRequest {
			t.Errorf("a weak domain key is classed %v, want a request error (never a health failure)", slot.ClassOf(err))
		}
	}
	if len(reported) != 1 {
		t.Errorf("OnWeakDomainKey called %d times, want once", len(reported))
	}
}

// plainDomainKey puts one AES-256 domain key on each slot with a plain
// CreateObject: no unwrap template.
func plainDomainKey(t *testing.T, serial string, ss ...*slot.Slot) {
	t.Helper()
	value := bytes.Repeat([]byte{0x5a}, 32)
	for _, s := range ss {
		if _, err := s.CreateObject(testContext(t), domainkey.Template(domainkey.Label(serial), value, true, false)); err != nil {
			t.Fatalf("plain domain key on %s: %v", s.Name(), err)
		}
	}
}

// TestReplicateEach: one source to several targets at once is read and
// wrapped once; each target gets its own result, and a target that fails
// does not stop the others.
func TestReplicateEach(t *testing.T) {
	log := &testhsm.CallClock{}
	toks := testhsm.Take(t, 4)
	ss := make([]*slot.Slot, len(toks))
	for i, tok := range toks {
		ss[i] = openSlot(t, tok, log)
	}
	installDomain(t, testSerial, false, ss[:3], toks[:3]) // ss[3] has none
	src := ss[0]
	r := &Replicator{GroupSerial: testSerial}
	replicateWith(t, r, src, genAES(t, src, "warm-up", randomID(t)), Target{Slot: ss[1]})
	replicateWith(t, r, src, genAES(t, src, "warm-up-2", randomID(t)), Target{Slot: ss[2]})

	kp := genEC(t, src, "each", randomID(t))
	pubs, errs := r.ReplicateEach(testContext(t), src, kp.Pub, []Target{{Slot: ss[1]}, {Slot: ss[2]}})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	log.Reset()
	targets := []Target{{Slot: ss[1]}, {Slot: ss[2]}, {Slot: ss[3]}, {}}
	hs, errs := r.ReplicateEach(testContext(t), src, kp.Priv, targets)
	for i, want := range []bool{true, true, false, false} {
		if (errs[i] == nil) != want {
			t.Errorf("target %d: %v, want success %v", i, errs[i], want)
		}
	}
	if !errors.Is(errs[2], domainkey.ErrNotFound) || !strings.Contains(errs[2].Error(), ss[3].Name()) {
		t.Errorf("target without a domain key: %v, want domainkey.ErrNotFound naming %s", errs[2], ss[3].Name())
	}
	if n := log.Count(src.Name(), slot.OpWrapKey); n != 1 {
		t.Errorf("the source was wrapped %d times, want once\n%s", n, log)
	}
	if n := log.Count(src.Name(), slot.OpGetAttributes); n != 3 {
		t.Errorf("%d reads on the source, want 3 (identity, material, unwrap template)\n%s", n, log)
	}
	if n := log.Count(src.Name(), slot.OpFindObjects); n != 0 {
		t.Errorf("%d searches on the source, want none\n%s", n, log)
	}
	for i, s := range ss[1:3] {
		sameObject(t, src, kp.Priv, s, hs[i])
		sameObject(t, src, kp.Pub, s, pubs[i])
	}

	// One slot twice: one after the other, the second finds the first.
	k := genAES(t, src, "twice", randomID(t))
	hs, errs = r.ReplicateEach(testContext(t), src, k, []Target{{Slot: ss[1]}, {Slot: ss[1]}})
	if err := errors.Join(errs...); err != nil || hs[0] != hs[1] {
		t.Errorf("one slot twice: handles %v, %v; want one copy", hs, err)
	}
	if n := len(findByLabel(t, ss[1], "twice")); n != 1 {
		t.Errorf("%d copies on %s, want 1", n, ss[1].Name())
	}
}

// TestReplicateExistingCopySearchesOnce: a key already on the target is
// recognised by its wrapped blob, without the searches for public halves
// that its fingerprint would cost on both members.
func TestReplicateExistingCopySearchesOnce(t *testing.T) {
	src, dst, log, _ := countedPair(t, false, 0)
	r := &Replicator{GroupSerial: testSerial}
	kp := genEC(t, src, "existing", randomID(t))
	replicateWith(t, r, src, kp.Pub, Target{Slot: dst})
	h := replicateWith(t, r, src, kp.Priv, Target{Slot: dst})
	log.Reset()
	if again := replicateWith(t, r, src, kp.Priv, Target{Slot: dst}); again != h {
		t.Fatalf("second replication: handle %d, want %d", again, h)
	}
	if n, m := log.Count(src.Name(), slot.OpFindObjects), log.Count(dst.Name(), slot.OpFindObjects); n != 0 || m != 1 {
		t.Errorf("%d searches on the source and %d on the target, want 0 and 1\n%s", n, m, log)
	}
}

// creates is an interceptor that records how many object creations run
// at once on each token.
type creates struct {
	mu       sync.Mutex
	now, max map[string]int
}

func (c *creates) Before(context.Context, string, slot.Op) error { return nil }

func (c *creates) Wrap(_ context.Context, token string, op slot.Op, call func() error) error {
	if op != slot.OpCreateObject && op != slot.OpUnwrapKey {
		return call()
	}
	c.mu.Lock()
	c.now[token]++
	c.max[token] = max(c.max[token], c.now[token])
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.now[token]--
		c.mu.Unlock()
	}()
	return call()
}

// TestReplicateOneCreateAtATime: copies into one member, from many calls
// at once, are made one at a time (SoftHSM fails concurrent creations on
// one token now and then); copies into different members are not.
func TestReplicateOneCreateAtATime(t *testing.T) {
	c := &creates{now: map[string]int{}, max: map[string]int{}}
	toks := testhsm.Take(t, 3)
	ss := []*slot.Slot{openSlot(t, toks[0], nil), openSlot(t, toks[1], c), openSlot(t, toks[2], c)}
	installDomain(t, testSerial, false, ss, toks)
	r := &Replicator{GroupSerial: testSerial}
	var keys []pkcs11.ObjectHandle
	for i := range 4 {
		kp := genEC(t, ss[0], fmt.Sprintf("turn-%d", i), randomID(t))
		keys = append(keys, kp.Pub, kp.Priv)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(keys)*2)
	for i, k := range keys {
		for j, dst := range ss[1:] {
			wg.Go(func() { _, errs[2*i+j] = r.Replicate(testContext(t), ss[0], k, Target{Slot: dst}) })
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, s := range ss[1:] {
		if m := c.max[s.Name()]; m != 1 {
			t.Errorf("%d objects created at once on %s, want 1", m, s.Name())
		}
	}
}

// TestTrialCopiesOncePerKey: the trial copies of a copyable trusted
// domain key (each one a file SoftHSM writes and destroys again, and a
// second domain key should the member be killed in between) are made once
// per key in a process: a re-login audits the key's attributes again but
// copies nothing; a key installed anew (another check value) is tried
// again.
func TestTrialCopiesOncePerKey(t *testing.T) {
	src, dst, log, toks := countedPair(t, true, 0)
	ctx := testContext(t)
	r := &Replicator{GroupSerial: testSerial}
	audit := func(what string, copies int) {
		t.Helper()
		log.Reset()
		if err := r.Audit(ctx, dst); err != nil {
			t.Fatalf("%s: audit: %v", what, err)
		}
		if n := log.Count(dst.Name(), slot.OpCopyObject); n != copies {
			t.Errorf("%s: %d trial copies, want %d\n%s", what, n, copies, log)
		}
		if n := log.Count(dst.Name(), slot.OpGetAttributes); n == 0 {
			t.Errorf("%s: the key's attributes were not read\n%s", what, log)
		}
		if n := len(findByLabel(t, dst, domainkey.Label(testSerial))); n != 1 {
			t.Errorf("%s: %d domain keys on %s, want 1", what, n, dst.Name())
		}
	}
	audit("first audit", len(domainkey.CopyTrials))
	if err := dst.Logout(ctx); err != nil {
		t.Fatal(err)
	}
	if err := dst.Login(ctx, pkcs11.CKU_USER, secret.PINFromString(toks[1].UserPIN)); err != nil {
		t.Fatal(err)
	}
	audit("after a re-login", 0)
	for _, s := range []*slot.Slot{src, dst} {
		if err := domainkey.Remove(ctx, s, testSerial); err != nil {
			t.Fatal(err)
		}
	}
	installDomain(t, testSerial, true, []*slot.Slot{src, dst}, toks)
	audit("a key installed anew", len(domainkey.CopyTrials))
}
