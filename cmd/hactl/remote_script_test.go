package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/ha"
	"github.com/hagroup/hagroup/pkg/remote"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync"
	"github.com/miekg/pkcs11"
	"github.com/rogpeppe/go-internal/testscript"
)

// hsmserve LABEL: serve token LABEL, made in its own token directory, with
// hagroup's hsmserve on $SHORT/LABEL.rsock (own process group), and wait
// until it answers. Sets $LABEL_MODULE (upper case, - as _) to the
// member's module path. Running it again restarts the server on the same
// token and socket. p11kill LABEL kills it.
func cmdHSMServe(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 1 || neg {
		ts.Fatalf("usage: hsmserve LABEL")
	}
	label := args[0]
	bin := filepath.Join(filepath.Dir(ts.Getenv("HACTL_BIN")), "hsmserve")
	sock := serveToken(ts, label, "hsmserve", ".rsock", "hsmserve.log", func(sock string) *exec.Cmd {
		return exec.Command(bin, "--module", softhsmModule, "--socket", sock, "--token-label", label)
	})
	ts.Setenv(strings.ToUpper(strings.ReplaceAll(label, "-", "_"))+"_MODULE", remote.ModulePath(sock))
}

// grpkey GROUP LABEL (exec'd by scripts): open GROUP of $HAGROUP_CONF as
// an application using the Go API would (members that are down start
// failed; no recovery in this process), log in with the members' PIN
// files, and generate an EC P-256 key pair on the token through the group:
// made on the primary and replicated to every active member before it
// returns.
func grpkeyMain() {
	if err := grpkey(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "grpkey:", err)
		os.Exit(1)
	}
}

func grpkey(args []string) error {
	if len(args) != 2 {
		return errors.New("usage: grpkey GROUP LABEL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitDeadline)
	defer cancel()
	cfg, err := config.Load(config.ResolvePath(""))
	if err != nil {
		return err
	}
	gc, ok := cfg.Group(args[0])
	if !ok {
		return fmt.Errorf("no group %q in %s", args[0], cfg.Path)
	}
	set := cfg.Settings(gc)
	set.Retries = 0 // the agent recovers; this process only makes a key
	g, err := ha.Open(ctx, *gc, set, ha.Options{})
	if err != nil {
		return err
	}
	defer g.Close()
	if err := g.Engine().LoginConfigured(ctx); err != nil {
		return err
	}
	s, err := g.Engine().OpenSession(ctx, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		return err
	}
	defer s.Close()
	pub, priv := ecTemplates(args[1], true)
	_, _, err = s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil), pub, priv)
	return err
}

// ecTemplates are the templates of an EC P-256 pair labelled label.
func ecTemplates(label string, privOnToken bool) (pub, priv []*pkcs11.Attribute) {
	ecParams := []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}
	pub = []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
		pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, ecParams),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, label),
		pkcs11.NewAttribute(pkcs11.CKA_ID, []byte(label)),
		pkcs11.NewAttribute(pkcs11.CKA_VERIFY, true),
	}
	priv = []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, privOnToken),
		pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
		pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true),
		pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, true),
		pkcs11.NewAttribute(pkcs11.CKA_LABEL, label),
		pkcs11.NewAttribute(pkcs11.CKA_ID, []byte(label)),
		pkcs11.NewAttribute(pkcs11.CKA_SIGN, true),
	}
	return pub, priv
}

// lsobj MODULE TOKEN (exec'd by scripts): log in to TOKEN of MODULE
// directly (not through a group) with the PIN in $PINFILE and print its
// token objects, one identity a line, sorted.
func lsobjMain() {
	if err := lsobj(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "lsobj:", err)
		os.Exit(1)
	}
}

func lsobj(args []string) error {
	if len(args) != 2 {
		return errors.New("usage: lsobj MODULE TOKEN")
	}
	b, err := os.ReadFile(os.Getenv("PINFILE"))
	if err != nil {
		return err
	}
	pin := secret.NewPIN([]byte(strings.TrimSpace(string(b))))
	defer pin.Zero()
	ctx, cancel := context.WithTimeout(context.Background(), waitDeadline)
	defer cancel()
	s, err := slot.Open(ctx, slot.Spec{Name: "lsobj", Module: args[0], TokenLabel: args[1], PIN: pin})
	if err != nil {
		return err
	}
	defer s.Close()
	objs, err := sync.List(ctx, s)
	if err != nil {
		return err
	}
	var lines []string
	for _, o := range objs {
		lines = append(lines, o.Identity.String())
	}
	slices.Sort(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	return nil
}
