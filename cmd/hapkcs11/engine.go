package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	harecover "github.com/hagroup/hagroup/pkg/recover"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/tombstone"
	"github.com/miekg/pkcs11"
)

// virtual is one HA group as a slot: the engine (pkg/group) running in
// the application's process.
type virtual struct {
	g *group.Group
}

// openGroups starts the engine for every configured group, with the
// automatic recovery of failed members (pkg/recover) running in this
// process, as Luna's client does. Deletions are journalled in the state
// directory when this process may write it (so that a member that was away
// cannot bring a deleted key back, and recoveries by the agent and by
// applications exclude each other through its lock files); otherwise they
// are kept in memory, which the HA event log then says.
func openGroups(ctx context.Context, cfg *config.Config, log *eventLog) ([]token, func() error, error) {
	stateDir := cfg.Agent.WithDefaults().StateDir
	var (
		groups   []*group.Group
		recs     []*harecover.Recoverer
		journals []*tombstone.Journal
	)
	closeAll := func() error {
		var errs []error
		for _, r := range recs {
			errs = append(errs, r.Close())
		}
		for _, g := range groups {
			errs = append(errs, g.Close())
		}
		for _, j := range journals {
			errs = append(errs, j.Close())
		}
		return errors.Join(errs...)
	}
	out := make([]token, 0, len(cfg.Groups))
	for i := range cfg.Groups {
		gc := cfg.Groups[i]
		set := cfg.Settings(&gc)
		sink := &eventSink{log: log}
		opts := group.Options{Events: sink}
		ropts := harecover.Options{
			Interval: set.Interval,
			Retries:  set.Retries,
			Events:   sink.recovery(gc.Label),
		}
		j, err := tombstone.Open(stateDir, gc.Serial, tombstone.Options{Horizon: set.TombstoneHorizon})
		if err != nil {
			log.event(gc.Label, "", "client-tombstones-in-memory", err.Error())
		} else {
			journals = append(journals, j)
			opts.Tombstones = j
			ropts.Tombstones = j
			ropts.StateDir = stateDir
		}
		g, err := group.Open(ctx, gc, set, opts)
		if err != nil {
			_ = closeAll() // the start failed; the error below says why
			return nil, nil, fmt.Errorf("group %s: %w", gc.Label, err)
		}
		groups = append(groups, g)
		ropts.Engine = g
		rec, err := harecover.New(ropts)
		if err != nil {
			_ = closeAll()
			return nil, nil, fmt.Errorf("group %s: recovery: %w", gc.Label, err)
		}
		recs = append(recs, rec)
		sink.rec.Store(rec)
		rec.Resume() // members that failed while the group opened
		out = append(out, &virtual{g: g})
	}
	// Per-member counters for the application, when it asks (stats.go).
	sources := make([]statsSource, len(groups))
	for i, g := range groups {
		sources[i] = g
	}
	stats, err := startStats(os.Getenv, sources)
	if err != nil {
		log.event("", "", "client-stats-off", err.Error())
	}
	return out, func() error { return errors.Join(stats.stop(), closeAll()) }, nil
}

// eventSink writes the engine's events to the HA event log and starts the
// recovery of a member that failed. It must not block: the log is an
// O_APPEND file write and MemberFailed only schedules.
type eventSink struct {
	log *eventLog
	rec atomic.Pointer[harecover.Recoverer]
}

func (s *eventSink) Event(e group.Event) {
	detail := ""
	switch {
	case e.Err != nil:
		detail = e.Err.Error()
	case e.Object.Label != "" || len(e.Object.ID) > 0:
		detail = e.Object.String()
	case e.From != e.To:
		detail = fmt.Sprintf("%s -> %s", e.From, e.To)
	}
	s.log.event(e.Group, e.Member, string(e.Kind), detail)
	if e.Kind == group.MemberFailed {
		if r := s.rec.Load(); r != nil {
			r.MemberFailed(e.Member)
		}
	}
}

// recovery returns the Recoverer's event callback for group label.
func (s *eventSink) recovery(label string) func(harecover.Event) {
	return func(e harecover.Event) {
		detail := ""
		if e.Err != nil {
			detail = e.Err.Error()
		}
		s.log.event(label, e.Member, string(e.Kind), detail)
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
	ti.ManufacturerID, ti.Model = manufacturer, model
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
	return &virtualSession{g: v.g, s: s}, nil
}

func (v *virtual) Close() error { return nil } // the groups close in openGroups' closer

// virtualSession is one application session on a group. Single-part
// operations go to the group (scheduled over members, with failover);
// multi-part ones to the engine's session, which pins them on the first
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
	return v.g.GetAttributes(ctx, vh(h), types)
}

func (v *virtualSession) SetAttributes(ctx context.Context, h uint, attrs []*pkcs11.Attribute) error {
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
	return v.g.Sign(ctx, m, vh(key), data)
}

func (v *virtualSession) Verify(ctx context.Context, m *pkcs11.Mechanism, key uint, data, sig []byte) error {
	return v.g.Verify(ctx, m, vh(key), data, sig)
}

func (v *virtualSession) Encrypt(ctx context.Context, m *pkcs11.Mechanism, key uint, data []byte) ([]byte, error) {
	return v.g.Encrypt(ctx, m, vh(key), data)
}

func (v *virtualSession) Decrypt(ctx context.Context, m *pkcs11.Mechanism, key uint, data []byte) ([]byte, error) {
	return v.g.Decrypt(ctx, m, vh(key), data)
}

func (v *virtualSession) Digest(ctx context.Context, m *pkcs11.Mechanism, data []byte) ([]byte, error) {
	return v.g.Digest(ctx, m, data)
}

func (v *virtualSession) GenerateRandom(ctx context.Context, n int) ([]byte, error) {
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
func (v *virtualSession) DigestFinal(ctx context.Context) ([]byte, error) {
	return v.s.DigestFinal(ctx)
}
func (v *virtualSession) Close() error { return v.s.Close() }
