package sync

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/sync/object"
	"github.com/miekg/pkcs11"
)

// Two hosts may catch up one member at the same moment: each has its own
// recovery lock (state_dir is per host), each lists the member before the
// other copies, so each plan says the member lacks the object. What keeps
// the member right is re-checking it, never a lock: after the copies each
// target is looked at again (recheckTargets), a public key is kept only
// with its private half (settlePairs), and a plan removes the duplicates
// of one version that a race left (ReasonDuplicate, removeDuplicate).

// settlePairs finishes the copies Apply made and found still wanted
// (kept): a public key copied in this Apply whose private half (same
// CKA_ID and key type, to the same member) was not copied — it failed,
// vanished or was left out — is taken back, since a member with the
// public half of a key and not its private half answers "key not found"
// for a key it seems to hold; then every target is re-checked for copies
// another host made meanwhile. What survives is Done.
func (r *Replicator) settlePairs(ctx context.Context, p *Plan, kept []copyDone, res *ApplyResult) {
	lost := map[string]error{} // pair key -> why its private half is not there
	for _, f := range res.Failed {
		if f.Action.Kind == Copy && f.Action.Identity.Class == pkcs11.CKO_PRIVATE_KEY {
			lost[f.Action.PairKey()] = f.Err
		}
	}
	for _, a := range res.Vanished {
		if a.Identity.Class == pkcs11.CKO_PRIVATE_KEY {
			lost[a.PairKey()] = errVanished
		}
	}
	var done []copyDone
	for _, c := range kept {
		why, orphan := lost[c.a.PairKey()]
		// Only a copy this Apply made for certain (the member held no
		// object of the identity) is taken back: otherwise the handle may
		// be an object that was there before.
		if !orphan || c.a.Identity.Class != pkcs11.CKO_PUBLIC_KEY || !c.a.absent || p.reapplied {
			done = append(done, c)
			continue
		}
		cc := object.CleanupContext(ctx)
		err := p.slots[c.a.Member].DestroyObject(cc.Ctx, c.dstH)
		cc.Cancel()
		switch {
		case err != nil && !object.IsGone(err):
			res.Failed = append(res.Failed, ActionError{Action: c.a,
				Err: fmt.Errorf("copied without its private half (%v), and could not be taken back: %w", why, err)})
		case errors.Is(why, errVanished):
			res.Vanished = append(res.Vanished, c.a)
		default:
			res.Failed = append(res.Failed, ActionError{Action: c.a,
				Err: fmt.Errorf("taken back: its private half was not copied: %w", why)})
		}
	}
	r.recheckTargets(ctx, p, done, res)
}

// PairKey names the key pair the action's object belongs to on the
// member it changes: equal for a private key and its public half (same
// CKA_ID and key type) on one member.
func (a Action) PairKey() string {
	return fmt.Sprintf("%s\x00%x\x00%x", a.Member, a.Identity.KeyType, a.Identity.ID)
}

// recheckTargets looks at every member copied to once more, after the
// copies: one FindObjects per member and one GetAttributes per object
// (the identities), so a catch-up's cost still grows with the token, not
// its square. A copy whose identity the member now holds more than once,
// with the same material, was made by another host too: ours is taken
// back, and should the other host have taken its own back at the same
// moment (none left), the object is copied once more. Every copy ends
// Done unless that fails.
func (r *Replicator) recheckTargets(ctx context.Context, p *Plan, done []copyDone, res *ApplyResult) {
	// Another host's copy made at the same moment may not show yet in a
	// listing taken at once (its server process still writing it): both
	// hosts then count one and keep theirs. A random pause first lets the
	// later copy land, as in settleOne.
	if len(done) > 0 {
		if err := pause(ctx, settlePause); err != nil {
			for _, c := range done {
				res.Failed = append(res.Failed, ActionError{Action: c.a, Err: fmt.Errorf("copied, but not re-checked for a second copy: %w", err)})
			}
			return
		}
	}
	byMember := map[string][]copyDone{}
	for _, c := range done {
		byMember[c.a.Member] = append(byMember[c.a.Member], c)
	}
	for member, cs := range byMember {
		dst := p.slots[member]
		// Public keys first: a private EC key's fingerprint on SoftHSM
		// comes from its public half, which cannot be told while that half
		// is there twice.
		sort.SliceStable(cs, func(i, j int) bool {
			return cs[i].a.Identity.Class == pkcs11.CKO_PUBLIC_KEY && cs[j].a.Identity.Class != pkcs11.CKO_PUBLIC_KEY
		})
		held, err := identityCounts(ctx, dst, cs)
		if err != nil {
			for _, c := range cs {
				res.Failed = append(res.Failed, ActionError{Action: c.a,
					Err: fmt.Errorf("copied, but member %s could not be re-checked for a second copy: %w", member, err)})
			}
			continue
		}
		for _, c := range cs {
			if held[c.a.Identity.Key()] > 1 {
				if err := r.dropSecondCopy(ctx, p, c); err != nil {
					res.Failed = append(res.Failed, ActionError{Action: c.a, Err: err})
					continue
				}
			}
			res.Done = append(res.Done, c.a)
		}
	}
}

// identityCounts counts, on s, the token objects of each identity copied
// by cs.
func identityCounts(ctx context.Context, s *slot.Slot, cs []copyDone) (map[string]int, error) {
	want := map[string]bool{}
	for _, c := range cs {
		want[c.a.Identity.Key()] = true
	}
	hs, err := s.FindObjects(ctx, []*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true)})
	if err != nil {
		return nil, fmt.Errorf("find objects: %w", err)
	}
	counts := map[string]int{}
	for _, h := range hs {
		a, err := object.ReadAttrs(ctx, s, h, object.IdentTypes)
		if object.IsGone(err) || unreadable(ctx, err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read object %d: %w", h, err)
		}
		id, err := object.IdentityOf(a)
		if err != nil {
			continue
		}
		if k := id.Key(); want[k] {
			counts[k]++
		}
	}
	return counts, nil
}

