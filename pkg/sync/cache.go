package sync

import (
	"context"
	"errors"
	"fmt"
	"github.com/hagroup/hagroup/internal/tokenquirk"
	"strings"
	"weak"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/miekg/pkcs11"
)

// memo is what a Replicator remembers of one member between calls, for
// one login epoch of its slot (slot.Slot.Epoch): the handle of the domain
// key and whether it is trusted, and what the member says of the wrapping
// mechanism. Finding the domain key costs a FindObjects, which SoftHSM
// answers by visiting every object on the token (docs/BENCHMARKS.md,
// "SoftHSM costs the code is shaped by"); with the memo, a Replicate makes
// no search but the look-up of an existing copy on the target.
type memo struct {
	epoch uint64

	dk      pkcs11.ObjectHandle // 0 until looked up
	trusted bool                // the domain key carries CKA_TRUSTED

	mechKnown bool
	mech      pkcs11.MechanismInfo
	mechErr   error // the module's answer when it has no such mechanism
}

// memberState is what a Replicator keeps per member slot.
type memberState struct {
	// turn admits one copy into the member at a time, on a token that
	// needs it (tokenquirk.SerialCreations).
	turn chan struct{}
	memo memo
	// weak is the flaws last reported of the member's domain key ("" when
	// sound or not yet audited), so each change is reported once.
	weak string
	// wrapOnlyFlaws: what the token does not keep of a wrap-only key
	// (wraponly.go), once wrapOnlyKnown.
	wrapOnlyKnown bool
	wrapOnlyFlaws []string
}

// state returns s's state, made on first use. Callers hold r.mu.
func (r *Replicator) stateLocked(s *slot.Slot) *memberState {
	if r.members == nil {
		r.members = map[weak.Pointer[slot.Slot]]*memberState{}
	}
	k := weak.Make(s)
	st := r.members[k]
	if st == nil {
		// A new slot (a member opened again): drop the state of slots
		// that are gone, so a long-lived Replicator does not grow.
		for p := range r.members {
			if p.Value() == nil {
				delete(r.members, p)
			}
		}
		st = &memberState{turn: make(chan struct{}, 1)}
		r.members[k] = st
	}
	return st
}

func (r *Replicator) memoOf(s *slot.Slot) memo {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st := r.members[weak.Make(s)]; st != nil && st.memo.epoch == s.Epoch() {
		return st.memo
	}
	return memo{}
}

// remember applies fn to s's memo for epoch; a memo of another epoch is
// dropped first. A memo of an epoch that has passed is never used.
func (r *Replicator) remember(s *slot.Slot, epoch uint64, fn func(*memo)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.stateLocked(s)
	if st.memo.epoch != epoch {
		st.memo = memo{epoch: epoch}
	}
	fn(&st.memo)
}

// forgetDomainKey drops s's domain-key handle, so that the next call finds
// it again.
func (r *Replicator) forgetDomainKey(s *slot.Slot) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st := r.members[weak.Make(s)]; st != nil {
		st.memo.dk, st.memo.trusted = 0, false
	}
}

// takeTurn waits, bounded by ctx, until no other copy of this Replicator
// is being made into s, and returns the function that ends the turn. Only
// a token that needs it (tokenquirk.SerialCreations) waits.
func (r *Replicator) takeTurn(ctx context.Context, s *slot.Slot) (func(), error) {
	if t := s.Token(); !tokenquirk.SerialCreations(t.Manufacturer, t.Model) {
		return func() {}, nil
	}
	r.mu.Lock()
	turn := r.stateLocked(s).turn
	r.mu.Unlock()
	select {
	case turn <- struct{}{}:
		return func() { <-turn }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("member %s: wait for the copy before this one: %w", s.Name(), context.Cause(ctx))
	}
}

// domainKey returns the domain key on s and whether it is trusted, from
// the memo when it is of s's current epoch; cached says so.
func (r *Replicator) domainKey(ctx context.Context, s *slot.Slot) (h pkcs11.ObjectHandle, trusted, cached bool, err error) {
	if m := r.memoOf(s); m.dk != 0 {
		return m.dk, m.trusted, true, nil
	}
	// The epoch is read before the search: a re-login during it leaves a
	// memo of the old epoch, which is never used.
	epoch := s.Epoch()
	dk, err := domainkey.Lookup(ctx, s, s.Name(), r.GroupSerial)
	if err != nil {
		return 0, false, false, err
	}
	trial := trialKey(s, dk.KCV)
	flaws, refused, err := domainkey.AuditHandle(ctx, s, dk.Handle, r.copiesRefused(trial))
	if err != nil {
		return 0, false, false, fmt.Errorf("member %s: audit domain key %q: %w", s.Name(), domainkey.Label(r.GroupSerial), err)
	}
	if refused {
		r.noteCopiesRefused(trial)
	}
	if werr := r.noteAudit(s, flaws); werr != nil {
		// Not remembered: the next call audits again, and finds a
		// replaced key.
		return 0, false, false, werr
	}
	r.remember(s, epoch, func(m *memo) { m.dk, m.trusted = dk.Handle, dk.Trusted })
	return dk.Handle, dk.Trusted, false, nil
}

