package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/ha"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// virtual is one HA group as a slot: the engine (pkg/group) with its
// recovery (pkg/ha) running in the application's process.
type virtual struct {
	g *ha.Group
	// lost counts the group_down events in activeBasic: every session and
	// the login were lost then, and the library drops what it keeps of them
	// (sessionLoser).
	lost     atomic.Uint64
	onLost   atomic.Pointer[func()]
	basicNow func() bool
}

// sessionLoser is a token whose sessions and login can be lost all at once
// (a virtual slot whose group went down in activeBasic). Lost counts those
// losses; OnLost registers a function called (without blocking the caller)
// after each.
type sessionLoser interface {
	Lost() uint64
	OnLost(fn func())
}

// Lost implements sessionLoser.
func (v *virtual) Lost() uint64 { return v.lost.Load() }

// OnLost implements sessionLoser.
func (v *virtual) OnLost(fn func()) { v.onLost.Store(&fn) }

// groupDown records a group_down event: in activeBasic the engine lost
// every session and the login, so the library must too. It must not block
// (it runs inside the engine's event emission).
func (v *virtual) groupDown() {
	if !v.basicNow() {
		return // activeEnhanced: sessions and login survive the outage
	}
	v.lost.Add(1)
	if fn := v.onLost.Load(); fn != nil {
		go (*fn)()
	}
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
		v := &virtual{}
		sink := &eventSink{v: v}
		g, err := ha.Open(ctx, gc, set, ha.Options{
			StateDir: stateDir,
			Events:   sink,
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
		v.g = g
		v.basicNow = func() bool { return g.Settings().RecoveryMode == config.RecoveryActiveBasic }
		out = append(out, v)
	}
	// Per-member counters for the application, when it asks (stats.go).
	sources := make([]statsSource, len(groups))
	for i, g := range groups {
		sources[i] = g
	}
	stats, err := startStats(os.Getenv, sources)
	if err != nil {
		log.event("", "", "stats_off", err.Error())
	}
	return out, func() error { return errors.Join(stats.stop(), closeAll()) }, nil
}

// eventSink tells the virtual slot of a group_down. It must not block:
// groupDown only schedules. (pkg/ha reports the events and forwards member
// failures to the recoverer itself.)
type eventSink struct {
	v *virtual
}

func (s *eventSink) Event(e group.Event) {
	if e.Kind == group.GroupDown && s.v.basicNow != nil {
		s.v.groupDown()
	}
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

func (v *virtual) OpenSession(ctx context.Context) (session, error) {
	s, err := v.g.OpenSession(ctx, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		return nil, err
	}
	return &virtualSession{g: v.g.Group, s: s}, nil
}

func (v *virtual) Close() error { return nil } // the groups close in openGroups' closer

// virtualSession is one application session on a group. Single-part
// operations go to the group (scheduled over members, with failover), after
// the engine's session says it is still valid (Session.Check: in
// activeBasic a session opened before every member failed answers
// CKR_SESSION_HANDLE_INVALID, as it would on the engine's session);
// multi-part ones go to the engine's session, which pins them on the first
// Update.
type virtualSession struct {
	g *group.Group
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
	if err := v.s.Check(); err != nil {
		return nil, err
	}
	return v.g.GetAttributes(ctx, vh(h), types)
}

func (v *virtualSession) SetAttributes(ctx context.Context, h uint, attrs []*pkcs11.Attribute) error {
	if err := v.s.Check(); err != nil {
		return err
	}
	return v.g.SetAttributes(ctx, vh(h), attrs)
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
	if err := v.s.Check(); err != nil {
		return nil, err
	}
	return v.g.WrapKey(ctx, m, vh(wrapping), vh(key))
}

func (v *virtualSession) UnwrapKey(ctx context.Context, m *pkcs11.Mechanism, unwrapping uint, blob []byte, tmpl []*pkcs11.Attribute) (uint, error) {
	h, err := v.s.UnwrapKey(ctx, m, vh(unwrapping), blob, tmpl)
	return uint(h), err
}

func (v *virtualSession) DeriveKey(ctx context.Context, m *pkcs11.Mechanism, base uint, tmpl []*pkcs11.Attribute) (uint, error) {
	h, err := v.s.DeriveKey(ctx, m, vh(base), tmpl)
	return uint(h), err
}

func (v *virtualSession) Sign(ctx context.Context, m *pkcs11.Mechanism, key uint, data []byte) ([]byte, error) {
	if err := v.s.Check(); err != nil {
		return nil, err
	}
	return v.g.Sign(ctx, m, vh(key), data)
}

func (v *virtualSession) Verify(ctx context.Context, m *pkcs11.Mechanism, key uint, data, sig []byte) error {
	if err := v.s.Check(); err != nil {
		return err
	}
	return v.g.Verify(ctx, m, vh(key), data, sig)
}

func (v *virtualSession) Encrypt(ctx context.Context, m *pkcs11.Mechanism, key uint, data []byte) ([]byte, error) {
	if err := v.s.Check(); err != nil {
		return nil, err
	}
	return v.g.Encrypt(ctx, m, vh(key), data)
}

func (v *virtualSession) Decrypt(ctx context.Context, m *pkcs11.Mechanism, key uint, data []byte) ([]byte, error) {
	if err := v.s.Check(); err != nil {
		return nil, err
	}
	return v.g.Decrypt(ctx, m, vh(key), data)
}

func (v *virtualSession) Digest(ctx context.Context, m *pkcs11.Mechanism, data []byte) ([]byte, error) {
	if err := v.s.Check(); err != nil {
		return nil, err
	}
	return v.g.Digest(ctx, m, data)
}

func (v *virtualSession) GenerateRandom(ctx context.Context, n int) ([]byte, error) {
	if err := v.s.Check(); err != nil {
		return nil, err
	}
	return v.g.GenerateRandom(ctx, n)
}

func (v *virtualSession) SignInit(ctx context.Context, m *pkcs11.Mechanism, key uint) error {
	return v.s.SignInit(ctx, m, vh(key))
}
func (v *virtualSession) SignUpdate(ctx context.Context, data []byte) error {
	return v.s.SignUpdate(ctx, data)
}
func (v *virtualSession) SignFinal(ctx context.Context) ([]byte, error) { return v.s.SignFinal(ctx) }
func (v *virtualSession) VerifyInit(ctx context.Context, m *pkcs11.Mechanism, key uint) error {
	return v.s.VerifyInit(ctx, m, vh(key))
}
func (v *virtualSession) VerifyUpdate(ctx context.Context, data []byte) error {
	return v.s.VerifyUpdate(ctx, data)
}
func (v *virtualSession) VerifyFinal(ctx context.Context, sig []byte) error {
	return v.s.VerifyFinal(ctx, sig)
}
func (v *virtualSession) EncryptInit(ctx context.Context, m *pkcs11.Mechanism, key uint) error {
	return v.s.EncryptInit(ctx, m, vh(key))
}
func (v *virtualSession) EncryptUpdate(ctx context.Context, data []byte) ([]byte, error) {
	return v.s.EncryptUpdate(ctx, data)
}
func (v *virtualSession) EncryptFinal(ctx context.Context) ([]byte, error) {
	return v.s.EncryptFinal(ctx)
}
func (v *virtualSession) DecryptInit(ctx context.Context, m *pkcs11.Mechanism, key uint) error {
	return v.s.DecryptInit(ctx, m, vh(key))
}
func (v *virtualSession) DecryptUpdate(ctx context.Context, data []byte) ([]byte, error) {
	return v.s.DecryptUpdate(ctx, data)
}
func (v *virtualSession) DecryptFinal(ctx context.Context) ([]byte, error) {
	return v.s.DecryptFinal(ctx)
}
func (v *virtualSession) DigestInit(ctx context.Context, m *pkcs11.Mechanism) error {
	return v.s.DigestInit(ctx, m)
}
func (v *virtualSession) DigestUpdate(ctx context.Context, data []byte) error {
	return v.s.DigestUpdate(ctx, data)
}
func (v *virtualSession) DigestKey(ctx context.Context, key uint) error {
	return v.s.DigestKey(ctx, vh(key))
}
func (v *virtualSession) DigestFinal(ctx context.Context) ([]byte, error) {
	return v.s.DigestFinal(ctx)
}
func (v *virtualSession) Close() error { return v.s.Close() }
