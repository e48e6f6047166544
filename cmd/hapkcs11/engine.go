package main

import (
	"context"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/miekg/pkcs11"
)

// TEMPORARY until pkg/group lands: virtual slots are listed without a token.
type unwired struct{ label string }

func openGroups(ctx context.Context, cfg *config.Config, log *eventLog) ([]token, func() error, error) {
	out := make([]token, len(cfg.Groups))
	for i, g := range cfg.Groups {
		out[i] = unwired{g.Label}
	}
	return out, nil, nil
}

func (u unwired) SlotInfo() slotInfo {
	return slotInfo{Description: "hagroup virtual slot " + u.label, Manufacturer: manufacturer}
}
func (u unwired) TokenInfo(context.Context) (pkcs11.TokenInfo, error) {
	return pkcs11.TokenInfo{}, errNoEngine
}
func (u unwired) Mechanisms(context.Context) ([]uint, error) { return nil, errNoEngine }
func (u unwired) MechanismInfo(context.Context, uint) (pkcs11.MechanismInfo, error) {
	return pkcs11.MechanismInfo{}, errNoEngine
}
func (u unwired) Login(context.Context, uint, secret.PIN) error  { return errNoEngine }
func (u unwired) Logout(context.Context) error                   { return errNoEngine }
func (u unwired) OpenSession(context.Context) (session, error)   { return nil, errNoEngine }
func (u unwired) Close() error                                   { return nil }
