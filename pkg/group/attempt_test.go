package group

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
)

// The executor's rule (attempt.go) on every path that runs on members.

var hmac = pkcs11.NewMechanism(pkcs11.CKM_SHA256_HMAC, nil)

// macKey makes a token HMAC key labelled label through the group.
func macKey(t *testing.T, s *Session, label string) ObjectHandle {
	t.Helper()
	h, err := s.GenerateKey(testContext(t), pkcs11.NewMechanism(pkcs11.CKM_GENERIC_SECRET_KEY_GEN, nil), []*pkcs11.Attribute{
		attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_GENERIC_SECRET), attr(pkcs11.CKA_VALUE_LEN, 32),
		attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SENSITIVE, true),
		attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_VERIFY, true), attr(pkcs11.CKA_LABEL, label),
	})
	if err != nil {
		t.Fatalf("GenerateKey %s: %v", label, err)
	}
	return h
}

func dataTemplate(label string) []*pkcs11.Attribute {
	return []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), attr(pkcs11.CKA_TOKEN, true),
		attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_VALUE, []byte("some data"))}
}

// path is one way an operation reaches the members, with the slot op a
// fault hits on it.
type path struct {
	name string
	op   slot.Op
	// run does the operation on a group whose key "k" (HMAC) exists;
	// label names what it makes or changes.
	run func(ctx context.Context, f *fixture, s *Session, key ObjectHandle, label string) error
	// held is how many objects labelled label each member should hold
	// after run failed (and nothing changed), -1: not checked.
	held int
	// victim is the index of the member a fault on one member hits (0:
	// the primary, first in every order).
	victim int
	// ownPINs: the members log in with their own PIN sources.
	ownPINs bool
	// alone: one member serves the request (the replication's source, a
	// probe): a fault on it is the answer of every member that can, and
	// the request fails with it.
	alone bool
	// again: the path's own next run on the member serves as the other
	// member (a probe confirms the last probe's ambiguous answer).
	again bool
	// quiet: the application gets CKR_OK whatever the members answer.
	quiet bool
}

