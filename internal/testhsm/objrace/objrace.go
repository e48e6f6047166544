// Package objrace is the test load that brings out SoftHSM 2.6's file-store
// race between threads of one process: one goroutine makes token key pairs
// while two others search the token and read every object's class and
// label. Without a guard, a read that refreshes an object being written
// drops it half-made (CKR_ATTRIBUTE_VALUE_INVALID, for good) and the
// creation fails with CKR_GENERAL_ERROR. pkg/slot and hsmserve keep object
// writes and reads apart; their tests run this load through them.
package objrace

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// minMade and minReads are the least load that shows creations and reads
// overlapped.
const minMade, minReads = 5, 50

// p256 is the DER OID of NIST P-256 for CKA_EC_PARAMS.
var p256 = []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}

// Run runs the load on s (logged in as the user) for d and fails t when a
// creation failed, a read saw a half-made object, or an object is left
// unreadable; also when the calls cannot have overlapped.
func Run(t *testing.T, ctx context.Context, s *slot.Slot, d time.Duration) {
	t.Helper()
	var wg sync.WaitGroup
	var made, failedMakes, reads, badReads atomic.Int64
	// The load runs for d and, on a machine too loaded to reach the least
	// load that shows the calls overlapped, on until it does: a minute at
	// most, and ending 5 s before ctx does, for the last reads.
	until := time.Now().Add(d)
	limit := until.Add(time.Minute)
	if dl, ok := ctx.Deadline(); ok && dl.Add(-5*time.Second).Before(limit) {
		limit = dl.Add(-5 * time.Second)
	}
	enough := func() bool { return made.Load() >= minMade && reads.Load() >= minReads }
	running := func() bool {
		now := time.Now()
		return now.Before(until) || (!enough() && now.Before(limit))
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		m := pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil)
		for i := 0; running(); i++ {
			label := fmt.Sprintf("race-%d", i)
			_, _, err := s.GenerateKeyPair(ctx, m,
				[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true), pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, p256), pkcs11.NewAttribute(pkcs11.CKA_LABEL, label)},
				[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true), pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true), pkcs11.NewAttribute(pkcs11.CKA_SIGN, true), pkcs11.NewAttribute(pkcs11.CKA_LABEL, label)})
			if err != nil {
				failedMakes.Add(1) // SoftHSM's answer when the race hits the creation
				continue
			}
			made.Add(1)
		}
	}()
	readAll := func() {
		hs, err := s.FindObjects(ctx, nil)
		if err != nil {
			t.Errorf("FindObjects: %v", err)
			return
		}
		for _, h := range hs {
			_, err := s.GetAttributes(ctx, h, []uint{pkcs11.CKA_CLASS, pkcs11.CKA_LABEL})
			switch {
			case slot.CodeOf(err) == pkcs11.CKR_ATTRIBUTE_VALUE_INVALID:
				badReads.Add(1)
			case err != nil && slot.CodeOf(err) != pkcs11.CKR_OBJECT_HANDLE_INVALID:
				t.Errorf("GetAttributeValue: %v", err)
			}
			reads.Add(1)
		}
	}
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for running() {
				readAll()
			}
		}()
	}
	wg.Wait()
	if !enough() {
		t.Fatalf("only %d key pairs made and %d reads: the calls did not overlap", made.Load(), reads.Load())
	}
	if n := badReads.Load(); n != 0 {
		t.Errorf("%d of %d reads saw a half-made object (CKR_ATTRIBUTE_VALUE_INVALID) while %d key pairs were made", n, reads.Load(), made.Load())
	}
	if n := failedMakes.Load(); n != 0 {
		t.Errorf("%d key pair generations failed (%d made) while objects were read", n, made.Load())
	}
	badReads.Store(0)
	readAll()
	if n := badReads.Load(); n != 0 {
		t.Errorf("%d objects left unreadable after the run", n)
	}
}
