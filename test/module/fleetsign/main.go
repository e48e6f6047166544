// fleetsign signs through the Go API (pkg/ha) with a fleet reporter, as a
// Go application would, for the fleet test: it opens the group the config
// names, logs in with the PIN file, reports to the config's agent socket
// and signs with key LABEL in THREADS goroutines until its standard input
// closes.
//
// usage: fleetsign -config FILE -group LABEL -pin-file FILE -key LABEL [-threads N]
//
// Prints "ready" once the key is found, "progress N" (signatures so far)
// after every 200, "rate R" (signatures per second over the last second)
// every second, and at the end "total signed=N sign_failed=N".
package main

import (
	"bufio"
	"context"
	"crypto"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/fleet"
	"github.com/hagroup/hagroup/pkg/group/signer"
	"github.com/hagroup/hagroup/pkg/ha"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/miekg/pkcs11"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "fleetsign:", err)
		os.Exit(1)
	}
}

func run() error {
	cfgPath := flag.String("config", "", "configuration file")
	label := flag.String("group", "", "group label")
	pinFile := flag.String("pin-file", "", "user PIN file")
	key := flag.String("key", "", "private key label")
	threads := flag.Int("threads", 2, "signing goroutines")
	flag.Parse()
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		return err
	}
	gc, ok := cfg.Group(*label)
	if !ok {
		return fmt.Errorf("%s: no group %q", cfg.Path, *label)
	}
	b, err := os.ReadFile(*pinFile)
	if err != nil {
		return err
	}
	pin := secret.NewPIN([]byte(strings.TrimRight(string(b), "\n")))

	ctx := context.Background()
	ag := cfg.Agent.WithDefaults()
	rep := fleet.Start(fleet.Options{Socket: ag.Socket, Program: "fleetsign", Interval: time.Second})
	defer rep.Close()
	g, err := ha.Open(ctx, *gc, cfg.Settings(gc), ha.Options{StateDir: ag.StateDir, Report: rep})
	if err != nil {
		return err
	}
	defer g.Close()
	if err := g.Engine().Login(ctx, pkcs11.CKU_USER, pin); err != nil {
		return err
	}
	s, err := signer.New(ctx, g.Engine(), signer.KeySelector{Label: *key})
	if err != nil {
		return err
	}
	fmt.Println("ready")

	var signed, failed atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < *threads; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			digest := sha256.Sum256([]byte(fmt.Sprint("fleetsign ", i)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := s.SignContext(ctx, digest[:], crypto.SHA256); err != nil {
					if n := failed.Add(1); n <= 5 {
						fmt.Println("error", err)
						if n == 1 { // what the engine saw, so that a failure explains itself
							for _, m := range g.Engine().Members() {
								fmt.Printf("error member %s %v last error %q at %v\n", m.Name, m.State, m.LastError, m.LastErrorTime.Format(time.RFC3339Nano))
							}
						}
					}
					continue
				}
				if n := signed.Add(1); n%200 == 0 {
					fmt.Println("progress", n)
				}
			}
		}()
	}
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		last := uint64(0)
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				n := signed.Load()
				fmt.Println("rate", n-last)
				last = n
			}
		}
	}()
	io.Copy(io.Discard, bufio.NewReader(os.Stdin))
	close(stop)
	wg.Wait()
	fmt.Printf("total signed=%d sign_failed=%d\n", signed.Load(), failed.Load())
	return nil
}
