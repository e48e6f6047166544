package group

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/miekg/pkcs11"
)

// TestCreateCostsConstantCalls: a replicated creation of a named AES key
// (what mkkeys and pkcs11-tool --keygen ask) costs the same member calls,
// op by op, whether the members hold a few objects or ten times as many,
// and at most one search of each member: SoftHSM answers every search by
// visiting every object of the token (docs/BENCHMARKS.md), so each search
// on the way makes a creation cost what the token holds.
func TestCreateCostsConstantCalls(t *testing.T) {
	ctx := testContext(t)
	toks := takeTokens(t, 3)
	fill := func(from, to int) {
		for _, tok := range toks {
			d := openDirect(t, tok)
			for i := from; i < to; i++ {
				if _, err := d.CreateObject(ctx, []*pkcs11.Attribute{
					attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true),
					attr(pkcs11.CKA_LABEL, fmt.Sprintf("filler-%03d", i)), attr(pkcs11.CKA_VALUE, []byte{byte(i)}),
				}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	ops := []slot.Op{slot.OpFindObjects, slot.OpGetAttributes, slot.OpSetAttributes, slot.OpGenerateKey, slot.OpWrapKey, slot.OpUnwrapKey,
		slot.OpCreateObject, slot.OpDestroyObject, slot.OpSessionInfo, slot.OpTokenInfo, slot.OpMechanisms, slot.OpMechanismInfo, slot.OpLogin, slottest.All}
	round := 0
	// calls opens a group as a fresh process would, logs in, makes one
	// named key through it, and returns the member calls of the creation
	// alone, per op, summed over the members and on the primary (the
	// first member: primary-backup), and the searches per member.
	calls := func() (map[slot.Op]int, map[slot.Op]int, []int) {
		faults := slottest.NewFaults()
		f := setup(t, setupOpts{toks: toks, interceptor: faults, noHedge: true, journal: true, policy: config.PolicyPrimaryBackup})
		s := openSession(t, f.g)
		count := func() (map[slot.Op]int, map[slot.Op]int, []int) {
			out, primary := map[slot.Op]int{}, map[slot.Op]int{}
			per := make([]int, len(toks))
			for _, op := range ops {
				primary[op] = faults.Calls(toks[0].Name, op)
				for i, tok := range toks {
					n := faults.Calls(tok.Name, op)
					out[op] += n
					if op == slot.OpFindObjects {
						per[i] = n
					}
				}
			}
			// The session pool opens a session when two calls overlap,
			// whatever the token holds: not a cost of the objects.
			for _, tok := range toks {
				out[slottest.All] -= faults.Calls(tok.Name, slot.OpOpenSession)
			}
			return out, primary, per
		}
		// A first creation warms what a process learns once (the domain
		// key's handle, the wrap mechanism): the one counted is a later one.
		gen := func(label string) error {
			_, err := s.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), []*pkcs11.Attribute{
				attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SENSITIVE, true),
				attr(pkcs11.CKA_ENCRYPT, true), attr(pkcs11.CKA_DECRYPT, true), attr(pkcs11.CKA_VALUE_LEN, 32),
				attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_ID, []byte(label)),
			})
			return err
		}
		mk := func(label string) {
			if err := gen(label); err != nil {
				t.Fatalf("generate %s: %v", label, err)
			}
		}
		round++
		mk(fmt.Sprintf("warm-%d", round))
		before, primaryBefore, perBefore := count()
		counted := fmt.Sprintf("counted-%d", round)
		mk(counted)
		after, primary, per := count()
		// The one search still keeps identities unique: the same name
		// again is refused, and every member holds one key of it.
		if err := gen(counted); CodeOf(err) != pkcs11.CKR_TEMPLATE_INCONSISTENT {
			t.Errorf("a second key named %s: %v, want CKR_TEMPLATE_INCONSISTENT", counted, err)
		}
		for _, tok := range toks {
			if n := len(findDirect(t, openDirect(t, tok), counted)); n != 1 {
				t.Errorf("%s holds %d objects named %s, want 1", tok.Name, n, counted)
			}
		}
		for op := range after {
			after[op] -= before[op]
			primary[op] -= primaryBefore[op]
		}
		for i := range per {
			per[i] -= perBefore[i]
		}
		return after, primary, per
	}
	fill(0, 5)
	few, primary, perFew := calls()
	fill(5, 50)
	many, _, _ := calls()
	for i, n := range perFew {
		if n > 1 {
			t.Errorf("a creation searched %s %d times, want at most once", toks[i].Name, n)
		}
	}
	for _, op := range ops {
		if few[op] != many[op] {
			t.Errorf("%q calls: %d with a few objects per member, %d with ten times as many: a creation's cost grows with the objects", op, few[op], many[op])
		}
	}
	// The new key is read and wrapped on the primary once for both
	// targets: its identity (2 reads), unwrap template (1) and wrap (1),
	// beside the creation's own 2 reads.
	if n := primary[slot.OpWrapKey]; n != 1 {
		t.Errorf("the primary wrapped the new key %d times for %d targets, want once", n, len(toks)-1)
	}
	if n := primary[slot.OpGetAttributes]; n > 5 {
		t.Errorf("the primary answered %d reads of the new key, want at most 5 (the creation's 2, one copy source's 3 for every target)", n)
	}
	t.Logf("member calls of one replicated creation: %v; on the primary %v; searches per member %v", many, primary, perFew)
}

