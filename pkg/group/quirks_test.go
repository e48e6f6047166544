package group

import (
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/member"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/slottest"
	"github.com/miekg/pkcs11"
)

// The probe's doubt is SoftHSM's (it answers C_GetTokenInfo with
// CKR_GENERAL_ERROR while another process logs in): there one such
// answer fails nobody and a second does; from another make (NSS softokn)
// the first fails the member, as any device error would.
func TestProbeDoubtIsSoftHSMs(t *testing.T) {
	soft := testhsm.Take(t, 1)[0]
	nss := testhsm.NSS(t, "nss-probe")
	faults := slottest.NewFaults()
	f := setup(t, setupOpts{toks: []testhsm.Token{soft, nss}, noDomain: true, policy: config.PolicyRoundRobin, interceptor: faults})
	ctx := testContext(t)
	general := pkcs11.Error(pkcs11.CKR_GENERAL_ERROR)
	for _, name := range []string{soft.Name, nss.Name} {
		faults.FailN(name, slot.OpTokenInfo, general, 1)
		if _, err := f.g.Probe(ctx, name); CodeOf(err) != pkcs11.CKR_GENERAL_ERROR {
			t.Fatalf("probe of %s: %v, want CKR_GENERAL_ERROR", name, err)
		}
	}
	if st := memberState(f.g, soft.Name); st != member.Active {
		t.Errorf("SoftHSM member after one ambiguous probe: %v, want active (doubted)", st)
	}
	if st := memberState(f.g, nss.Name); st != member.Failed {
		t.Errorf("NSS member after one ambiguous probe: %v, want failed", st)
	}
	faults.FailN(soft.Name, slot.OpTokenInfo, general, 1)
	f.g.Probe(ctx, soft.Name)
	if st := memberState(f.g, soft.Name); st != member.Failed {
		t.Errorf("SoftHSM member after a second ambiguous probe: %v, want failed", st)
	}
}