// trialKey names the domain key of check value kcv on s's token for the
// trial copies (see copyFlaw), "" when it cannot be named. The trials are
// a property of the token and the key, whose attributes cannot change (it
// is not modifiable): they are tried once per key, not in every login
// epoch, since each is a write on the token that a member killed at that
// moment can leave behind as a second domain key. With Facts, once for
// every process on the host.
func trialKey(s *slot.Slot, kcv []byte) string {
	tk := tokenKey(s)
	if len(kcv) == 0 || tk == "" {
		return ""
	}
	return fmt.Sprintf("copies refused\x00%s\x00%x", tk, kcv)
}

// copiesRefused reports whether the token was seen to refuse the trial
// copies of the key named k, by this process or one that kept the fact.
func (r *Replicator) copiesRefused(k string) bool {
	if k == "" {
		return false
	}
	r.mu.Lock()
	known := r.refused[k]
	r.mu.Unlock()
	if known || r.Facts == nil {
		return known
	}
	_, known = r.Facts.Load(k)
	if known {
		r.rememberRefused(k)
	}
	return known
}

func (r *Replicator) noteCopiesRefused(k string) {
	if k == "" {
		return
	}
	r.rememberRefused(k)
	if r.Facts != nil {
		_ = r.Facts.Store(k, []byte("true")) // one not kept is tried again by the next process
	}
}

func (r *Replicator) rememberRefused(k string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refused == nil {
		r.refused = map[string]bool{}
	}
	r.refused[k] = true
}

// Audit looks up and audits s's domain key now, as the first wrap or
// unwrap under it in this login epoch would, so that a weak key is
// reported (OnWeakDomainKey) before any use (the agent's login asks it);
// a sound key is remembered for the epoch. It returns what that first use would
// meet: nil, a *domainkey.WeakError, an error wrapping domainkey.ErrNotFound, or
// the member's failure to answer (never charged here: the next call
// meets it again).
func (r *Replicator) Audit(ctx context.Context, s *slot.Slot) error {
	_, _, _, err := r.domainKey(ctx, s)
	return err
}

// noteAudit records the audit of s's domain key and returns a
// *domainkey.WeakError when it found flaws, which are then reported to
// OnWeakDomainKey unless they were reported last time.
func (r *Replicator) noteAudit(s *slot.Slot, flaws []string) error {
	key := strings.Join(flaws, ", ")
	r.mu.Lock()
	st := r.stateLocked(s)
	changed := st.weak != key
	st.weak = key
	r.mu.Unlock()
	if len(flaws) == 0 {
		return nil
	}
	werr := &domainkey.WeakError{Member: s.Name(), Label: domainkey.Label(r.GroupSerial), Flaws: flaws}
	if changed && r.OnWeakDomainKey != nil {
		r.OnWeakDomainKey(werr)
	}
	return werr
}

// withDomainKey runs fn with the domain key of s. When fn fails because
// the handle is no longer valid (the key was removed and installed again,
// or the login changed under the call), the key is looked up again and fn
// runs once more: such failures make nothing.
func (r *Replicator) withDomainKey(ctx context.Context, s *slot.Slot, fn func(dk pkcs11.ObjectHandle, trusted bool) error) error {
	dk, trusted, cached, err := r.domainKey(ctx, s)
	if err != nil {
		return err
	}
	err = fn(dk, trusted)
	if err == nil || !slot.StaleHandle(err) {
		return err
	}
	r.forgetDomainKey(s)
	if !cached {
		return err
	}
	dk, trusted, _, ferr := r.domainKey(ctx, s)
	if ferr != nil {
		return errors.Join(err, ferr)
	}
	return fn(dk, trusted)
}

// needMechanism returns nil when s offers domainkey.Mechanism with flag
// (CKF_WRAP, CKF_UNWRAP or both), a *domainkey.MechanismError when it
// does not, and the error of the call when s cannot say (a member that is down). The
// answer is remembered for the slot's epoch: a Reinit may bring another
// module build.
func (r *Replicator) needMechanism(ctx context.Context, s *slot.Slot, flag uint) error {
	m := r.memoOf(s)
	if !m.mechKnown {
		epoch := s.Epoch()
		info, err := s.MechanismInfo(ctx, domainkey.Mechanism)
		if err != nil && slot.ClassOf(err) != slot.ClassRequest {
			return fmt.Errorf("member %s: ask for %s: %w", s.Name(), domainkey.MechanismName(domainkey.Mechanism), err)
		}
		r.remember(s, epoch, func(m *memo) { m.mechKnown, m.mech, m.mechErr = true, info, err })
		m.mech, m.mechErr = info, err
	}
	return domainkey.CheckMechanism(s.Name(), m.mech, m.mechErr, flag)
}
