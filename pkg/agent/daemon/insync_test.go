package daemon

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/agent"
	"github.com/hagroup/hagroup/pkg/replica"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// Issue 15: listgroups' NEEDS SYNC, synchronize --check and the
// hagroup_objects_out_of_sync metric say the same, in both directions (a
// member behind, a member ahead, a member holding an object twice), the
// moment the members change behind the agent's back (its periodic check
// is an hour away), and all three say "in sync" once it is synchronised.
func TestStatusCheckAndMetricAgree(t *testing.T) {
	toks := testhsm.Take(t, 2)
	pin := pinFile(t)
	ta := startAgent(t, `[agent]
socket = "$SOCK"
state_dir = "$STATE"
metrics = "127.0.0.1:0"

[ha]
probe_interval = "1h"
interval = "1h"
retries = 0

[[group]]
label = "g"
serial = "1000015"
`+memberTOML("a", toks[0], pin, false)+memberTOML("b", toks[1], pin, false))
	direct := make([]*slot.Slot, 2)
	for i, tok := range toks {
		s, err := slot.Open(t.Context(), slot.Spec{Name: fmt.Sprint("direct-", i), Module: tok.Module, ModuleEnv: tok.ModuleEnv,
			TokenLabel: tok.Label, PIN: secret.PINFromString(tok.UserPIN), CommandTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		direct[i] = s
	}
	data := func(s *slot.Slot, label string) pkcs11.ObjectHandle {
		h, err := s.CreateObject(t.Context(), []*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_DATA), pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
			pkcs11.NewAttribute(pkcs11.CKA_LABEL, label), pkcs11.NewAttribute(pkcs11.CKA_VALUE, []byte(label))})
		if err != nil {
			t.Fatalf("create %s on %s: %v", label, s.Name(), err)
		}
		return h
	}
	agree := func(step string, want []string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), deadline)
		defer cancel()
		rep, err := ta.client.ListGroups(ctx, "g")
		if err != nil {
			t.Fatal(err)
		}
		var listed []string
		for _, m := range rep.Groups[0].Members {
			if m.NeedsSync {
				listed = append(listed, m.Name)
			}
		}
		check, err := ta.client.Synchronize(ctx, agent.SyncRequest{Group: "g", Check: true})
		if err != nil {
			t.Fatal(err)
		}
		var checked []string
		for m := range check.OutOfSync() {
			checked = append(checked, m)
		}
		slices.Sort(checked)
		body := scrape(t, ta.d.MetricsAddr())
		var metric []string
		for _, m := range []string{"a", "b"} {
			if v, ok := metricValue(body, "hagroup_objects_out_of_sync", m); !ok {
				t.Fatalf("%s: no hagroup_objects_out_of_sync for %s", step, m)
			} else if v > 0 {
				metric = append(metric, m)
			}
		}
		if !slices.Equal(listed, want) || !slices.Equal(rep.Groups[0].NeedsSync, nonNil(want)) || !slices.Equal(checked, want) ||
			check.InSync != (len(want) == 0) || !slices.Equal(metric, want) {
			t.Fatalf("%s: want %v out of sync; listgroups says %v (group: %v), synchronize --check %v (in sync %v: %v), the metric %v",
				step, want, listed, rep.Groups[0].NeedsSync, checked, check.InSync, check.Differences, metric)
		}
	}
	synchronize := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), deadline)
		defer cancel()
		if rep, err := ta.client.Synchronize(ctx, agent.SyncRequest{Group: "g"}); err != nil || rep.Failed > 0 {
			t.Fatalf("synchronize: %v %+v", err, rep)
		}
	}

	agree("at the start", nil)
	data(direct[0], "behind")
	agree("b lacks an object", []string{"b"})
	synchronize()
	agree("synchronised", nil)
	data(direct[1], "ahead")
	agree("b holds an object a lacks", []string{"a"})
	synchronize()
	agree("synchronised again", nil)
	// A second copy of one version on b, as two hosts copying at once
	// would leave: plans used to count it once and say "in sync".
	hs, err := direct[0].FindObjects(t.Context(), []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_LABEL, "ahead")})
	if err != nil || len(hs) != 1 {
		t.Fatalf("find ahead on a: %v %v", hs, err)
	}
	if _, err := (&replica.Replicator{}).Replicate(t.Context(), direct[0], hs[0], replica.Target{Slot: direct[1], Absent: true}); err != nil {
		t.Fatal(err)
	}
	agree("b holds an object twice", []string{"b"})
	synchronize()
	agree("duplicate removed", nil)
}

func nonNil(ss []string) []string {
	if ss == nil {
		return []string{}
	}
	return ss
}
