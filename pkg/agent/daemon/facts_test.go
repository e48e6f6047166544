package daemon

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/hagroup/hagroup/pkg/agent"
)

// Issue 15 (log noise): a fact every process sees is logged once, where
// it is new. Two application processes report b failed after the agent
// itself failed it, and both report that a cannot hold EdDSA keys: the HA
// log keeps the agent's member_failed and the first process's
// keys_unholdable, and nothing of the second process, not even in a
// folded summary. A member_failed the agent does not know (a still
// serving in the agent) is news and is logged.
func TestProcessesDoNotRepeatKnownFacts(t *testing.T) {
	ta, logFile := fleetAgent(t)
	ctx := t.Context()
	eng := ta.d.groups["g"].engine().(*groupEngine)
	if err := eng.h.Engine().FailMember("b", errors.New("test: b dies")); err != nil {
		t.Fatal(err)
	}
	unholdable := "member a cannot hold EdDSA keys: test"
	report := func(pid int, prog string) {
		t.Helper()
		rep := agent.FleetReport{Program: prog, Host: "h", Started: time.Now().UTC(), Events: []agent.FleetEvent{
			{Time: time.Now(), Group: "g", Member: "b", Event: "member_failed", Detail: "b is dead: CKR_DEVICE_ERROR"},
			{Time: time.Now(), Group: "g", Member: "a", Event: "keys_unholdable", Detail: unholdable},
		}}
		if err := ta.d.Report(ctx, agent.Peer{PID: pid, UID: os.Getuid(), Known: true}, rep); err != nil {
			t.Fatal(err)
		}
	}
	report(4101, "first")
	report(4102, "second")
	// a still serves in the agent: a process that saw it fail says something new.
	if err := ta.d.Report(ctx, agent.Peer{PID: 4103, UID: os.Getuid(), Known: true}, agent.FleetReport{Program: "third", Host: "h",
		Started: time.Now().UTC(), Events: []agent.FleetEvent{{Time: time.Now(), Group: "g", Member: "a", Event: "member_failed", Detail: "a timed out here"}}}); err != nil {
		t.Fatal(err)
	}
	ta.cancel() // the agent stops: every folded summary is written
	select {
	case err := <-ta.done:
		ta.done <- err // for the test's cleanup
	case <-time.After(deadline):
		t.Fatal("the agent did not stop")
	}
	data, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		var e agent.Event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		who := e.Program
		if e.PID == os.Getpid() || who == "" {
			who = "agent"
		}
		count[who+" "+e.Member+" "+e.Event]++
	}
	for line, want := range map[string]int{
		"agent b member_failed":    1,
		"first b member_failed":    0,
		"second b member_failed":   0,
		"first a keys_unholdable":  1,
		"second a keys_unholdable": 0,
		"third a member_failed":    1,
	} {
		if count[line] != want {
			t.Errorf("%d HA log lines %q, want %d; the log:\n%s", count[line], line, want, data)
		}
	}
}
