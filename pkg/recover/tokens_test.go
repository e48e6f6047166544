package recover

import (
	"bufio"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/group/signer"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/secret"
	hasync "github.com/hagroup/hagroup/pkg/sync"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/hagroup/hagroup/pkg/sync/tombstone"
	"github.com/miekg/pkcs11"
)

// The "done means", on real SoftHSM tokens and real p11-kit
// servers.

// A member killed (SIGKILL of its hsmserve process) under a 16-goroutine
// signing load, with interval = 1s, and restarted as soon as one recovery
// attempt has failed against it, is back in rotation by the second attempt
// after its restart, serves a share of the load, and no operation fails
// throughout. The signing key is generated through the group, so the
// member holds it by replication under the domain key.
func TestKilledMemberRejoinsUnderLoad(t *testing.T) {
	r := newRig(t, rigOpts{remote: []int{1}, interval: time.Second, retries: -1})
	victim := r.name(1)
	r.genEC(r.session(), "load")
	if n := len(labels(inventory(t, r.direct(r.toks[1], "-check")))); n != 2 {
		t.Fatalf("the remote member holds %d objects after key generation, want the replicated pair", n)
	}
	signer, err := signer.New(rigCtx(t), r.g, signer.KeySelector{Label: "load"})
	if err != nil {
		t.Fatal(err)
	}
	pub := signer.Public().(*ecdsa.PublicKey)

	var ops, fails atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				digest := sha256.Sum256([]byte(strconv.Itoa(i)))
				sig, err := signer.SignContext(rigCtx(t), digest[:], crypto.SHA256)
				if err == nil && !ecdsa.VerifyASN1(pub, digest[:], sig) {
					err = errors.New("signature does not verify")
				}
				if err != nil {
					fails.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				ops.Add(1)
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	waitOps := func(counter func() int64, n int64, what string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		start := counter()
		for counter()-start < n {
			if time.Now().After(deadline) {
				t.Fatalf("%s: fewer than %d operations within 30s", what, n)
			}
			time.Sleep(time.Millisecond) // the load runs meanwhile; bounded by the deadline
		}
	}
	waitOps(ops.Load, 500, "before the kill")

	r.servers[victim].Kill()
	r.waitState(victim, member.Failed)
	killedAt := time.Now()
	// The outage lasts until an attempt has failed against the dead
	// member: recovery was tried and kept it out.
	if e := r.rev.next(t, AttemptFailed); e.Member != victim {
		t.Fatalf("attempt failed on %s, want %s", e.Member, victim)
	}
	r.servers[victim].Restart(t)
	restarted := time.Now()
	startedBefore := r.rev.count(AttemptStarted)

	rec := r.rev.next(t, Recovered)
	backAt := time.Now()
	after := r.rev.count(AttemptStarted) - startedBefore
	if rec.Member != victim || after > 2 {
		t.Fatalf("recovered %s after %d attempts since the restart, want %s within 2", rec.Member, after, victim)
	}
	// Within 2 intervals of the restart, plus the catching-up attempt
	// itself (the loop's ticks are interval apart; an attempt takes time).
	if back, limit := backAt.Sub(restarted), 2*time.Second+rec.Duration; back > limit {
		t.Errorf("back in rotation %v after the restart, more than 2 intervals + the attempt's own %v", back, rec.Duration)
	}
	if r.state(victim) != member.Active {
		t.Fatalf("victim is %v after recovery", r.state(victim))
	}
	// It takes a share of the load again.
	victimOps := func() int64 {
		for _, m := range r.g.Members() {
			if m.Name == victim {
				return int64(m.Ops)
			}
		}
		return 0
	}
	waitOps(victimOps, 100, "victim after recovery")
	waitOps(ops.Load, 500, "after recovery")
	if n := fails.Load(); n != 0 {
		t.Fatalf("%d of %d operations failed; first: %v", n, n+ops.Load(), firstErr.Load())
	}
	r.rev.mu.Lock()
	for _, e := range r.rev.all {
		t.Logf("%+.3fs %s attempt %d %v dur %v", e.Time.Sub(restarted).Seconds(), e.Kind, e.Attempt, e.Err, e.Duration)
	}
	r.rev.mu.Unlock()
	t.Logf("down %.1fs; back in rotation %.2fs after the restart (interval 1s); %d signatures, none failed",
		restarted.Sub(killedAt).Seconds(), backAt.Sub(restarted).Seconds(), ops.Load())
}

// While a member is down, 20 keys are generated and 5 pre-existing keys
// destroyed through the group. After recovery the member holds exactly the
// 20 new keys, with the fingerprints the others have, and none of the 5 —
// also when the process itself was restarted between the destroy and the
// recovery (the tombstones are on disk).
func TestRecoveryAppliesWhatHappenedMeanwhile(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("process-restarted=%v", restart), func(t *testing.T) {
			r := newRig(t, rigOpts{remote: []int{1}, retries: 0})
			victim := r.name(1)
			s := r.session()
			var pre []group.ObjectHandle
			for i := range 5 {
				pub, priv := r.genEC(s, fmt.Sprintf("pre-%d", i))
				pre = append(pre, pub, priv)
			}
			if n := len(labels(inventory(t, r.direct(r.toks[1], "-before")))); n != 10 {
				t.Fatalf("the remote member holds %d objects before the outage, want the 5 replicated pairs", n)
			}
			r.servers[victim].Kill() // the member dies
			for i := range 20 {
				r.genEC(s, fmt.Sprintf("new-%d", i))
			}
			if st := r.state(victim); st != member.Failed {
				t.Fatalf("victim is %v after replication to it failed", st)
			}
			for _, h := range pre {
				if err := r.g.DestroyObject(rigCtx(t), h); err != nil {
					t.Fatalf("destroy: %v", err)
				}
			}
			if restart {
				r.close()
				r.open() // the victim is still down: it starts failed
				if st := r.state(victim); st != member.Failed {
					t.Fatalf("victim is %v in the new process", st)
				}
			}
			r.servers[victim].Restart(t) // and comes back
			res, err := r.rec.Recover(rigCtx(t), victim)
			if err != nil {
				t.Fatalf("recover: %v", err)
			}
			if res.CatchUp.Copied != 40 || res.CatchUp.Deleted != 10 {
				t.Fatalf("catch-up copied %d and deleted %d, want 40 and 10", res.CatchUp.Copied, res.CatchUp.Deleted)
			}
			if st := r.state(victim); st != member.Active {
				t.Fatalf("victim is %v", st)
			}
			onVictim := inventory(t, r.direct(r.toks[1], "-check"))
			onFirst := inventory(t, r.direct(r.toks[0], "-check"))
			if dump(onVictim) != dump(onFirst) {
				t.Fatalf("victim differs from %s:\nvictim:\n  %s\n%s:\n  %s", r.name(0), dump(onVictim), r.name(0), dump(onFirst))
			}
			var want []string
			for i := range 20 {
				want = append(want, fmt.Sprintf("new-%d", i), fmt.Sprintf("new-%d", i))
			}
			sort.Strings(want)
			if got := labels(onVictim); strings.Join(got, ",") != strings.Join(want, ",") {
				t.Fatalf("victim holds %v, want exactly the 20 new pairs", got)
			}
		})
	}
}

