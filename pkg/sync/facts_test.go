package sync

import (
	"path/filepath"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/hagroup/hagroup/pkg/tokenfacts"
	"github.com/miekg/pkcs11"
)

// trialCalls counts the calls a wrap probe makes on token name.
func trialCalls(log *testhsm.CallClock, name string) int {
	return log.Count(name, slot.OpGenerateKey) + log.Count(name, slot.OpGenerateKeyPair) +
		log.Count(name, slot.OpWrapKey) + log.Count(name, slot.OpUnwrapKey)
}

// TestProbeWrapKnownAsksOnce: a process probing a token that another
// process on the host probed (the same Facts directory) makes no trial
// key and gets the same answer, refusals and their CKR codes included;
// another token, or the same token offering other mechanisms, is probed.
func TestProbeWrapKnownAsksOnce(t *testing.T) {
	ctx := testContext(t)
	toks := testhsm.Take(t, 2)
	facts := tokenfacts.Open(filepath.Join(t.TempDir(), "state", testSerial), 0)
	log := &testhsm.CallClock{}
	probe := func(what string, tok testhsm.Token, mechs []uint, wantTrials bool) WrapCapability {
		t.Helper()
		s := openSlot(t, tok, log) // a fresh slot, as a new process opens
		if mechs == nil {
			var err error
			if mechs, err = s.Mechanisms(ctx); err != nil {
				t.Fatal(err)
			}
		}
		log.Reset()
		c, err := ProbeWrapKnown(ctx, s, mechs, facts)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if n := trialCalls(log, tok.Name); (n > 0) != wantTrials {
			t.Errorf("%s: %d trial calls, want trials %v\n%s", what, n, wantTrials, log)
		}
		return c
	}
	first := probe("first probe", toks[0], nil, true)
	ed := Kind{pkcs11.CKO_PRIVATE_KEY, slot.CKKECEdwards}
	if first.Holds(ed) == nil {
		t.Fatalf("SoftHSM 2.6 was probed to wrap EdDSA private keys: %+v", first)
	}
	again := probe("the same token again", toks[0], nil, false)
	if !again.Same(first) || len(again.Probed) != len(first.Probed) {
		t.Errorf("answer from the facts %+v, probed %+v", again, first)
	}
	if code := slot.CodeOf(again.Refused[ed]); code != slot.CodeOf(first.Refused[ed]) || code != pkcs11.CKR_KEY_NOT_WRAPPABLE {
		t.Errorf("the kept refusal's code is 0x%x, probed 0x%x", code, slot.CodeOf(first.Refused[ed]))
	}
	if again.Refused[ed].Error() != first.Refused[ed].Error() {
		t.Errorf("the kept refusal says %q, the probe said %q", again.Refused[ed], first.Refused[ed])
	}
	probe("another token", toks[1], nil, true)
	probe("other mechanisms", toks[0], []uint{pkcs11.CKM_AES_KEY_WRAP_PAD, pkcs11.CKM_AES_KEY_GEN}, true)
	// A probe that tried no kind (no generation mechanism listed) is not
	// kept: the next one tries again.
	onlyWrap := []uint{pkcs11.CKM_AES_KEY_WRAP_PAD}
	if c := probe("nothing to try", toks[0], onlyWrap, true); len(c.Probed) != 0 {
		t.Fatalf("probed %v with no generation mechanism listed", c.Probed)
	}
	probe("nothing to try, again", toks[0], onlyWrap, true)
}

// TestTrialCopiesOncePerHost: a Replicator of another process (the same
// Facts) makes no trial copy of a domain key that one process saw the
// token refuse; without the facts it tries them.
func TestTrialCopiesOncePerHost(t *testing.T) {
	_, dst, log, _ := countedPair(t, true, 0)
	ctx := testContext(t)
	facts := tokenfacts.Open(filepath.Join(t.TempDir(), "state", testSerial), 0)
	for _, c := range []struct {
		what   string
		facts  Facts
		copies int
	}{
		{"the first process", facts, len(domainkey.CopyTrials)},
		{"the next process", facts, 0},
		{"a process without the facts", nil, len(domainkey.CopyTrials)},
	} {
		log.Reset()
		r := &Replicator{GroupSerial: testSerial, Facts: c.facts}
		if err := r.Audit(ctx, dst); err != nil {
			t.Fatalf("%s: audit: %v", c.what, err)
		}
		if n := log.Count(dst.Name(), slot.OpCopyObject); n != c.copies {
			t.Errorf("%s: %d trial copies, want %d", c.what, n, c.copies)
		}
	}
}