// TestFirstSignatureCostsConstantCalls: what a fresh process pays for its
// first signature — the group opened, logged in, one key found by label,
// one signature, under the default policy (least busy) — costs the same
// member calls, op by op, whether the members hold a few objects or ten
// times as many, and no more searches than the login's and the find's:
// the signature goes to the member where the find learned the key's
// handle, not to one where it would be searched for first.
func TestFirstSignatureCostsConstantCalls(t *testing.T) {
	ctx := testContext(t)
	toks := takeTokens(t, 3)
	importSecret(t, toks, "wanted")
	fill := func(from, to int) {
		for _, tok := range toks {
			d := openDirect(t, tok)
			for i := from; i < to; i++ {
				if _, err := d.CreateObject(ctx, []*pkcs11.Attribute{
					attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true),
					attr(pkcs11.CKA_LABEL, fmt.Sprintf("filler-%03d", i)), attr(pkcs11.CKA_VALUE, []byte{byte(i)}),
				}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	ops := []slot.Op{slot.OpFindObjects, slot.OpGetAttributes, slot.OpSign, slot.OpLogin, slot.OpTokenInfo, slot.OpMechanisms, slot.OpMechanismInfo, slot.OpSessionInfo, slottest.All}
	calls := func() map[slot.Op]int {
		faults := slottest.NewFaults()
		f := setup(t, setupOpts{toks: toks, interceptor: faults, noHedge: true})
		hs, err := f.g.Find(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_LABEL, "wanted")})
		if err != nil || len(hs) != 1 {
			t.Fatalf("find by label: %v, %d handles", err, len(hs))
		}
		if _, err := f.g.Sign(ctx, pkcs11.NewMechanism(pkcs11.CKM_SHA256_HMAC, nil), hs[0], []byte("data")); err != nil {
			t.Fatalf("sign: %v", err)
		}
		out := map[slot.Op]int{}
		for _, op := range ops {
			for _, tok := range toks {
				out[op] += faults.Calls(tok.Name, op)
			}
		}
		for _, tok := range toks {
			out[slottest.All] -= faults.Calls(tok.Name, slot.OpOpenSession) // the pool's, not the objects'
		}
		return out
	}
	fill(0, 5)
	few := calls()
	fill(5, 50)
	many := calls()
	for _, op := range ops {
		if few[op] != many[op] {
			t.Errorf("%q calls: %d with a few objects per member, %d with ten times as many: a first signature's cost grows with the objects", op, few[op], many[op])
		}
	}
	// The behind marks (one search of each member: admission) and the
	// application's search (one member).
	if want := len(toks) + 1; few[slot.OpFindObjects] > want {
		t.Errorf("a first signature searched the members %d times, want at most %d", few[slot.OpFindObjects], want)
	}
	t.Logf("member calls of open, login, find by label, sign: %v", many)
}

// TestAgentLoginReportsWeakDomainKey: the agent's login (LoginConfigured,
// the members' own PIN sources) audits every member's domain key at once,
// so the operator hears of a weak one when haagent starts; an
// application's login audits none (the first wrap or unwrap does).
func TestAgentLoginReportsWeakDomainKey(t *testing.T) {
	ctx := testContext(t)
	for _, agent := range []bool{true, false} {
		f := setup(t, setupOpts{n: 2, noDomain: true, noLogin: true, ownPINs: true})
		value := make([]byte, 32)
		for _, tok := range f.toks {
			// The old way: modifiable, with every use.
			if _, err := openDirect(t, tok).CreateObject(ctx, []*pkcs11.Attribute{
				attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
				attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SENSITIVE, true),
				attr(pkcs11.CKA_EXTRACTABLE, false), attr(pkcs11.CKA_WRAP, true), attr(pkcs11.CKA_UNWRAP, true),
				attr(pkcs11.CKA_MODIFIABLE, true), attr(pkcs11.CKA_LABEL, domainkey.Label(f.cfg.Serial)), attr(pkcs11.CKA_VALUE, value),
			}); err != nil {
				t.Fatal(err)
			}
		}
		var err error
		if agent {
			err = f.g.LoginConfigured(ctx)
		} else {
			err = f.g.Login(ctx, pkcs11.CKU_USER, secret.PINFromString(f.toks[0].UserPIN))
		}
		if err != nil {
			t.Fatalf("login (agent %v): %v", agent, err)
		}
		for _, tok := range f.toks {
			n := f.events.count(DomainKeyWeak, tok.Name)
			switch {
			case agent && n != 1:
				t.Errorf("after the agent's login: %d domain_key_weak events for %s, want 1", n, tok.Name)
			case !agent && n != 0:
				t.Errorf("after an application's login: %d domain_key_weak events for %s, want none yet", n, tok.Name)
			}
		}
	}
}