var paths = []path{
	{name: "single-part", op: slot.OpSign, held: -1, run: func(ctx context.Context, f *fixture, _ *Session, key ObjectHandle, _ string) error {
		_, err := f.g.Sign(ctx, hmac, key, []byte("data"))
		return err
	}},
	{name: "multi-part first step", op: slot.OpSignUpdate, held: -1, run: func(ctx context.Context, _ *fixture, s *Session, key ObjectHandle, _ string) error {
		if err := s.SignInit(ctx, hmac, key); err != nil {
			return err
		}
		if err := s.SignUpdate(ctx, []byte("data")); err != nil {
			return err
		}
		_, err := s.SignFinal(ctx)
		return err
	}},
	{name: "destroy", op: slot.OpDestroyObject, held: 1, run: func(ctx context.Context, f *fixture, s *Session, _ ObjectHandle, label string) error {
		h, err := s.CreateObject(ctx, dataTemplate(label))
		if err != nil {
			return err
		}
		return f.g.DestroyObject(ctx, h)
	}},
	{name: "set-attributes", op: slot.OpSetAttributes, held: 0, run: func(ctx context.Context, f *fixture, _ *Session, key ObjectHandle, label string) error {
		return f.g.SetAttributes(ctx, key, []*pkcs11.Attribute{attr(pkcs11.CKA_LABEL, label)})
	}},
	{name: "create", op: slot.OpCreateObject, held: 0, run: func(ctx context.Context, _ *fixture, s *Session, _ ObjectHandle, label string) error {
		_, err := s.CreateObject(ctx, dataTemplate(label))
		return err
	}},
	{name: "login proof", op: slot.OpLogin, held: -1, run: func(ctx context.Context, f *fixture, _ *Session, _ ObjectHandle, _ string) error {
		// The application logs in again: the PIN's proof on the first
		// member, then the others' logins.
		if err := f.g.Logout(ctx); err != nil && CodeOf(err) != pkcs11.CKR_USER_NOT_LOGGED_IN {
			return err
		}
		return f.g.Login(ctx, pkcs11.CKU_USER, secret.PINFromString(f.toks[0].UserPIN))
	}},
	{name: "login of the others", op: slot.OpLogin, held: -1, victim: 2, ownPINs: true, run: func(ctx context.Context, f *fixture, _ *Session, _ ObjectHandle, _ string) error {
		// Every member logs in with its own PIN source at once (the
		// agent's login): no proof served the request before.
		if err := f.g.Logout(ctx); err != nil && CodeOf(err) != pkcs11.CKR_USER_NOT_LOGGED_IN {
			return err
		}
		return f.g.LoginConfigured(ctx)
	}},
	{name: "replicate target", op: slot.OpUnwrapKey, held: 0, victim: 2, run: generateAES},
	{name: "replicate source", op: slot.OpWrapKey, held: 0, alone: true, run: generateAES},
	{name: "logout", op: slot.OpLogout, held: -1, quiet: true, run: func(ctx context.Context, f *fixture, _ *Session, _ ObjectHandle, _ string) error {
		if err := f.g.Logout(ctx); err != nil {
			return err
		}
		return f.g.Login(ctx, pkcs11.CKU_USER, secret.PINFromString(f.toks[0].UserPIN))
	}},
	{name: "probe", op: slot.OpTokenInfo, held: -1, alone: true, again: true, run: func(ctx context.Context, f *fixture, _ *Session, _ ObjectHandle, _ string) error {
		// The agent's health probe of every member.
		var errs []error
		for _, tok := range f.toks {
			_, err := f.g.Probe(ctx, tok.Name)
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}},
}

// generateAES makes a token AES key labelled label: a secret key travels
// to the other members wrapped by the primary (the source) and unwrapped
// by each target.
func generateAES(ctx context.Context, _ *fixture, s *Session, _ ObjectHandle, label string) error {
	_, err := s.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), aesTemplate(label))
	return err
}

// faultOn makes op fail with err on the named tokens.
func faultOn(faults *slottest.Faults, names []string, op slot.Op, err error) {
	for _, n := range names {
		faults.Fail(n, op, err)
	}
}

func names(toks []testhsm.Token) []string {
	var out []string
	for _, t := range toks {
		out = append(out, t.Name)
	}
	return out
}

// With failure_threshold = 1, an ambiguous error that every member gives
// for one request fails no member, on every path: the application gets
// the token's CKR_GENERAL_ERROR, nothing is left or changed on any
// member, and the same request goes through once the fault is gone.
func TestAmbiguousErrorOnEveryMemberFailsNoMember(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			faults := slottest.NewFaults()
			f := setup(t, setupOpts{interceptor: faults, threshold: 1, policy: config.PolicyPrimaryBackup, ownPINs: p.ownPINs})
			s := openSession(t, f.g)
			ctx := testContext(t)
			key := macKey(t, s, "k")
			faultOn(faults, names(f.toks), p.op, errGeneral)
			err := p.run(ctx, f, s, key, "ambiguous")
			switch {
			case p.quiet && err != nil:
				t.Fatalf("%s refused by every member: %v, want CKR_OK", p.name, err)
			case !p.quiet && CodeOf(err) != pkcs11.CKR_GENERAL_ERROR:
				t.Fatalf("%s refused by every member: %v (0x%x), want CKR_GENERAL_ERROR", p.name, err, CodeOf(err))
			}
			wantServing(t, f, "after a CKR_GENERAL_ERROR from every member")
			if n := f.events.count(MemberFailed, ""); n != 0 {
				t.Errorf("%d MemberFailed events, want 0", n)
			}
			reached := 0
			for _, tok := range f.toks {
				if faults.Calls(tok.Name, p.op) > 0 {
					reached++
				}
			}
			switch {
			case p.alone && reached < 1:
				t.Errorf("the request reached no member")
			case !p.alone && reached < 2:
				t.Errorf("the request reached %d members, want it tried on more than one", reached)
			}
			if p.held >= 0 {
				for i, n := range holdsLabel(t, f, "ambiguous") {
					if n != p.held {
						t.Errorf("member %s holds %d objects labelled %q, want %d", f.toks[i].Name, n, "ambiguous", p.held)
					}
				}
			}
			for _, tok := range f.toks {
				faults.Heal(tok.Name)
			}
			if err := p.run(ctx, f, s, key, "healed"); err != nil {
				t.Fatalf("%s once the fault is gone: %v", p.name, err)
			}
		})
	}
}

