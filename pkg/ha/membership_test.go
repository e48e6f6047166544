package ha

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/group/signer"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
)

// signLoad signs with signer from workers goroutines until stop is
// closed, verifying every signature; it returns the number of signatures
// and the errors.
type signLoad struct {
	wg   sync.WaitGroup
	stop chan struct{}
	ops  atomic.Int64
	mu   sync.Mutex
	errs []error
}

func startSigning(signer *signer.Signer, workers int) *signLoad {
	l := &signLoad{stop: make(chan struct{})}
	pub := signer.Public().(*ecdsa.PublicKey)
	for w := range workers {
		l.wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				d := sha256.Sum256(fmt.Appendf(nil, "worker %d message %d", w, i))
				sig, err := signer.Sign(nil, d[:], crypto.SHA256)
				if err == nil && !ecdsa.VerifyASN1(pub, d[:], sig) {
					err = fmt.Errorf("signature %d of worker %d does not verify", i, w)
				}
				if err != nil {
					l.mu.Lock()
					l.errs = append(l.errs, err)
					l.mu.Unlock()
					continue
				}
				l.ops.Add(1)
			}
		})
	}
	return l
}

func (l *signLoad) finish(t testing.TB) int64 {
	t.Helper()
	close(l.stop)
	l.wg.Wait()
	for i, err := range l.errs {
		if i == 5 {
			t.Errorf("… %d failed signatures in all", len(l.errs))
			break
		}
		t.Errorf("signature failed: %v", err)
	}
	return l.ops.Load()
}

// A member added to a group holding 500 objects takes work only once it
// holds all 500 (and the group's key), while the other members go on
// signing without a single failure.
//
// 500 objects in the default run; 100 with -short or -race: SoftHSM
// visits every object of a token on each search, so a catch-up costs
// O(n²) there, and under the race detector on the shared 2-core machine
// 500 take minutes. The assertion is the same at either size.
func TestAddMemberCatchesUpBeforeWork(t *testing.T) {
	n := 500
	if testing.Short() || raceDetector {
		n = 100
	}
	toks := testhsm.Take(t, 3)
	faults := slottest.NewFaults()
	// The newcomer needs the group's domain key before it joins, as an
	// operator's `hactl hagroup domain` gives it.
	r := newRig(t, rigOpts{toks: toks[:2], faults: faults, extraDomain: toks[2:]})
	// SoftHSM's searches grow with the token: on a loaded machine 500
	// copies take minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := r.session()
	genEC(t, s, "signing")
	// The other objects are put on both members directly, as an operator
	// would have before forming the group: SoftHSM 2.6 fails concurrent
	// creates on one token (CKR_GENERAL_ERROR), so one goroutine per
	// token.
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, tok := range toks[:2] {
		d := direct(t, tok)
		wg.Go(func() {
			for j := range n - 2 { // the key pair is two of the n objects
				if _, err := d.CreateObject(ctx, dataTemplate(fmt.Sprintf("obj-%04d", j))); err != nil {
					errs[i] = fmt.Errorf("%s: %w", tok.Name, err)
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("making the objects: %v", err)
		}
	}
	t.Logf("%d objects made on each of 2 tokens in %v", n-2, time.Since(start))
	want := inventory(t, direct(t, toks[0]))
	if len(want) != n {
		t.Fatalf("the group holds %d objects, want %d", len(want), n)
	}

	signer, err := signer.New(ctx, r.g.Engine(), signer.KeySelector{Label: "signing"})
	if err != nil {
		t.Fatal(err)
	}
	newcomer := toks[2].Name
	// At the moment the newcomer enters rotation, it has signed nothing.
	var signsAtActivation atomic.Int64
	signsAtActivation.Store(-1)
	r.ev.onEvent = func(e group.Event) {
		if e.Kind == group.MemberRecovered && e.Member == newcomer {
			signsAtActivation.Store(int64(faults.Calls(newcomer, slot.OpSign)))
		}
	}
	load := startSigning(signer, 2)
	start = time.Now()
	res, err := r.g.AddMember(ctx, memberOf(toks[2]))
	took := time.Since(start)
	if err != nil {
		load.finish(t)
		t.Fatalf("AddMember: %v", err)
	}
	t.Logf("AddMember caught up %d objects (copied %d, %d passes, final under the barrier: %v) in %v",
		n, res.CatchUp.Copied, res.CatchUp.Passes, res.CatchUp.Final, took)
	// Then it takes its share.
	if err := faults.WaitCalls(ctx, newcomer, slot.OpSign, 1); err != nil {
		t.Errorf("the newcomer took no signature after it joined: %v", err)
	}
	ops := load.finish(t)
	t.Logf("%d signatures during the addition, none failed", ops)

	if got := signsAtActivation.Load(); got != 0 {
		t.Errorf("the newcomer had made %d signatures when it entered rotation (want 0; -1: it never did)", got)
	}
	if res.CatchUp.Copied != n {
		t.Errorf("catch-up copied %d objects, want %d", res.CatchUp.Copied, n)
	}
	if got := inventory(t, direct(t, toks[2])); diff(want, got) != "[]" {
		t.Errorf("the newcomer's objects differ from the group's: %s", diff(want, got))
	}
	if st := r.state(newcomer); st != member.Active {
		t.Errorf("newcomer is %v, want active", st)
	}
	for _, e := range r.ev.groupEvents(group.MemberAdded, newcomer) {
		if e.To != member.Recovering {
			t.Errorf("MemberAdded event says %v, want recovering (caught up before it serves)", e.To)
		}
	}
	if n := len(r.ev.groupEvents(group.MemberAdded, newcomer)); n != 1 {
		t.Errorf("%d MemberAdded events, want 1", n)
	}
}