// BenchmarkCreateCalls: where the time of one replicated creation of a
// named AES key goes, member call by member call, with 3 members each
// behind its own hsmserve holding -createcalls.keys AES keys (100 unless
// told): every member call of the creations counted and timed (a
// slot.WrapInterceptor around the module call), against a bare creation,
// the same C_GenerateKey on the first member's token directly, alternated
// with them (docs/BENCHMARKS.md, "where a replicated creation's time goes").
//
//	go test -run '^$' -bench CreateCalls -benchtime 20x ./pkg/group -createcalls.keys 1000
func BenchmarkCreateCalls(b *testing.B) {
	ctx := context.Background()
	var toks []testhsm.Token
	for i := range 3 {
		toks = append(toks, testhsm.ServeRemote(b, fmt.Sprintf("cc%d", i)).Token())
	}
	keyTmpl := func(label string) []*pkcs11.Attribute {
		return []*pkcs11.Attribute{
			attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SENSITIVE, true),
			attr(pkcs11.CKA_ENCRYPT, true), attr(pkcs11.CKA_DECRYPT, true), attr(pkcs11.CKA_VALUE_LEN, 32),
			attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_ID, []byte(label)),
		}
	}
	aes := pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil)
	var wg sync.WaitGroup
	errs := make([]error, len(toks))
	for i, tok := range toks {
		d := openDirect(b, tok)
		wg.Go(func() {
			for k := range *createCallsKeys {
				if _, err := d.GenerateKey(ctx, aes, keyTmpl(fmt.Sprintf("filler-%05d", k))); err != nil {
					errs[i] = fmt.Errorf("fill %s: %w", tok.Name, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	clock := &testhsm.CallClock{}
	f := setup(b, setupOpts{toks: toks, interceptor: clock, noHedge: true, journal: true, policy: config.PolicyPrimaryBackup})
	s := openSession(b, f.g)
	bare := openDirect(b, toks[0])
	// The first creation learns what a process learns once (the domain
	// key's handle, the wrap mechanism): not counted.
	if _, err := s.GenerateKey(ctx, aes, keyTmpl("warm")); err != nil {
		b.Fatal(err)
	}
	clock.Reset()
	var group, direct time.Duration
	n := 0
	for b.Loop() {
		start := time.Now()
		if _, err := s.GenerateKey(ctx, aes, keyTmpl(fmt.Sprintf("g-%05d", n))); err != nil {
			b.Fatal(err)
		}
		group += time.Since(start)
		start = time.Now()
		if _, err := bare.GenerateKey(ctx, aes, keyTmpl(fmt.Sprintf("b-%05d", n))); err != nil {
			b.Fatal(err)
		}
		direct += time.Since(start)
		n++
	}
	b.ReportMetric(group.Seconds()*1e3/float64(n), "group-ms")
	b.ReportMetric(direct.Seconds()*1e3/float64(n), "bare-ms")
	b.ReportMetric(float64(group)/float64(direct), "ratio")
	b.Logf("member calls per creation (calls, ms): %s", clock.Report(n))
}

// createCallsKeys is how many AES keys each member holds in BenchmarkCreateCalls.
var createCallsKeys = flag.Int("createcalls.keys", 100, "AES keys on each member in BenchmarkCreateCalls")