// An error on the member an operation goes to first, while another member
// serves it: a device error, and an ambiguous error too (another member
// served the same request), fail that member (failure_threshold = 1) and
// the operation succeeds elsewhere. Where one member alone serves the
// request, the application gets its answer, and an ambiguous one fails it
// only once confirmed (the probe's next run) or never (the replication's
// source: the request's fault).
func TestErrorOnOneMemberFailsItOver(t *testing.T) {
	for _, fault := range []struct {
		name string
		err  error
	}{{"device error", errDevice}, {"general error", errGeneral}} {
		for _, p := range paths {
			t.Run(fault.name+"/"+p.name, func(t *testing.T) {
				faults := slottest.NewFaults()
				f := setup(t, setupOpts{interceptor: faults, threshold: 1, policy: config.PolicyPrimaryBackup, ownPINs: p.ownPINs})
				s := openSession(t, f.g)
				ctx := testContext(t)
				key := macKey(t, s, "k")
				victim := f.toks[p.victim].Name
				faults.Fail(victim, p.op, fault.err)
				err := p.run(ctx, f, s, key, "served")
				switch {
				case p.alone && CodeOf(err) != slot.CodeOf(fault.err):
					t.Fatalf("%s with member %s alone refusing: %v (0x%x), want its answer", p.name, victim, err, CodeOf(err))
				case !p.alone && err != nil:
					t.Fatalf("%s with member %s refusing: %v", p.name, victim, err)
				}
				if faults.Calls(victim, p.op) == 0 {
					t.Fatalf("the fault on %s was not exercised", victim)
				}
				if p.alone && fault.err == errGeneral {
					if st := memberState(f.g, victim); !st.Serving() {
						t.Fatalf("member %s is %v after an ambiguous answer nothing confirmed, want serving", victim, st)
					}
					if !p.again {
						return
					}
					if err := p.run(ctx, f, s, key, "again"); CodeOf(err) != pkcs11.CKR_GENERAL_ERROR {
						t.Fatalf("%s again: %v, want CKR_GENERAL_ERROR", p.name, err)
					}
				}
				if st := memberState(f.g, victim); st != member.Failed {
					t.Errorf("member %s is %v after a %s another member did not give, want failed", victim, st, fault.name)
				}
				for _, tok := range f.toks {
					if st := memberState(f.g, tok.Name); tok.Name != victim && !st.Serving() {
						t.Errorf("member %s is %v, want serving", tok.Name, st)
					}
				}
			})
		}
	}
}

