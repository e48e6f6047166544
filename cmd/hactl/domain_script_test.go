package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/miekg/pkcs11"
)

// olddomain GROUP (exec'd by scripts): install on every member of GROUP
// (from $HAGROUP_CONF) a domain key as the ceremony made it before it was
// hardened: one value everywhere, wrap and unwrap only, the unwrap
// template, but modifiable, copyable and for any mechanism. Logged in with
// the PIN in $PINFILE; its own process, as SoftHSM reads SOFTHSM2_CONF
// once per process.
func olddomainMain() {
	if err := olddomain(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "olddomain:", err)
		os.Exit(1)
	}
}

func olddomain(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: olddomain GROUP")
	}
	cfg, err := config.Load(os.Getenv("HAGROUP_CONF"))
	if err != nil {
		return err
	}
	g, ok := cfg.Group(args[0])
	if !ok {
		return fmt.Errorf("no group %q", args[0])
	}
	b, err := os.ReadFile(os.Getenv("PINFILE"))
	if err != nil {
		return err
	}
	pin := secret.NewPIN([]byte(strings.TrimSpace(string(b))))
	defer pin.Zero()
	value := make([]byte, 32)
	defer clear(value)
	if _, err := rand.Read(value); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitDeadline)
	defer cancel()
	for _, m := range g.Members {
		s, err := slot.Open(ctx, slot.Spec{Name: m.Name, Module: m.Module, TokenLabel: m.TokenLabel, PIN: pin})
		if err != nil {
			return err
		}
		_, err = s.CreateObjectNested(ctx, []*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_SECRET_KEY),
			pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, pkcs11.CKK_AES),
			pkcs11.NewAttribute(pkcs11.CKA_VALUE, value),
			pkcs11.NewAttribute(pkcs11.CKA_LABEL, domainkey.Label(g.Serial)),
			pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
			pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
			pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true),
			pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, false),
			pkcs11.NewAttribute(pkcs11.CKA_WRAP, true),
			pkcs11.NewAttribute(pkcs11.CKA_UNWRAP, true),
			pkcs11.NewAttribute(pkcs11.CKA_ENCRYPT, false),
			pkcs11.NewAttribute(pkcs11.CKA_DECRYPT, false),
			pkcs11.NewAttribute(pkcs11.CKA_SIGN, false),
			pkcs11.NewAttribute(pkcs11.CKA_VERIFY, false),
			pkcs11.NewAttribute(pkcs11.CKA_DERIVE, false),
		}, map[uint][]*pkcs11.Attribute{pkcs11.CKA_UNWRAP_TEMPLATE: {pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, true)}})
		s.Close()
		if err != nil {
			return fmt.Errorf("member %s: %w", m.Name, err)
		}
	}
	return nil
}