// An attempt against a member that is still down (its hsmserve killed)
// uses exactly one attempt (one re-open of its token); retries = 3 gives up after 3; a manual
// Recover then succeeds once the member is back.
func TestGiveUpThenManualRecovery(t *testing.T) {
	clk := newFakeClock()
	r := newRig(t, rigOpts{remote: []int{2}, retries: 3, clock: clk, importEC: "k"})
	victim := r.name(2)
	r.servers[victim].Kill()
	if err := r.g.FailMember(victim, errors.New("health probe: no answer")); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		clk.waitArmed(t)
		r.rev.drain()
		clk.Advance(time.Second)
		e := r.rev.next(t, AttemptFailed)
		if e.Attempt != i || e.AttemptsLeft != 3-i {
			t.Fatalf("attempt %d: %+v", i, e)
		}
		// One attempt re-opened the token once: one recovering transition.
		if n := r.gev.count(group.MemberRecovering, victim); n != i {
			t.Fatalf("after attempt %d the member went recovering %d times", i, n)
		}
		if st := r.rec.Status(victim); st.Attempts != i || st.AttemptsLeft != 3-i {
			t.Fatalf("status after attempt %d: %+v", i, st)
		}
	}
	r.rev.next(t, GaveUp)
	clk.Advance(time.Hour)
	if n := r.gev.count(group.MemberRecovering, victim); n != 3 {
		t.Fatalf("%d attempts after giving up, want 3", n)
	}
	if st := r.state(victim); st != member.Failed {
		t.Fatalf("victim %v after giving up", st)
	}
	r.servers[victim].Restart(t)
	if _, err := r.rec.Recover(rigCtx(t), victim); err != nil {
		t.Fatalf("manual recovery: %v", err)
	}
	if st := r.state(victim); st != member.Active {
		t.Fatalf("victim %v after manual recovery", st)
	}
	if st := r.rec.Status(victim); st.GaveUp || st.LastError != nil {
		t.Fatalf("status %+v", st)
	}
}

