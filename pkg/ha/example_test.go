package ha_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/ha"
	"github.com/hagroup/hagroup/pkg/recover"
)

// Opening a configured group with its recovery, adding a member while it
// runs, and what an operator's listgroups and synchronize --check show.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cfg, err := config.Load(config.ResolvePath(""))
	if err != nil {
		log.Fatal(err)
	}
	gc := cfg.Groups[0]
	g, err := ha.Open(ctx, gc, cfg.Settings(&gc), ha.Options{StateDir: cfg.Agent.WithDefaults().StateDir})
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	if err := g.Engine().LoginConfigured(ctx); err != nil { // members' own PIN files
		log.Fatal(err)
	}

	// A new member is caught up before it takes any work.
	res, err := g.AddMember(ctx, config.Member{Name: "hsm-d", Module: "/usr/lib/softhsm/libsofthsm2.so",
		TokenLabel: "ha-d", PINFile: "/etc/hagroup/pin-d"})
	if err != nil {
		log.Print(err) // it stays in the group as failed; automatic recovery retries it
	} else {
		fmt.Printf("hsm-d caught up: %d objects copied\n", res.CatchUp.Copied)
	}

	for _, m := range g.Status(ctx).Members {
		fmt.Printf("%s %s out-of-sync=%d attempts-left=%d %s\n", m.Name, m.State, m.OutOfSync, m.AttemptsLeft, m.LastAttemptError)
	}
	rep, err := g.Synchronize(ctx, recover.SyncOptions{Check: true})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("in sync:", rep.InSync())
}
