package recover_test

import (
	"context"
	"log"
	"time"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/recover"
	"github.com/hagroup/hagroup/pkg/sync/tombstone"
)

// failures forwards the group's member-failed events to the recoverer,
// which exists only once the group does.
type failures struct{ rec *recover.Recoverer }

func (f *failures) Event(e group.Event) {
	if e.Kind == group.MemberFailed && f.rec != nil {
		f.rec.MemberFailed(e.Member)
	}
}

// Wiring a group, its tombstone journal and its recoverer, as haagent and
// the PKCS#11 module do.
func Example() {
	ctx := context.Background()
	cfg, err := config.Load(config.ResolvePath(""))
	if err != nil {
		log.Fatal(err)
	}
	g := cfg.Groups[0]
	set := cfg.Settings(&g)

	journal, err := tombstone.Open(cfg.Agent.StateDir, g.Serial, tombstone.Options{Horizon: set.TombstoneHorizon})
	if err != nil {
		log.Fatal(err)
	}
	defer journal.Close()
	sink := &failures{}
	grp, err := group.Open(ctx, g, set, group.Options{Events: sink, Tombstones: journal})
	if err != nil {
		log.Fatal(err)
	}
	defer grp.Close()

	rec, err := recover.New(recover.Options{
		Engine:     grp,
		StateDir:   cfg.Agent.StateDir,
		Interval:   set.Interval,
		Retries:    set.Retries,
		Tombstones: journal,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer rec.Close()
	sink.rec = rec // (set before members can fail in real code: guard it with a mutex or atomic)
	rec.Resume()   // members that failed while the group opened

	// An operator's "hactl hagroup recover" and "synchronize --check":
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if _, err := rec.Recover(ctx, g.Members[0].Name); err != nil {
		log.Print(err)
	}
	rep, err := rec.Synchronize(ctx, recover.SyncOptions{Check: true})
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("in sync: %v, %d differences", rep.InSync(), len(rep.Plan.Actions)+len(rep.Plan.Conflicts))
}