// The same identity with a different key on the recovering member keeps it
// out of rotation, reported with both fingerprints.
func TestConflictKeepsMemberOutOfRotation(t *testing.T) {
	r := newRig(t, rigOpts{served: []int{1}, retries: 0, importEC: "dup"})
	victim := r.name(1)
	r.servers[victim].Kill()
	r.g.FailMember(victim, errors.New("test: down"))
	r.servers[victim].Restart(t)

	// Someone makes a different key under the same label and ID directly
	// on the victim's token while it is out of the group.
	d := r.direct(r.toks[1], "-rogue")
	objs, err := hasync.List(rigCtx(t), d)
	if err != nil {
		t.Fatal(err)
	}
	var id []byte
	var oldFP []byte
	for _, o := range objs {
		if o.Label == "dup" && o.Class == pkcs11.CKO_PUBLIC_KEY {
			id, oldFP = o.ID, o.Fingerprint
		}
	}
	_, _, err = d.GenerateKeyPair(rigCtx(t), pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{rigA(pkcs11.CKA_EC_PARAMS, rigP256), rigA(pkcs11.CKA_TOKEN, true), rigA(pkcs11.CKA_LABEL, "dup"), rigA(pkcs11.CKA_ID, id)},
		[]*pkcs11.Attribute{rigA(pkcs11.CKA_TOKEN, true), rigA(pkcs11.CKA_PRIVATE, true), rigA(pkcs11.CKA_SIGN, true), rigA(pkcs11.CKA_LABEL, "dup"), rigA(pkcs11.CKA_ID, id)})
	if err != nil {
		t.Fatal(err)
	}
	var newFP []byte
	objs, _ = hasync.List(rigCtx(t), d)
	for _, o := range objs {
		if o.Label == "dup" && o.Class == pkcs11.CKO_PUBLIC_KEY && string(o.Fingerprint) != string(oldFP) {
			newFP = o.Fingerprint
		}
	}

	_, err = r.rec.Recover(rigCtx(t), victim)
	var ce *ConflictError
	if !errors.Is(err, object.ErrConflict) || !errors.As(err, &ce) {
		t.Fatalf("recover with a conflict: %v", err)
	}
	if st := r.state(victim); st != member.Failed {
		t.Fatalf("victim is %v with a conflict", st)
	}
	msg := err.Error()
	for _, fp := range [][]byte{oldFP, newFP} {
		if !strings.Contains(msg, object.FormatFingerprint(fp)) {
			t.Fatalf("conflict error lacks fingerprint %x: %s", fp, msg)
		}
	}
	// The public halves conflict (two known fingerprints). The private
	// halves do not: on the victim SoftHSM cannot tell which public half
	// each belongs to, so their fingerprints are unknown there, and an
	// unknown fingerprint is no conflict.
	ev := r.rev.next(t, ConflictFound)
	if len(ev.Conflicts) != 1 || ev.Member != victim || ev.Conflicts[0].Identity.Class != pkcs11.CKO_PUBLIC_KEY {
		t.Fatalf("conflict event: %+v", ev)
	}
	if st := r.rec.Status(victim); len(st.Conflicts) != 1 {
		t.Fatalf("status: %+v", st)
	}
	if rep, err := r.rec.Synchronize(rigCtx(t), SyncOptions{Check: true}); err != nil || rep.OutOfSync()[victim] < 1 {
		t.Fatalf("a check now: %v, out of sync %v; want %s counted", err, rep.OutOfSync(), victim)
	}
}