// Issue 16 item 6: key management that has changed no member moves to the
// next primary, as single-part operations do.
func TestCreateMovesToTheNextPrimaryBeforeAnyMemberChanged(t *testing.T) {
	cert := func(label string) []*pkcs11.Attribute {
		return []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_CERTIFICATE), attr(pkcs11.CKA_CERTIFICATE_TYPE, pkcs11.CKC_X_509),
			attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_LABEL, label), attr(pkcs11.CKA_ID, []byte("id-"+label)),
			attr(pkcs11.CKA_SUBJECT, []byte("subject")), attr(pkcs11.CKA_VALUE, []byte("not really DER"))}
	}
	check := func(t *testing.T, f *fixture, primary, label string, perPrimary int) {
		t.Helper()
		if st := memberState(f.g, primary); st != member.Failed {
			t.Errorf("the primary %s is %v, want failed", primary, st)
		}
		for i, n := range holdsLabel(t, f, label) {
			want := perPrimary
			if f.toks[i].Name == primary {
				want = 0
			}
			if n != want {
				t.Errorf("member %s holds %d objects labelled %q, want %d", f.toks[i].Name, n, label, want)
			}
		}
	}
	t.Run("device error", func(t *testing.T) {
		faults := slottest.NewFaults()
		f := setup(t, setupOpts{interceptor: faults, threshold: 1, policy: config.PolicyPrimaryBackup})
		primary := f.g.Primary()
		faults.Fail(primary, slot.OpCreateObject, errDevice)
		if _, err := openSession(t, f.g).CreateObject(testContext(t), cert("cert")); err != nil {
			t.Fatalf("CreateObject with the primary failing: %v", err)
		}
		check(t, f, primary, "cert", 1)
	})
	t.Run("generation, device error", func(t *testing.T) {
		faults := slottest.NewFaults()
		f := setup(t, setupOpts{interceptor: faults, threshold: 1, policy: config.PolicyPrimaryBackup})
		primary := f.g.Primary()
		faults.Fail(primary, slot.OpGenerateKeyPair, errDevice)
		genEC(t, openSession(t, f.g), "pair")
		check(t, f, primary, "pair", 2)
	})
	t.Run("hung at command_timeout", func(t *testing.T) {
		const timeout = 1500 * time.Millisecond
		faults := slottest.NewFaults()
		f := setup(t, setupOpts{interceptor: faults, timeout: timeout, policy: config.PolicyPrimaryBackup})
		primary := f.g.Primary()
		// The creation's first call on the primary (the look for objects
		// of the name it will make) hangs.
		faults.Hang(primary, slot.OpFindObjects)
		t.Cleanup(func() { faults.Heal(primary) })
		start := time.Now()
		if _, err := openSession(t, f.g).CreateObject(testContext(t), cert("cert")); err != nil {
			t.Fatalf("CreateObject with the primary hung: %v", err)
		}
		if d := time.Since(start); d < timeout {
			t.Errorf("CreateObject took %v, less than command_timeout %v: the hang was not exercised", d, timeout)
		}
		faults.Heal(primary)
		check(t, f, primary, "cert", 1)
	})
	t.Run("generation hung: not made again elsewhere", func(t *testing.T) {
		// The hung generation may still finish on the primary: a second
		// key made elsewhere under the same identity would be a
		// different key. The application gets CKR_DEVICE_ERROR.
		const timeout = 1500 * time.Millisecond
		faults := slottest.NewFaults()
		f := setup(t, setupOpts{interceptor: faults, timeout: timeout, keygen: timeout, policy: config.PolicyPrimaryBackup})
		primary := f.g.Primary()
		faults.Hang(primary, slot.OpGenerateKeyPair)
		t.Cleanup(func() { faults.Heal(primary) })
		_, _, err := openSession(t, f.g).GenerateKeyPair(testContext(t), pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
			[]*pkcs11.Attribute{attr(pkcs11.CKA_EC_PARAMS, p256), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_LABEL, "hung-pair")},
			[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_LABEL, "hung-pair")})
		if CodeOf(err) != pkcs11.CKR_DEVICE_ERROR {
			t.Fatalf("GenerateKeyPair with the primary hung: %v (0x%x), want CKR_DEVICE_ERROR", err, CodeOf(err))
		}
		if st := memberState(f.g, primary); st != member.Failed {
			t.Errorf("the hung primary %s is %v, want failed", primary, st)
		}
		for _, tok := range f.toks[1:] {
			if n := len(findDirect(t, openDirect(t, tok), "hung-pair")); n != 0 {
				t.Errorf("member %s holds %d objects of the hung generation, want 0", tok.Name, n)
			}
		}
	})
	t.Run("served member killed", func(t *testing.T) {
		f, srv := servedGroup(t, 3, setupOpts{policy: config.PolicyPrimaryBackup})
		primary := srv.Token().Name
		if f.g.Primary() != primary {
			t.Fatalf("primary is %s, want the served member %s", f.g.Primary(), primary)
		}
		s := openSession(t, f.g)
		srv.Kill()
		if _, err := s.CreateObject(testContext(t), cert("cert")); err != nil {
			t.Fatalf("CreateObject with the primary's server killed: %v (0x%x)", err, CodeOf(err))
		}
		if st := memberState(f.g, primary); st != member.Failed {
			t.Errorf("the killed primary %s is %v, want failed", primary, st)
		}
		for _, tok := range f.toks[1:] {
			if n := len(findDirect(t, openDirect(t, tok), "cert")); n != 1 {
				t.Errorf("member %s holds %d certificates, want 1", tok.Name, n)
			}
		}
	})
	t.Run("generation, served primary killed: made on the next", func(t *testing.T) {
		// The primary's server is gone before the request is written
		// (issue 16 item 6): the generation cannot have happened there
		// and is made on the next member, with two members up. Session
		// keys, as the conformance harness makes: the generation runs on
		// the session's physical session on the primary, opened before
		// the kill.
		srv := testhsm.ServeRemote(t, "remote")
		f := setup(t, setupOpts{policy: config.PolicyPrimaryBackup, toks: append([]testhsm.Token{srv.Token()}, takeTokens(t, 2)...)})
		primary := srv.Token().Name
		if f.g.Primary() != primary {
			t.Fatalf("primary is %s, want the served member %s", f.g.Primary(), primary)
		}
		s := openSession(t, f.g)
		gen := pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil)
		sessionKey := []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
			attr(pkcs11.CKA_VALUE_LEN, 32), attr(pkcs11.CKA_TOKEN, false), attr(pkcs11.CKA_ENCRYPT, true)}
		if _, err := s.GenerateKey(testContext(t), gen, sessionKey); err != nil {
			t.Fatalf("GenerateKey: %v", err)
		}
		srv.Kill()
		h, err := s.GenerateKey(testContext(t), gen, sessionKey)
		if err != nil {
			t.Fatalf("GenerateKey with the primary's server killed: %v (0x%x)", err, CodeOf(err))
		}
		if st := memberState(f.g, primary); st != member.Failed {
			t.Errorf("the killed primary %s is %v, want failed", primary, st)
		}
		if _, err := f.g.Encrypt(testContext(t), pkcs11.NewMechanism(pkcs11.CKM_AES_ECB, nil), h, make([]byte, 16)); err != nil {
			t.Errorf("encrypt with the key made after the kill: %v", err)
		}
	})
}

