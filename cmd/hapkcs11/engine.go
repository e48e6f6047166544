package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/ha"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// virtual is one HA group as a slot: the engine (pkg/group) with its
// recovery (pkg/ha) running in the application's process. The engine keeps
// the login and the sessions, and what an outage does to them.
type virtual struct {
	g *group.Group
	h *ha.Group // g with its recovery; it follows the configuration (reload.go)
}

// openGroups starts every configured group with ha.Open: the engine, the
// automatic recovery of failed members running in this process (as Luna's
// client does), and the tombstone journal in the state directory when this
// process may write it (so that a member that was away cannot bring a
// deleted key back, and recoveries by the agent and by applications exclude
// each other through its lock files); otherwise tombstones are kept in
// memory, which the HA event log then says.
func openGroups(ctx context.Context, cfg *config.Config, log *eventLog) ([]token, func() error, error) {
	stateDir := cfg.Agent.WithDefaults().StateDir
	var groups []*ha.Group
	closeAll := func() error {
		var errs []error
		for _, g := range groups {
			errs = append(errs, g.Close())
		}
		return errors.Join(errs...)
	}
	out := make([]token, 0, len(cfg.Groups))
	for i := range cfg.Groups {
		gc := cfg.Groups[i]
		set := cfg.Settings(&gc)
		g, err := ha.Open(ctx, gc, set, ha.Options{
			StateDir: stateDir,
			// The engine's and the recoverer's events and the members'
			// figures go to haagent (or, without one, to the HA log).
			Report: log.rep,
		})
		if err != nil {
			_ = closeAll() // the start failed; the error below says why
			return nil, nil, fmt.Errorf("group %s: %w", gc.Label, err)
		}
		if terr := g.TombstoneError(); terr != nil {
			log.event(gc.Label, "", "tombstones_in_memory", terr.Error())
		}
		groups = append(groups, g)
		out = append(out, &virtual{g: g.Engine(), h: g})
	}
	// Per-member counters for the application, when it asks (stats.go).
	sources := make([]statsSource, len(groups))
	for i, g := range groups {
		sources[i] = g.Engine()
	}
	stats, err := startStats(os.Getenv, sources)
	if err != nil {
		log.event("", "", "stats_off", err.Error())
	}
	return out, func() error { return errors.Join(stats.stop(), closeAll()) }, nil
}

func (v *virtual) SlotInfo() slotInfo {
	return slotInfo{
		Description:  "hagroup virtual slot " + v.g.Label(),
		Manufacturer: manufacturer,
		Present:      true, // a group with every member down still exists: calls fail, the slot stays
	}
}

func (v *virtual) TokenInfo(ctx context.Context) (pkcs11.TokenInfo, error) {
	ti, err := v.g.TokenInfo(ctx)
	if err != nil {
		return ti, err
	}
	ti.Label, ti.SerialNumber = v.g.Label(), v.g.Serial()
	return ti, nil
}

func (v *virtual) Mechanisms(ctx context.Context) ([]uint, error) { return v.g.Mechanisms(ctx) }

func (v *virtual) MechanismInfo(ctx context.Context, mech uint) (pkcs11.MechanismInfo, error) {
	return v.g.MechanismInfo(ctx, mech)
}

func (v *virtual) Login(ctx context.Context, userType uint, pin secret.PIN) error {
	return v.g.Login(ctx, userType, pin)
}

func (v *virtual) Logout(ctx context.Context) error { return v.g.Logout(ctx) }

func (v *virtual) LoggedIn() (uint, bool) { return v.g.LoggedIn() }

func (v *virtual) OpenSession(ctx context.Context) (session, error) {
	s, err := v.g.OpenSession(ctx, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		return nil, err
	}
	return &virtualSession{s: s}, nil
}

func (v *virtual) Close() error { return nil } // the groups close in openGroups' closer