// Synchronize(Check) on a synced group reports nothing; after an object
// is created directly on one member it reports exactly that object; the
// apply makes all equal; a second one is a no-op.
func TestSynchronize(t *testing.T) {
	r := newRig(t, rigOpts{retries: 0})
	r.genEC(r.session(), "through-group")
	rep, err := r.rec.Synchronize(rigCtx(t), SyncOptions{Check: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.InSync() {
		t.Fatalf("synced group: %v %v", rep.Plan.Actions, rep.Plan.Conflicts)
	}
	d := r.direct(r.toks[2], "-side")
	if _, err := d.CreateObject(rigCtx(t), []*pkcs11.Attribute{
		rigA(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), rigA(pkcs11.CKA_TOKEN, true), rigA(pkcs11.CKA_LABEL, "side-door"), rigA(pkcs11.CKA_VALUE, []byte("x")),
	}); err != nil {
		t.Fatal(err)
	}
	rep, err = r.rec.Synchronize(rigCtx(t), SyncOptions{Check: true})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range rep.Plan.Actions {
		got = append(got, a.String())
	}
	if len(got) != 2 || !strings.Contains(got[0], `label="side-door"`) || !strings.Contains(got[1], `label="side-door"`) || len(rep.Plan.Conflicts) != 0 {
		t.Fatalf("check after a side-door object: %v", got)
	}
	if n := rep.OutOfSync()[r.name(0)]; n != 1 {
		t.Fatalf("check: %s out of sync by %d, want 1", r.name(0), n)
	}
	if rep.Applied != nil {
		t.Fatal("check applied something")
	}
	rep, err = r.rec.Synchronize(rigCtx(t), SyncOptions{})
	if err != nil || rep.Applied == nil || len(rep.Applied.Done) != 2 {
		t.Fatalf("apply: %v %+v", err, rep.Applied)
	}
	first := inventory(t, r.direct(r.toks[0], "-c"))
	for _, tok := range r.toks[1:] {
		if inv := inventory(t, r.direct(tok, "-c")); dump(inv) != dump(first) {
			t.Fatalf("%s differs after apply:\n  %s", tok.Name, dump(inv))
		}
	}
	rep, err = r.rec.Synchronize(rigCtx(t), SyncOptions{})
	if err != nil || !rep.InSync() || rep.Applied != nil {
		t.Fatalf("second apply: %v, in sync %v", err, rep.InSync())
	}
	if rep, err := r.rec.Synchronize(rigCtx(t), SyncOptions{Check: true}); err != nil || len(rep.OutOfSync()) != 0 {
		t.Fatalf("check after apply: %v, out of sync %v", err, rep.OutOfSync())
	}
}

// Two processes recover the same member at once: one runs, the other
// waits for it and then finds nothing left to do; no object is
// duplicated.
func TestTwoProcessesRecoverOneMember(t *testing.T) {
	r := newRig(t, rigOpts{remote: []int{1}, retries: 0})
	victim := r.name(1)
	s := r.session()
	r.genEC(s, "before")
	r.servers[victim].Kill()
	for i := range 10 {
		r.genEC(s, fmt.Sprintf("meanwhile-%d", i))
	}
	if st := r.state(victim); st != member.Failed {
		t.Fatalf("victim %v", st)
	}

	// The second process opens the group while the victim's server is
	// down, so the victim starts failed there too.
	cfg, err := json.Marshal(r.cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := rigCtx(t)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envHelper+"=recover", envGroup+"="+string(cfg), envState+"="+r.stateDir, envMember+"="+victim)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	expect := func(prefix string) string {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("helper process: no %q line (stderr: %s)", prefix, stderr.String())
		}
		l := lines.Text()
		if !strings.HasPrefix(l, prefix) {
			t.Fatalf("helper process said %q, want %q… (stderr: %s)", l, prefix, stderr.String())
		}
		return strings.TrimPrefix(l, prefix)
	}
	expect("READY")
	r.servers[victim].Restart(t)

	// Both at once.
	fmt.Fprintln(stdin, "GO")
	res, err := r.rec.Recover(ctx, victim)
	if err != nil {
		t.Fatalf("recovery in this process: %v", err)
	}
	other := expect("RESULT ")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper process: %v (stderr: %s)", err, stderr.String())
	}
	var otherCopied int
	var otherErr string
	fmt.Sscanf(other, "copied=%d", &otherCopied)
	if i := strings.Index(other, "err="); i >= 0 {
		otherErr = other[i+4:]
	}
	if otherErr != "" && !strings.Contains(otherErr, ErrInProgress.Error()) {
		t.Fatalf("other process: %s", otherErr)
	}
	// The 20 missing objects were copied once, by whichever ran first.
	if res.CatchUp.Copied+otherCopied != 20 || (res.CatchUp.Copied != 0 && otherCopied != 0) {
		t.Fatalf("copied %d here and %d in the other process, want 20 by one of them", res.CatchUp.Copied, otherCopied)
	}
	first := inventory(t, r.direct(r.toks[0], "-c"))
	for _, tok := range r.toks[1:] {
		inv := inventory(t, r.direct(tok, "-c"))
		for k, n := range inv {
			if n != 1 {
				t.Fatalf("%s holds %s %d times", tok.Name, k, n)
			}
		}
		if dump(inv) != dump(first) {
			t.Fatalf("%s differs:\n  %s", tok.Name, dump(inv))
		}
	}
	t.Logf("this process copied %d, the other %d (%s)", res.CatchUp.Copied, otherCopied, other)
}