// Issue 16 item 8: SoftHSM keeps the key of a C_UnwrapKey it refuses with
// CKR_ATTRIBUTE_READ_ONLY (an EC private session key whose template sets
// CKA_LOCAL). On a bare token the application finds and removes it;
// through the group nothing the failed call made stays on any member.
func TestFailedUnwrapLeavesNothingOnAnyMember(t *testing.T) {
	ctx := testContext(t)
	wrapMech := pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP_PAD, nil)
	unwrapTemplate := func(label string) []*pkcs11.Attribute {
		t := []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY), attr(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_EC),
			attr(pkcs11.CKA_TOKEN, false), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SIGN, true), attr(pkcs11.CKA_LOCAL, true)}
		if label != "" {
			t = append(t, attr(pkcs11.CKA_LABEL, label))
		}
		return t
	}
	// leftovers lists the EC private session keys s sees.
	leftovers := func(s *slot.Slot) []pkcs11.ObjectHandle {
		hs, err := s.FindObjects(ctx, []*pkcs11.Attribute{attr(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY), attr(pkcs11.CKA_TOKEN, false)})
		if err != nil {
			t.Fatal(err)
		}
		return hs
	}

	// The bare token: the refused unwrap leaves its key.
	bare := openDirect(t, testhsm.Take(t, 1)[0])
	kek, err := bare.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), aesTemplate("bare-kek"))
	if err != nil {
		t.Fatal(err)
	}
	_, priv, err := bare.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{attr(pkcs11.CKA_EC_PARAMS, p256), attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_LABEL, "bare-ec")},
		[]*pkcs11.Attribute{attr(pkcs11.CKA_TOKEN, true), attr(pkcs11.CKA_PRIVATE, true), attr(pkcs11.CKA_SIGN, true),
			attr(pkcs11.CKA_EXTRACTABLE, true), attr(pkcs11.CKA_LABEL, "bare-ec")})
	if err != nil {
		t.Fatal(err)
	}
	blob, err := bare.WrapKey(ctx, wrapMech, kek, priv)
	if err != nil {
		t.Fatal(err)
	}
	_, bareErr := bare.UnwrapKey(ctx, wrapMech, kek, blob, unwrapTemplate("bare-orphan"))
	if slot.CodeOf(bareErr) != pkcs11.CKR_ATTRIBUTE_READ_ONLY || len(leftovers(bare)) != 1 {
		t.Fatalf("bare token: unwrap %v, %d session keys left; want CKR_ATTRIBUTE_READ_ONLY and its orphan: this SoftHSM does not show the fault",
			bareErr, len(leftovers(bare)))
	}

	f := setup(t, setupOpts{})
	s := openSession(t, f.g)
	gkek, err := s.GenerateKey(ctx, pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), aesTemplate("kek"))
	if err != nil {
		t.Fatal(err)
	}
	_, gpriv := genEC(t, s, "ec", attr(pkcs11.CKA_EXTRACTABLE, true))
	gblob, err := f.g.WrapKey(ctx, wrapMech, gkek, gpriv)
	if err != nil {
		t.Fatal(err)
	}
	for _, label := range []string{"orphan", ""} { // named by the application, and by the group
		_, err := s.UnwrapKey(ctx, wrapMech, gkek, gblob, unwrapTemplate(label))
		if CodeOf(err) != pkcs11.CKR_ATTRIBUTE_READ_ONLY {
			t.Errorf("UnwrapKey through the group (label %q): %v (0x%x), want the bare token's CKR_ATTRIBUTE_READ_ONLY", label, err, CodeOf(err))
		}
	}
	for _, tok := range f.toks {
		if n := len(leftovers(openDirect(t, tok))); n != 0 {
			t.Errorf("member %s keeps %d keys of the failed unwraps", tok.Name, n)
		}
	}
	wantServing(t, f, "after a refused unwrap")
}

// TestUnservedIsTheTokensAnswer: when no member served a request, the
// members that answered it the same ambiguous way (CKR_GENERAL_ERROR) give
// the application the token's answer even though another member was down
// (a clear health error): the request is at fault wherever a token
// answered, as on a bare token. Only when no token answered is it
// CKR_DEVICE_ERROR.
func TestUnservedIsTheTokensAnswer(t *testing.T) {
	var v member.Verdict
	v.Health(nil, pkcs11.Error(pkcs11.CKR_DEVICE_ERROR), false)
	v.Health(nil, pkcs11.Error(pkcs11.CKR_GENERAL_ERROR), false)
	if code := CodeOf(unserved(&v, "Sign")); code != pkcs11.CKR_GENERAL_ERROR {
		t.Errorf("one member down, one answering CKR_GENERAL_ERROR: 0x%x, want the token's CKR_GENERAL_ERROR", code)
	}
	var down member.Verdict
	down.Health(nil, pkcs11.Error(pkcs11.CKR_DEVICE_ERROR), false)
	if code := CodeOf(unserved(&down, "Sign")); code != pkcs11.CKR_DEVICE_ERROR {
		t.Errorf("every member down: 0x%x, want CKR_DEVICE_ERROR", code)
	}
}