// virtualSession is one application session on a group: every call goes
// to the engine's session (group.Session), which alone knows whether the
// session is still valid (in activeBasic a session opened before every
// member failed answers CKR_SESSION_HANDLE_INVALID) and what operations it
// has active. Only handles are converted here.
type virtualSession struct {
	s *group.Session
}

type vh = group.ObjectHandle

func handles(hs []group.ObjectHandle) []uint {
	out := make([]uint, len(hs))
	for i, h := range hs {
		out[i] = uint(h)
	}
	return out
}

func (v *virtualSession) FindObjects(ctx context.Context, tmpl []*pkcs11.Attribute) ([]uint, error) {
	hs, err := v.s.Find(ctx, tmpl)
	return handles(hs), err
}

func (v *virtualSession) GetAttributes(ctx context.Context, h uint, types []uint) ([]slot.Attribute, error) {
	return v.s.GetAttributes(ctx, vh(h), types)
}

func (v *virtualSession) SetAttributes(ctx context.Context, h uint, attrs []*pkcs11.Attribute) error {
	return v.s.SetAttributes(ctx, vh(h), attrs)
}

func (v *virtualSession) CreateObject(ctx context.Context, tmpl []*pkcs11.Attribute) (uint, error) {
	h, err := v.s.CreateObject(ctx, tmpl)
	return uint(h), err
}

func (v *virtualSession) CopyObject(ctx context.Context, h uint, tmpl []*pkcs11.Attribute) (uint, error) {
	n, err := v.s.CopyObject(ctx, vh(h), tmpl)
	return uint(n), err
}

func (v *virtualSession) DestroyObject(ctx context.Context, h uint) error {
	return v.s.DestroyObject(ctx, vh(h))
}

func (v *virtualSession) GenerateKey(ctx context.Context, m *pkcs11.Mechanism, tmpl []*pkcs11.Attribute) (uint, error) {
	h, err := v.s.GenerateKey(ctx, m, tmpl)
	return uint(h), err
}

func (v *virtualSession) GenerateKeyPair(ctx context.Context, m *pkcs11.Mechanism, pub, priv []*pkcs11.Attribute) (uint, uint, error) {
	pk, sk, err := v.s.GenerateKeyPair(ctx, m, pub, priv)
	return uint(pk), uint(sk), err
}

func (v *virtualSession) WrapKey(ctx context.Context, m *pkcs11.Mechanism, wrapping, key uint) ([]byte, error) {
	return v.s.WrapKey(ctx, m, vh(wrapping), vh(key))
}

func (v *virtualSession) UnwrapKey(ctx context.Context, m *pkcs11.Mechanism, unwrapping uint, blob []byte, tmpl []*pkcs11.Attribute) (uint, error) {
	h, err := v.s.UnwrapKey(ctx, m, vh(unwrapping), blob, tmpl)
	return uint(h), err
}

func (v *virtualSession) DeriveKey(ctx context.Context, m *pkcs11.Mechanism, base uint, tmpl []*pkcs11.Attribute) (uint, error) {
	h, err := v.s.DeriveKey(ctx, m, vh(base), tmpl)
	return uint(h), err
}

func (v *virtualSession) GenerateRandom(ctx context.Context, n int) ([]byte, error) {
	return v.s.GenerateRandom(ctx, n)
}

func (v *virtualSession) Init(ctx context.Context, k group.OpKind, m *pkcs11.Mechanism, key uint) error {
	return v.s.Init(ctx, k, m, vh(key))
}

func (v *virtualSession) Cancel(k group.OpKind) error { return v.s.Cancel(k) }

func (v *virtualSession) Do(ctx context.Context, k group.OpKind, st group.Step, in, sig []byte, room group.Room) ([]byte, error) {
	return v.s.Do(ctx, k, st, in, sig, room)
}

func (v *virtualSession) DigestKey(ctx context.Context, key uint) error {
	return v.s.DigestKey(ctx, vh(key))
}

func (v *virtualSession) Check() error { return v.s.Check() }

func (v *virtualSession) Close() error { return v.s.Close() }