const (
	envHelper = "HAREC_TEST_HELPER"
	envGroup  = "HAREC_TEST_GROUP"
	envState  = "HAREC_TEST_STATE"
	envMember = "HAREC_TEST_MEMBER"
)

// helperRecover is the second process of TestTwoProcessesRecoverOneMember:
// it opens the group from the same configuration and state directory
// (SOFTHSM2_CONF is inherited; the member's hsmserve, down while it
// opens, is restarted before GO), says READY, waits for GO, recovers the
// member and prints the result.
func helperRecover() int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var cfg config.Group
	if err := json.Unmarshal([]byte(os.Getenv(envGroup)), &cfg); err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	set := config.Defaults()
	set.CommandTimeout = 10 * time.Second
	name := os.Getenv(envMember)
	j, err := tombstone.Open(os.Getenv(envState), cfg.Serial, tombstone.Options{})
	if err != nil {
		return fail(err)
	}
	defer j.Close()
	g, err := group.Open(ctx, cfg, set, group.Options{Tombstones: j})
	if err != nil {
		return fail(err)
	}
	defer g.Close()
	if err := g.Login(ctx, pkcs11.CKU_USER, secret.PINFromString(testhsm.UserPIN)); err != nil {
		return fail(err)
	}
	rec, err := New(Options{Engine: g, StateDir: os.Getenv(envState), Interval: time.Second, Retries: 0, Tombstones: j})
	if err != nil {
		return fail(err)
	}
	defer rec.Close()
	if m, ok := g.Member(name); !ok || m.State() != member.Failed {
		return fail(fmt.Errorf("member %s is not failed in the second process", name))
	}
	fmt.Println("READY")
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() || in.Text() != "GO" {
		return fail(errors.New("no GO"))
	}
	res, err := rec.Recover(ctx, name)
	line := fmt.Sprintf("RESULT copied=%d deleted=%d", res.CatchUp.Copied, res.CatchUp.Deleted)
	if err != nil {
		line += " err=" + err.Error()
	}
	fmt.Println(line)
	return 0
}

// Benchmarks.