// dropSecondCopy takes back copy c where its target holds another object
// with the same identity and material, and makes sure one stays.
func (r *Replicator) dropSecondCopy(ctx context.Context, p *Plan, c copyDone) error {
	if err := r.settleOne(ctx, p, c.a, c.dstH, c.srcH); err != nil {
		return fmt.Errorf("member %s: %s copied twice (by another host too): %w", c.a.Member, c.a.Identity, err)
	}
	return nil
}

// Two hosts that each made a copy of one version on one member, or each
// clean up the same duplicates, see the same copies at the same moment; a
// rule both carry out at once (take mine back, copy again when none is
// left) leaves none, then two again. What breaks the tie is time: each
// host looks again after a random pause and acts on what it sees then, so
// the one that looks first settles it and the other finds it settled. Each
// round's pause is up to twice the last; a tie that outlives them all is
// a duplicate the next plan removes (ReasonDuplicate), never a member
// left without the object.
const (
	settleRounds = 5
	settlePause  = 20 * time.Millisecond
)

// settleOne leaves a.Member holding a's version once, where mine (0: none)
// is the copy this host made or was told to remove and other hosts may be
// doing the same: mine goes while another copy stays, and the version is
// copied again from a.Source (srcH when known) when none is left.
func (r *Replicator) settleOne(ctx context.Context, p *Plan, a Action, mine, srcH pkcs11.ObjectHandle) error {
	dst := p.slots[a.Member]
	look := func() (bool, error) { // another copy than mine is there
		other, err := otherCopy(ctx, dst, a.Identity, a.Fingerprint, mine)
		return other != 0, err
	}
	for round := range settleRounds {
		other, err := look()
		if err != nil || (mine != 0) != other {
			return err // exactly one copy: settled
		}
		if err := pause(ctx, settlePause<<round); err != nil {
			return err
		}
		if other, err = look(); err != nil || (mine != 0) != other {
			return err
		}
		if mine != 0 {
			if err := dst.DestroyObject(ctx, mine); err != nil && !object.IsGone(err) {
				return fmt.Errorf("destroy the second copy (handle %d): %w", mine, err)
			}
			mine = 0
			continue
		}
		if mine, err = r.copyAgain(ctx, p, a, srcH); err != nil {
			return err
		}
	}
	if mine != 0 {
		return nil // a duplicate at worst: the next plan removes it
	}
	if other, err := look(); err != nil || other {
		return err
	}
	_, err := r.copyAgain(ctx, p, a, srcH)
	return err
}

// pause waits a random time below max, or until ctx ends.
func pause(ctx context.Context, max time.Duration) error {
	t := time.NewTimer(rand.N(max))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// otherCopy returns an object on s other than mine with identity id and
// fingerprint fp, 0 when there is none.
func otherCopy(ctx context.Context, s *slot.Slot, id object.Identity, fp []byte, mine pkcs11.ObjectHandle) (pkcs11.ObjectHandle, error) {
	hs, err := s.FindObjects(ctx, id.Template())
	if err != nil {
		return 0, fmt.Errorf("member %s: find %s: %w", s.Name(), id, err)
	}
	for _, h := range hs {
		if h == mine {
			continue
		}
		if ok, err := isVersion(ctx, s, id, fp, h); err != nil || ok {
			return h, err
		}
	}
	return 0, nil
}

// copyAgain copies a's version to a.Member once more from a.Source (srcH
// when known), after a concurrent clean-up left the member without it;
// Replicate searches the member first, so a copy another host made
// meanwhile is kept instead.
func (r *Replicator) copyAgain(ctx context.Context, p *Plan, a Action, srcH pkcs11.ObjectHandle) (pkcs11.ObjectHandle, error) {
	src := p.slots[a.Source]
	if src == nil {
		return 0, fmt.Errorf("member %s: its last copy of %s was destroyed by a concurrent clean-up and no member is named to copy it from", a.Member, a.Identity)
	}
	h, err := findExact(ctx, src, a.Identity, a.Fingerprint, srcH)
	if err != nil {
		return 0, fmt.Errorf("find the source on %s: %w", a.Source, err)
	}
	if h == 0 {
		return 0, fmt.Errorf("member %s no longer holds it: %w", a.Source, errVanished)
	}
	dstH, err := r.Replicate(ctx, src, h, Target{Slot: p.slots[a.Member]})
	if err != nil {
		return 0, fmt.Errorf("copy again after a concurrent clean-up: %w", err)
	}
	return dstH, nil
}

// removeDuplicate carries out a ReasonDuplicate delete: the listed extra
// copy goes (when it still is the very version), and one copy is kept.
func (r *Replicator) removeDuplicate(ctx context.Context, p *Plan, a Action) error {
	dst := p.slots[a.Member]
	h := a.handle
	if ok, err := isVersion(ctx, dst, a.Identity, a.Fingerprint, h); err != nil || !ok {
		return err // gone already (or the handle went stale): nothing to remove by it
	}
	if err := r.settleOne(ctx, p, a, h, 0); err != nil {
		return fmt.Errorf("member %s: remove a duplicate of %s (handle %d): %w", a.Member, a.Identity, h, err)
	}
	return nil
}
