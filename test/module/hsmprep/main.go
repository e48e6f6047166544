// Command hsmprep prepares the member tokens of a module test the way an
// operator would with hactl: it installs a group's domain key on every
// member. It runs in its own process so that each test's SOFTHSM2_CONF is
// read by a fresh SoftHSM.
//
//	hsmprep -config hagroup.toml -group signing -user-pin-file F -so-pin-file F
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	hasync "github.com/hagroup/hagroup/pkg/sync"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "hsmprep:", err)
		os.Exit(1)
	}
}

func readPIN(path string) (secret.PIN, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return secret.PIN{}, err
	}
	return secret.PINFromString(strings.TrimRight(string(b), "\r\n")), nil
}

func run() error {
	cfgPath := flag.String("config", "", "hagroup.toml")
	label := flag.String("group", "", "group label")
	userFile := flag.String("user-pin-file", "", "file holding the members' user PIN")
	soFile := flag.String("so-pin-file", "", "file holding the members' SO PIN (trusted install)")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	cfg, err := config.Load(*cfgPath)
	if err != nil {
		return err
	}
	g, ok := cfg.Group(*label)
	if !ok {
		return fmt.Errorf("%s: no group %q", *cfgPath, *label)
	}
	user, err := readPIN(*userFile)
	if err != nil {
		return err
	}
	var so secret.PIN
	if *soFile != "" {
		if so, err = readPIN(*soFile); err != nil {
			return err
		}
	}
	var targets []hasync.DomainTarget
	for _, m := range g.Members {
		s, err := slot.Open(ctx, slot.Spec{
			Name: m.Name, Module: m.Module, ModuleEnv: m.ModuleEnv,
			TokenLabel: m.TokenLabel, TokenSerial: m.TokenSerial, URI: m.URI,
			PIN: user.Clone(),
		})
		if err != nil {
			return err
		}
		defer s.Close()
		targets = append(targets, hasync.DomainTarget{Slot: s, SOPIN: so, UserPIN: user})
	}
	return hasync.InstallDomainKey(ctx, targets, g.Serial)
}