// BenchmarkCatchUpKeys: the catch-up of a member missing -catchup.keys
// AES keys (1,000 unless told; the fill of 10,000 is long) that the
// other member of a two-member group holds: the recovery attempt's plan
// (one listing per member) and apply (a wrap and an unwrap under the
// domain key per key, each copy checked), plus re-open and activation.
// Reported per key and as keys per second; with -catchup.calls the
// member calls of the catch-up are counted and timed, per member and op
// (docs/BENCHMARKS.md, "Catch-up at 10,000 keys").
//
//	go test -run '^$' -bench CatchUpKeys -benchtime 1x ./pkg/recover -catchup.keys 10000 [-catchup.calls]
func BenchmarkCatchUpKeys(b *testing.B) {
	benchKeys := *catchUpKeys
	o := rigOpts{n: 2, retries: 0}
	var calls *testhsm.CallClock
	if *catchUpCalls {
		// Not by default: an interceptor changes how calls reach the module.
		calls = &testhsm.CallClock{}
		o.interceptor = calls
	}
	r := newRig(b, o)
	victim := r.name(1)
	a := r.direct(r.toks[0], "-bench")
	for i := range benchKeys {
		_, err := a.GenerateKey(rigCtx(b), pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil), []*pkcs11.Attribute{
			rigA(pkcs11.CKA_VALUE_LEN, 32), rigA(pkcs11.CKA_TOKEN, true), rigA(pkcs11.CKA_PRIVATE, true),
			rigA(pkcs11.CKA_SENSITIVE, true), rigA(pkcs11.CKA_EXTRACTABLE, true), rigA(pkcs11.CKA_ENCRYPT, true),
			rigA(pkcs11.CKA_LABEL, fmt.Sprintf("bulk-%05d", i)), rigA(pkcs11.CKA_ID, []byte(fmt.Sprintf("%05d", i))),
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	v := r.direct(r.toks[1], "-wipe")
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		objs, err := hasync.List(rigCtx(b), v)
		if err != nil {
			b.Fatal(err)
		}
		for _, o := range objs {
			if strings.HasPrefix(o.Label, "bulk-") {
				if err := v.DestroyObject(rigCtx(b), o.Handle); err != nil {
					b.Fatal(err)
				}
			}
		}
		r.g.FailMember(victim, errors.New("bench"))
		if calls != nil {
			calls.Reset()
		}
		b.StartTimer()
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		res, err := r.rec.Recover(ctx, victim)
		cancel()
		if calls != nil {
			b.StopTimer()
			b.Logf("member calls of the catch-up (calls and ms per key): %s", calls.Report(benchKeys))
			b.StartTimer()
		}
		if err != nil {
			b.Fatal(err)
		}
		if res.CatchUp.Copied != benchKeys {
			b.Fatalf("copied %d", res.CatchUp.Copied)
		}
	}
	perKey := b.Elapsed().Seconds() / float64(b.N) / float64(benchKeys)
	b.ReportMetric(perKey*1e6, "µs/key")
	b.ReportMetric(1/perKey, "keys/s")
}

// catchUpKeys is how many keys BenchmarkCatchUpKeys's member misses.
var catchUpKeys = flag.Int("catchup.keys", 1000, "keys the member misses in BenchmarkCatchUpKeys")

// catchUpCalls has BenchmarkCatchUpKeys count and time the member calls.
var catchUpCalls = flag.Bool("catchup.calls", false, "BenchmarkCatchUpKeys logs the member calls of the catch-up, counted and timed")

// BenchmarkRestartToFirstServedOp: from the restart of a killed p11-kit
// member to the first operation it serves, when the recovery is started at
// the restart (a manual Recover, or an automatic attempt that falls due
// then): re-initialising its own module context, re-open, login,
// catch-up plan, activation, first signature scheduled on it.
func BenchmarkRestartToFirstServedOp(b *testing.B) {
	r := newRig(b, rigOpts{served: []int{0}, retries: 0, policy: config.PolicyPrimaryBackup, importEC: "bench"})
	victim := r.name(0)
	signer, err := signer.New(rigCtx(b), r.g, signer.KeySelector{Label: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	digest := sha256.Sum256([]byte("x"))
	ops := func() uint64 {
		m, _ := r.g.Member(victim)
		return m.Snapshot().Ops
	}
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		r.servers[victim].Kill()
		r.g.FailMember(victim, errors.New("bench"))
		r.servers[victim].Restart(b)
		before := ops()
		b.StartTimer()
		if _, err := r.rec.Recover(rigCtx(b), victim); err != nil {
			b.Fatal(err)
		}
		for ops() == before {
			if _, err := signer.Sign(rand.Reader, digest[:], crypto.SHA256); err != nil {
				b.Fatal(err)
			}
		}
	}
}
