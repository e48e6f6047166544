// Command hsmprep prepares the member tokens of a module test the way an
// operator would with hactl: it installs a group's domain key on every
// member and, with -ec-key, makes an EC P-256 key pair through the engine
// (so it is on every member). It runs in its own process so that each
// test's SOFTHSM2_CONF is read by a fresh SoftHSM.
//
//	hsmprep -config hagroup.toml -group signing -user-pin-file F [-so-pin-file F] [-ec-key LABEL,IDHEX]
//	hsmprep -config hagroup.toml -group signing -user-pin-file F -fill N -member NAME
//
// With -fill it makes nothing else: N AES-256 token keys labelled
// aes-00000… (the same values on every run) straight on member NAME's
// token, one at a time (SoftHSM loses objects created at once in one
// token), the fixture of the many-objects benchmarks.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/miekg/pkcs11"
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
	slot.OwnEnvironment() // a hagroup program: members' module_env may be written (pkg/slot)
	cfgPath := flag.String("config", "", "hagroup.toml")
	label := flag.String("group", "", "group label")
	userFile := flag.String("user-pin-file", "", "file holding the members' user PIN")
	soFile := flag.String("so-pin-file", "", "file holding the members' SO PIN (trusted install)")
	ecKey := flag.String("ec-key", "", "LABEL,IDHEX: also make an EC P-256 key pair through the group")
	fill := flag.Int("fill", 0, "make this many AES keys on -member's token, nothing else")
	fillMember := flag.String("member", "", "the member -fill fills")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute+time.Duration(*fill)*500*time.Millisecond)
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
	if *fill > 0 {
		return fillKeys(ctx, g, *fillMember, user, *fill)
	}
	var targets []domainkey.Target
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
		targets = append(targets, domainkey.Target{Slot: s, SOPIN: so, UserPIN: user})
	}
	if err := domainkey.Install(ctx, targets, g.Serial); err != nil {
		return err
	}
	if *ecKey == "" {
		return nil
	}
	for _, t := range targets {
		t.Slot.Close()
	}
	return makeKey(ctx, cfg, g, user, *ecKey)
}

// makeKey makes a token EC P-256 key pair through the engine, which puts
// it on every member.
func makeKey(ctx context.Context, cfg *config.Config, gc *config.Group, pin secret.PIN, spec string) error {
	label, idHex, ok := strings.Cut(spec, ",")
	id, err := hex.DecodeString(idHex)
	if !ok || err != nil {
		return fmt.Errorf("-ec-key %q: want LABEL,IDHEX", spec)
	}
	g, err := group.Open(ctx, *gc, cfg.Settings(gc), group.Options{})
	if err != nil {
		return err
	}
	defer g.Close()
	if err := g.Login(ctx, pkcs11.CKU_USER, pin); err != nil {
		return err
	}
	s, err := g.OpenSession(ctx, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		return err
	}
	defer s.Close()
	p256 := []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}
	common := func(private bool) []*pkcs11.Attribute {
		return []*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
			pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, private),
			pkcs11.NewAttribute(pkcs11.CKA_LABEL, label),
			pkcs11.NewAttribute(pkcs11.CKA_ID, id),
		}
	}
	pub := append(common(false), pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, p256), pkcs11.NewAttribute(pkcs11.CKA_VERIFY, true))
	priv := append(common(true), pkcs11.NewAttribute(pkcs11.CKA_SIGN, true), pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true))
	_, _, err = s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil), pub, priv)
	return err
}

// fillKeys makes n AES-256 token keys on member name's own token.
func fillKeys(ctx context.Context, g *config.Group, name string, pin secret.PIN, n int) error {
	for _, m := range g.Members {
		if m.Name != name {
			continue
		}
		s, err := slot.Open(ctx, slot.Spec{
			Name: m.Name, Module: m.Module, ModuleEnv: m.ModuleEnv,
			TokenLabel: m.TokenLabel, TokenSerial: m.TokenSerial, URI: m.URI, PIN: pin.Clone(),
		})
		if err != nil {
			return err
		}
		defer s.Close()
		if err := s.Login(ctx, pkcs11.CKU_USER, pin); err != nil {
			return err
		}
		for i := range n {
			label := fmt.Sprintf("aes-%05d", i)
			value := sha256.Sum256([]byte(label))
			if _, err := s.CreateObject(ctx, []*pkcs11.Attribute{
				pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY),
				pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
				pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
				pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
				pkcs11.NewAttribute(pkcs11.CKA_LABEL, label),
				pkcs11.NewAttribute(pkcs11.CKA_ID, []byte(label)),
				pkcs11.NewAttribute(pkcs11.CKA_ENCRYPT, true),
				pkcs11.NewAttribute(pkcs11.CKA_DECRYPT, true),
				pkcs11.NewAttribute(pkcs11.CKA_VALUE, value[:]),
			}); err != nil {
				return fmt.Errorf("member %s: key %s: %w", name, label, err)
			}
		}
		return nil
	}
	return fmt.Errorf("-member %q: no such member of group %s", name, g.Label)
}
